"""Checkers for notebook 01_model_from_scratch."""
from __future__ import annotations

import torch

from .common import _close, checker


@checker
def check_rmsnorm(fn):
    """fn(x (..., C), weight (C,), eps) -> (..., C)"""
    from ..llama.transformer import RMSNorm
    g = torch.Generator().manual_seed(2)
    for shape in [(3, 8), (2, 5, 17), (1, 1, 64)]:
        x, w = torch.randn(shape, generator=g), torch.randn(shape[-1], generator=g)
        ref = RMSNorm(shape[-1], 1e-5)
        ref.weight.data = w
        _close(f"shape {shape}", fn(x, w, 1e-5), ref(x).detach())
    return "matches minillm.llama.transformer.RMSNorm on 3 shapes"


@checker
def check_rope(fn):
    """fn(x (B, T, H, D), positions (B, T), theta) -> (B, T, H, D), pairs (2j, 2j+1) rotated"""
    from ..llama.transformer import apply_rope, rope_tables
    g = torch.Generator().manual_seed(3)
    for B, T, H, D in [(1, 5, 2, 8), (2, 3, 3, 16)]:
        x = torch.randn(B, T, H, D, generator=g)
        pos = torch.randint(0, 100, (B, T), generator=g)
        cos, sin = rope_tables(D, 128, 10000.0)
        _close(f"shape {(B, T, H, D)}", fn(x, pos, 10000.0), apply_rope(x, cos[pos], sin[pos]), atol=1e-4)
    return "matches minillm.llama.transformer.apply_rope (llama2.c pair layout) at random positions"
