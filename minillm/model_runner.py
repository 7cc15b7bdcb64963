"""Turns a ScheduledBatch into tensors, runs the model over the KV pool, returns next-token logits."""
from __future__ import annotations

import torch

from .attention import AttentionMetadata
from .kv_cache import KVCache
from .model import Transformer
from .scheduler import ScheduledBatch


def backend_model(model: Transformer, backend: str):
    """The module that runs the forward for this backend: the torch model itself, or its numba or CUDA
    twin built on the same weights (imported only when asked for: they compile on first use)."""
    if backend == "numba":
        from .numba_model import NumbaTransformer
        return NumbaTransformer(model)
    if backend == "cuda":
        from .cuda_model import CudaTransformer
        return CudaTransformer(model)
    return model


class ModelRunner:
    def __init__(self, model: Transformer, kv: KVCache, keep_hidden: bool = False):
        self.model, self.kv = model, kv
        self.keep_hidden = keep_hidden   # Medusa: run() also leaves each row's final hidden state in .hidden
        self.hidden = None               # (B, C) after run() with keep_hidden

    @staticmethod
    def rows(batch: ScheduledBatch) -> list:
        """(sequence, start, end, writes) per row: the scheduled sequences, then a static batch's padding.
        A static batch's finished sequences ride along as padding rows: they recompute their last
        written position (a real row of compute, as in FasterTransformer) and write nothing."""
        rows = [(s, st, e, True) for s, st, e in zip(batch.seqs, batch.starts, batch.ends)]
        return rows + [(s, len(s) - 2, len(s) - 1, False) for s in batch.padding]

    def prepare(self, rows: list):
        """Right-padded (B, T) tokens and positions for these rows; padding gets slot -1 so it is never written."""
        lens = [e - st for _, st, e, _ in rows]
        B, T = len(rows), max(lens)
        M = max(len(s.block_table) for s, *_ in rows)
        tokens = torch.zeros(B, T, dtype=torch.long)                    # (B, T)
        positions = torch.zeros(B, T, dtype=torch.long)                 # (B, T)
        valid = torch.zeros(B, T, dtype=torch.bool)                     # (B, T)
        tables = torch.zeros(B, M, dtype=torch.long)                    # (B, M)
        for b, ((s, st, e, writes), n) in enumerate(zip(rows, lens)):
            tokens[b, :n] = s.token_at(st) if n == 1 else torch.tensor(s.token_ids[st:e])
            positions[b, :n] = torch.arange(st, e)
            valid[b, :n] = writes
            tables[b, :len(s.block_table)] = torch.tensor(s.block_table)
        context_lens = torch.tensor([e for _, _, e, _ in rows])          # (B,)
        attn = AttentionMetadata.build(positions, tables, context_lens, self.kv.block_size, valid)
        last = torch.tensor(lens) - 1                                    # (B,) index of each row's last token
        return tokens, positions, attn, last

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch):
        """-> logits (B, V) for the token after each sequence's last scheduled token (padding rows dropped).
        A mixed step (prompt chunks beside one-token decodes) runs as two calls, decodes and chunks, so
        the decode rows are not padded to the chunks' length; the cache is shared, the rows independent."""
        rows = self.rows(batch)
        one = [i for i, (_, st, e, _) in enumerate(rows) if e - st == 1]            # decodes (and padding)
        chunks = [i for i, (_, st, e, _) in enumerate(rows) if e - st > 1]         # prompts or their chunks
        out, hid = [None] * len(rows), [None] * len(rows)
        for group in (g for g in (one, chunks) if g):
            tokens, positions, attn, last = self.prepare([rows[i] for i in group])
            res = self.model(tokens, positions, self.kv, attn, last_index=last, **self._hidden_arg())
            logits, h = res if self.keep_hidden else (res, None)                   # (len(group), 1, V), (.., 1, C)
            for j, i in enumerate(group):
                out[i], hid[i] = logits[j, 0], (h[j, 0] if h is not None else None)
        n = len(batch.seqs)
        self.hidden = torch.stack(hid[:n]) if self.keep_hidden else None            # (B, C)
        return torch.stack(out[:n]).float()                                        # (B, V)

    def _hidden_arg(self) -> dict:
        return {"return_hidden": True} if self.keep_hidden else {}

    @torch.inference_mode()
    def score(self, seqs: list, new_tokens: list, depths: list | None = None, tree_masks: list | None = None):
        """Speculative verification: one forward that writes and scores several new tokens per sequence.
        new_tokens[b] = [seq's last token, x_1, ..., x_k] go into the cache slots of positions L-1 .. L-1+k
        (L = len(seq)), whose blocks the scheduler reserved. A chain by default; for a Medusa tree, depths[b]
        (k+1,) gives each node's RoPE position L-1+depth and tree_masks[b] (k+1, k+1) who sees whom.
        -> logits (B, T, V) at every new token (float32); .hidden (B, T, C) with keep_hidden."""
        lens = [len(t) for t in new_tokens]
        B, T, M = len(seqs), max(lens), max(len(s.block_table) for s in seqs)
        tokens = torch.zeros(B, T, dtype=torch.long)                    # (B, T)
        slots_at = torch.zeros(B, T, dtype=torch.long)                  # (B, T) cache position of each new token
        rope_at = torch.zeros(B, T, dtype=torch.long)                   # (B, T) its RoPE position
        valid = torch.zeros(B, T, dtype=torch.bool)                     # (B, T)
        tables = torch.zeros(B, M, dtype=torch.long)                    # (B, M)
        mask = torch.zeros(B, T, T, dtype=torch.bool) if tree_masks else None  # (B, T, T)
        for b, (s, toks, n) in enumerate(zip(seqs, new_tokens, lens)):
            base = len(s) - 1
            tokens[b, :n] = torch.tensor(toks)
            slots_at[b, :n] = torch.arange(base, base + n)
            rope_at[b, :n] = base + (torch.tensor(depths[b]) if depths else torch.arange(n))
            valid[b, :n] = True
            tables[b, :len(s.block_table)] = torch.tensor(s.block_table)
            if mask is not None:
                mask[b, :n, :n] = torch.as_tensor(tree_masks[b])
        context_lens = torch.tensor([len(s) - 1 + n for s, n in zip(seqs, lens)])   # (B,)
        attn = AttentionMetadata.build(slots_at, tables, context_lens, self.kv.block_size, valid)
        attn.tree_mask = mask
        res = self.model(tokens, rope_at, self.kv, attn, **self._hidden_arg())
        logits, self.hidden = res if self.keep_hidden else (res, None)             # (B, T, V), (B, T, C)
        return logits.float()
