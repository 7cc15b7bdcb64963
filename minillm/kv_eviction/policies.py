"""KV eviction for long contexts: which cached blocks leave, so a sequence's KV bytes stay flat as it grows.

EngineConfig.kv_eviction = {"method": "streaming" | "h2o", "sinks": 4, "window": 256}

- "streaming" (StreamingLLM, Xiao et al. 2023): a query attends to the first `sinks` tokens (attention sinks: the
  softmax dumps its spare mass there) and to the `window` most recent tokens, itself included. Attention applies that
  rule token by token (attn.window); the block manager frees every block all of whose tokens left the window for
  good (never a block holding a sink).
- "h2o" (Heavy-Hitter Oracle, Zhang et al. 2023): the cache keeps the sinks, the window // 2 most recent tokens,
  and as many heavy hitters as fit in sinks + window: the blocks whose tokens received the most attention
  probability so far, summed over layers, heads and queries. The torch attention accumulates those probabilities
  (attn.received) on the softmax it really computed; no proxy. Blocks are the unit: the budget is met to a block.

Positions. The pool normally stores keys after RoPE, at their position in the text: once blocks leave, a query
would sit further from the sinks than the model was trained for (past max_seq_len, garbage). With eviction the
pool stores keys BEFORE RoPE and attention rotates each key at its index in the cache as it reads it (StreamingLLM
uses positions within the cache, not in the text); the runner gives the new tokens their cache index:
position - seq.evicted (the tokens evicted before them). The other choice, re-rotating the cached keys by
-evicted each time blocks leave, writes the pool at every eviction; rotating on read costs one rotation of the
gathered keys per layer and step and leaves the pool untouched. A cached key's index then drifts from the exact
StreamingLLM position by at most the masked tokens of the sink block and of the oldest window block (< 2 blocks).

A row of an evicting sequence is at most CHUNK tokens, so a long prompt is prefilled in chunks with eviction in
between (the cache, and the RoPE indices, stay below sinks + window + CHUNK + 2 blocks).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config import KV_EVICTION_METHODS, check_kv_eviction  # noqa: F401  (the option's checks live with it)
from ..core.hooks import NoEviction
from ..kernels import cdiv

CHUNK = 64          # tokens per row of an evicting sequence (prefill in chunks, evicting in between)


class EvictionPolicy(NoEviction):
    """Decides which blocks of a sequence leave the cache after a step (the hooks of minillm.core.hooks.NoEviction).
    The scheduler calls evict(); the runner's hooks store keys before RoPE, apply `window` (attention's token
    rule, or None) and, with `scores`, accumulate the attention probabilities each cached token receives."""
    window: Optional[tuple] = None      # (sinks, window): attention's visibility rule, or None (all cached tokens)
    scores = False                      # does the policy read attention probabilities (attn.received)?
    chunk = CHUNK

    def __init__(self, sinks: int, window: int):
        self.sinks, self.size = sinks, window

    def context_limit(self, max_model_len: int) -> int:
        return 2**62                                     # the cache stays flat: generate past the context

    def allocate_prompt(self, block_manager, seq) -> int:
        return block_manager.allocate_prompt(seq, min(len(seq), self.chunk))   # the first chunk only

    def admitted(self, block_manager, seq, end: int):
        block_manager.truncate(seq, end)                 # blocks for this chunk only: the pool stays flat

    def prepare(self, attn, batch_size: int, context_lens):
        attn.rope_on_read, attn.window = True, self.window   # keys stored before RoPE, rotated at their cache index
        if self.scores:                                  # H2O: the attention probabilities each cached token receives
            attn.received = torch.zeros(batch_size, int(context_lens.max()))     # (B, S)

    def observe(self, rows: list, attn, context_lens):
        if not self.scores:
            return
        for b, r in enumerate(rows):
            if r.writes:
                n, old = int(context_lens[b]), r.seq.kv_scores
                old = torch.zeros(0) if old is None else old[:n]           # (n_cache,) so far, at most n
                grown = torch.cat([old, torch.zeros(n - old.shape[0])])
                r.seq.kv_scores = grown + attn.received[b, :n]              # (n_cache,)

    def save(self, seqs: list) -> list:
        return [(s, s.kv_scores.clone()) for s in seqs if s.kv_scores is not None]   # H2O's attention sums

    def restore(self, saved: list):
        for s, kept in saved:
            s.kv_scores = kept

    def victims(self, seq, n_cache: int, block_size: int) -> list[int]:
        """Indices into seq.block_table of the blocks to free, given n_cache tokens in the cache."""
        raise NotImplementedError

    def evict(self, block_manager, seq) -> list[int]:
        """Free the victims' blocks (minillm.core.block_manager.BlockManager.drop_blocks) -> the block ids freed."""
        bs = block_manager.block_size
        n_cache = seq.num_computed - seq.evicted
        drop = self.victims(seq, n_cache, bs)
        if not drop:
            return []
        if seq.kv_scores is not None:                    # keep the scores of the tokens that stay
            keep = torch.ones(seq.kv_scores.shape[0], dtype=torch.bool)
            for i in drop:
                keep[i * bs:(i + 1) * bs] = False
            seq.kv_scores = seq.kv_scores[keep]
        return block_manager.drop_blocks(seq, drop)


def sink_blocks(sinks: int, block_size: int) -> int:
    """Blocks that hold a sink token: never evicted."""
    return cdiv(sinks, block_size)


class StreamingPolicy(EvictionPolicy):
    """StreamingLLM: sinks + a sliding window. A block leaves when its last token is out of every future query's
    window: a query at cache index p >= n_cache sees j iff j < sinks or p - j < window."""

    def __init__(self, sinks: int, window: int):
        super().__init__(sinks, window)
        self.window = (sinks, window)

    def victims(self, seq, n_cache: int, block_size: int) -> list[int]:
        first = sink_blocks(self.sinks, block_size)
        last = (n_cache - self.size + 1) // block_size     # blocks i < last end at or before n_cache - window
        return list(range(first, min(last, len(seq.block_table) - 1)))


class H2OPolicy(EvictionPolicy):
    """H2O: keep the sinks, the window // 2 most recent tokens, and the heaviest blocks (accumulated attention
    probability) until sinks + window tokens; evict the lightest block while a whole block is over budget."""
    scores = True

    def victims(self, seq, n_cache: int, block_size: int) -> list[int]:
        budget, recent = self.sinks + self.size, self.size // 2
        first = sink_blocks(self.sinks, block_size)
        last = (n_cache - recent) // block_size           # blocks i < last lie wholly before the recent tokens
        over = (n_cache - budget) // block_size           # whole blocks over budget
        if over <= 0 or last <= first or seq.kv_scores is None:
            return []
        s = seq.kv_scores[:last * block_size].view(last, block_size).sum(1)   # (last,) a block's received mass
        order = [int(i) for i in torch.argsort(s[first:], stable=True) + first]
        return sorted(order[:over])


def make_eviction(spec: Optional[dict]) -> NoEviction:
    if spec is None:
        return NoEviction()
    cls = StreamingPolicy if spec["method"] == "streaming" else H2OPolicy
    return cls(spec["sinks"], spec["window"])
