"""Turns a ScheduledBatch into tensors, runs the model over the KV pool, returns next-token logits."""
from __future__ import annotations

import torch

from .attention import AttentionMetadata
from .kv_cache import KVCache
from .model import Transformer
from .scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model: Transformer, kv: KVCache):
        self.model, self.kv = model, kv

    def prepare(self, batch: ScheduledBatch):
        """Right-padded (B, T) tokens and positions; padding gets slot -1 so it is never written.
        A static batch's finished sequences ride along as padding rows: they recompute their last
        written position (a real row of compute, as in FasterTransformer) and write nothing."""
        rows = [(s, st, e, True) for s, st, e in zip(batch.seqs, batch.starts, batch.ends)]
        rows += [(s, len(s) - 2, len(s) - 1, False) for s in batch.padding]
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
        """-> logits (B, V) for the token after each sequence's last scheduled token (padding rows dropped)."""
        tokens, positions, attn, last = self.prepare(batch)
        logits = self.model(tokens, positions, self.kv, attn, last_index=last)  # (B + padding, 1, V)
        return logits[:len(batch.seqs), 0].float()                             # (B, V)
