"""The model runner: one input builder from a ScheduledBatch (+ drafts) to tensors, one forward per group of rows.

Every row contributes its own tokens (positions start .. end - 1) and its drafts after them, all written to
their cache slots and read back through the block table. The backend (the torch Transformer, or its numba or
CUDA twin: the same forward signature) returns logits only for the rows asked for: on a row that reaches its
sequence's newest token, the newest token and every draft (1 + k rows); none for a partial prompt chunk;
and, for a request with prompt_logprobs, every prompt position it computes (minillm.core.logprobs.prompt_rows).

    tokens (B, T)  positions (B, T) RoPE positions  attn: slot_mapping (B, T), block_tables (B, M), context_lens (B,),
    positions (B, T) cache positions (a draft tree's nodes sit in consecutive slots but at RoPE position base + depth),
    tree_mask (B, T, T)  ->  logits (N, V) [, hidden (N, C)] at the flat token indices rows (N,)

Rows are run in two groups, short (decodes, with their drafts) and long (prompts and chunks), so a decode is
not padded to a prompt's length; the cache is shared, the rows independent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from ..llama.attention import AttentionMetadata
from ..llama.kv_cache import KVCache, SwapSpace
from .batch import Draft, Row, ScheduledBatch
from .hooks import NoAdapters, NoEviction, NoSwap
from .logprobs import prompt_rows


@dataclass
class RunnerOutput:
    raw: list                       # per row: (n, V) at its newest token and each draft, or None, as the backend
                                    # gave them: torch, or numpy from one that takes index_arrays (numba)
    hidden: Optional[list] = None   # per row: (n, C) the final-normed hidden states there (when asked for)
    prompt_logits: Optional[list] = None   # per row: (first prompt position, logits (n, V)) for prompt_logprobs
    _logits: Optional[list] = None

    @property
    def logits(self) -> list:
        """per row: (n, V) torch tensors (views of numpy ones: no copy), made on first use. The common greedy row
        reads `raw` (verify's argmax takes either), so a step of such rows makes no tensor at all."""
        if self._logits is None:
            self._logits = [x if x is None else torch.as_tensor(x) for x in self.raw]
        return self._logits


@dataclass
class Query:
    tokens: list        # the row's new tokens: its own, then its drafts
    slots_at: list      # each one's cache position
    rope_at: list       # each one's RoPE position
    mask: object        # (n, n) bool who sees whom among them, or None (causal)
    wanted: list        # indices whose logits are asked for
    prompt: list = field(default_factory=list)   # then these: prompt positions prompt_logprobs needs scored


def as_tensors(arrays) -> list:
    """The runner's int64 index arrays as the torch tensors the backends take (views: no copy). A backend that
    reads numpy (the numba forward) says so with an `index_arrays` attribute of its own, and gets them as they
    are: a torch call per array costs microseconds each step, more once the forward has evicted the caches."""
    return [torch.from_numpy(a) for a in arrays]


def build_query(row: Row, draft: Optional[Draft]) -> Query:
    seq, k = row.seq, len(draft) if draft else 0
    m = row.end - row.start
    own = [seq.token_at(row.start)] if m == 1 else seq.token_ids[row.start:row.end]
    tokens = own + (list(draft.tokens) if draft else [])
    rope_at = list(range(row.start, row.end)) + [row.end - 1 + draft.depth(i) for i in range(k)]
    mask = None
    if draft is not None and not draft.is_chain:
        mask = torch.ones(m + k, m + k, dtype=torch.bool).tril()           # (n, n) own tokens: causal
        mask[m:, m:] = draft.check().mask()                                 # a node sees its ancestors only
    wanted = list(range(m - 1, m + k)) if row.completes else ([m - 1] if not row.writes else [])
    return Query(tokens, list(range(row.start, row.end + k)), rope_at, mask, wanted, prompt_rows(row))


class ModelRunner:
    def __init__(self, model, kv: KVCache, swap: SwapSpace | NoSwap = NoSwap(), hidden: bool = False,
                 eviction: NoEviction = NoEviction(), lora: NoAdapters = NoAdapters()):
        self.model, self.kv = model, kv
        self.hidden = hidden        # also return hidden states (a proposer reads them: Medusa)
        self.eviction = eviction    # kv_eviction: keys before RoPE, the window, H2O's scores (minillm.core.hooks)
        self.lora = lora            # enable_lora: each row's adapter slot in the linears (minillm.lora.adapters)
        self.swap = swap                # preemption_mode "swap": the host copy of swapped-out blocks (or NoSwap)
        self.index_arrays = getattr(model, "index_arrays", as_tensors)   # numpy int64 arrays -> what model takes

    def move_blocks(self, batch: ScheduledBatch):
        """The block moves the scheduler decided: swaps first (a swap-in may read a swap block that a swap-out of
        this step then reuses; a device block a swap-out frees may be written by this step), then copy-on-write."""
        self.swap.swap_in(self.kv, batch.swap_in)
        self.swap.swap_out(self.kv, batch.swap_out)
        self.kv.copy_blocks(batch.copies)
        batch.moved = True

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, drafts: Optional[list] = None) -> RunnerOutput:
        drafts = drafts or [None] * len(batch.rows)
        queries = [build_query(r, d) for r, d in zip(batch.rows, drafts)]
        out = RunnerOutput([None] * len(queries), [None] * len(queries) if self.hidden else None,
                           [None] * len(queries) if any(q.prompt for q in queries) else None)
        short = [i for i, r in enumerate(batch.rows) if not r.prefill]
        for group in (short, [i for i, r in enumerate(batch.rows) if r.prefill]):
            if group:
                self._forward([batch.rows[i] for i in group], [queries[i] for i in group], group, out)
        return out

    def _forward(self, rows: list, queries: list, index: list, out: RunnerOutput):
        B, T = len(rows), max(len(q.tokens) for q in queries)
        M = max(len(r.seq.block_table) for r in rows)
        tok, pos, slot, rope, tab = [], [], [], [], []    # flat lists, padded row by row: one array below
        trees = any(q.mask is not None for q in queries)
        mask = torch.ones(B, T, T, dtype=torch.bool) if trees else None  # (B, T, T)
        select, bs = [], self.kv.block_size
        for b, (r, q) in enumerate(zip(rows, queries)):
            n, ev, table = len(q.tokens), r.seq.evicted, r.seq.block_table   # eviction: index = position - evicted
            pad = [0] * (T - n)
            cache = [p - ev for p in q.slots_at]                           # cache positions
            tok += q.tokens + pad
            pos += cache + pad
            slot += ([table[c // bs] * bs + c % bs for c in cache] if r.writes else [-1] * n) + [-1] * (T - n)
            rope += [p - ev for p in q.rope_at] + pad
            tab += table + [0] * (M - len(table))
            if q.mask is not None:
                mask[b, :n, :n] = q.mask
            select += [b * T + j for j in q.wanted + q.prompt]
        per_token = np.array(tok + rope + slot + pos, np.int64).reshape(4, B, T)
        context = np.array([r.start - r.seq.evicted + len(q.tokens) for r, q in zip(rows, queries)], np.int64)
        tokens, rope_at, slots, cache_pos, tables, context_lens, select = self.index_arrays(
            (*per_token, np.array(tab, np.int64).reshape(B, M), context, np.array(select, np.int64)))
        attn = AttentionMetadata(slots,                     # (B, T) slot, -1: not written
                                 tables,                    # (B, M) block tables
                                 context_lens, cache_pos,   # (B,) cached tokens after the step; (B, T) cache positions
                                 tree_mask=mask)
        self.eviction.prepare(attn, B, context_lens)          # kv_eviction: keys rotated on read, window, scores
        with self.lora.use(rows, T):                          # enable_lora: each row's adapter in the linears
            res = self.model(tokens, rope_at, self.kv, attn, rows=select,
                             **({"return_hidden": True} if self.hidden else {}))
        logits, hidden = res if self.hidden else (res, None)            # (N, V), (N, C)
        self.eviction.observe(rows, attn, context_lens)       # H2O: the probabilities each cached token received
        at = 0
        for i, r, q in zip(index, rows, queries):
            if q.wanted:
                out.raw[i] = logits[at:at + len(q.wanted)]
                if hidden is not None:
                    out.hidden[i] = hidden[at:at + len(q.wanted)]
            at += len(q.wanted)
            if q.prompt:
                out.prompt_logits[i] = (r.start + q.prompt[0], logits[at:at + len(q.prompt)])   # (n, V)
            at += len(q.prompt)

    def commit(self, batch: ScheduledBatch, drafts: list, verdicts: list):
        """A draft tree's accepted path sits in scattered slots (node i at position end + i): move it into the
        consecutive positions end, end + 1, ... that the sequence now claims (Medusa). Chains need nothing."""
        src, dst, bs = [], [], self.kv.block_size
        for row, d, v in zip(batch.rows, drafts or [], verdicts):
            if d is None or d.is_chain or not v.path:
                continue
            table = row.seq.block_table
            slot = lambda p: table[p // bs] * bs + p % bs               # noqa: E731
            for j, i in enumerate(v.path):
                if i != j:
                    src.append(slot(row.end + i))
                    dst.append(slot(row.end + j))
        self.kv.move_slots(src, dst)
