"""Checkers for notebook 00_tour."""
from __future__ import annotations

import torch

from .common import _close, checker


@checker
def check_temperature_softmax(fn):
    """fn(logits (V,), temperature) -> probabilities (V,)"""
    g = torch.Generator().manual_seed(0)
    for V, t in [(7, 1.0), (50, 0.5), (33, 2.0)]:
        logits = torch.randn(V, generator=g) * 3
        _close(f"V={V}, T={t}", fn(logits, t), torch.softmax(logits / t, -1))
    return "matches softmax(logits / T) for T = 0.5, 1, 2"


@checker
def check_top_p(fn):
    """fn(probs (V,), p) -> probabilities restricted to the smallest top set reaching p, renormalised"""
    from ..core.sampling import probs_from_logits
    g = torch.Generator().manual_seed(1)
    for V, p in [(10, 0.5), (40, 0.9), (5, 1.0), (17, 0.01)]:
        logits = torch.randn(V, generator=g) * 2
        _close(f"V={V}, p={p}", fn(torch.softmax(logits, -1), p), probs_from_logits(logits, 1.0, 0, p))
    return "matches minillm.core.sampling.probs_from_logits for p = 0.01 .. 1"
