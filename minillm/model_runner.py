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
        """Right-padded (B, T) tokens and positions; padding gets slot -1 so it is never written."""
        seqs, starts = batch.seqs, batch.starts
        lens = [len(s) - st for s, st in zip(seqs, starts)]
        B, T = len(seqs), max(lens)
        M = max(len(s.block_table) for s in seqs)
        tokens = torch.zeros(B, T, dtype=torch.long)                    # (B, T)
        positions = torch.zeros(B, T, dtype=torch.long)                 # (B, T)
        valid = torch.zeros(B, T, dtype=torch.bool)                     # (B, T)
        tables = torch.zeros(B, M, dtype=torch.long)                    # (B, M)
        for b, (s, st, n) in enumerate(zip(seqs, starts, lens)):
            tokens[b, :n] = torch.tensor(s.token_ids[st:st + n])
            positions[b, :n] = torch.arange(st, st + n)
            valid[b, :n] = True
            tables[b, :len(s.block_table)] = torch.tensor(s.block_table)
        context_lens = torch.tensor([st + n for st, n in zip(starts, lens)])  # (B,)
        attn = AttentionMetadata.build(positions, tables, context_lens, self.kv.block_size, valid)
        last = torch.tensor(lens) - 1                                    # (B,) index of each row's last token
        return tokens, positions, attn, last

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch):
        """-> logits (B, V) for the token after each sequence's last scheduled token."""
        tokens, positions, attn, last = self.prepare(batch)
        logits = self.model(tokens, positions, self.kv, attn, last_index=last)  # (B, 1, V)
        return logits[:, 0].float()                                            # (B, V)
