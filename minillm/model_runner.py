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
    def __init__(self, model: Transformer, kv: KVCache):
        self.model, self.kv = model, kv

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
        out = [None] * len(rows)
        for group in (g for g in (one, chunks) if g):
            tokens, positions, attn, last = self.prepare([rows[i] for i in group])
            logits = self.model(tokens, positions, self.kv, attn, last_index=last)  # (len(group), 1, V)
            for j, i in enumerate(group):
                out[i] = logits[j, 0]
        return torch.stack(out[:len(batch.seqs)]).float()                          # (B, V)
