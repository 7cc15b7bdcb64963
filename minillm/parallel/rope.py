"""RoPE's cos and sin at the tokens' positions, exactly as the Transformer gathers them, for a rank without the model.

The tables are minillm.llama.transformer.rope_tables' float64 rows rounded to the model's dtype and grown on demand;
a row depends only on its position, so every rank (and the one-rank model) holds the same values bit for bit.
"""
from __future__ import annotations

import torch

from ..llama.transformer import ROPE_ROWS, rope_tables


class RopeTables:
    def __init__(self, cfg, dtype):
        self.cfg, self.dtype = cfg, dtype
        self.cos = self.sin = torch.zeros(0, cfg.head_dim // 2, dtype=dtype)       # (S', D/2)

    def __call__(self, positions):
        """positions (B, T) -> cos, sin (B, T, D/2) each."""
        need, have = int(positions.max()) + 1, self.cos.shape[0]
        if need > self.cfg.max_seq_len:
            raise ValueError(f"position {need - 1} is beyond the model's context max_seq_len={self.cfg.max_seq_len}")
        if need > have:
            n = min(max(need, 2 * have, ROPE_ROWS), self.cfg.max_seq_len)
            cfg = self.cfg
            cos, sin = rope_tables(cfg.head_dim, n, cfg.rope_theta, cfg.rope_scaling)        # (n, D/2) float64
            self.cos, self.sin = cos.to(self.dtype), sin.to(self.dtype)
        return self.cos[positions], self.sin[positions]                               # (B, T, D/2)
