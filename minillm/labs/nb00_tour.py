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
        _close(f"V={V}, T={t}", fn(logits, t), torch.softmax(logits / t, -1), mistakes={
            "you multiplied the logits by T; divide them (T < 1 sharpens)": torch.softmax(logits * t, -1)})
    return "matches softmax(logits / T) for T = 0.5, 1, 2"


def _top_p_mask(probs, p, inclusive):
    sorted_p, order = torch.sort(probs, descending=True)
    cum = torch.cumsum(sorted_p, 0)
    keep = cum <= p if inclusive else cum - sorted_p < p
    return torch.zeros_like(probs).scatter(0, order, keep.to(probs.dtype))


def _top_p_inclusive(probs, p):
    kept = probs * _top_p_mask(probs, p, True)
    return kept / kept.sum()


def _top_p_unnormalised(probs, p):
    return probs * _top_p_mask(probs, p, False)


@checker
def check_top_p(fn):
    """fn(probs (V,), p) -> probabilities restricted to the smallest top set reaching p, renormalised"""
    from ..core.sampling import probs_from_logits
    g = torch.Generator().manual_seed(1)
    for V, p in [(10, 0.5), (40, 0.9), (5, 1.0), (17, 0.01)]:
        logits = torch.randn(V, generator=g) * 2
        probs = torch.softmax(logits, -1)
        _close(f"V={V}, p={p}", fn(probs.clone(), p), probs_from_logits(logits, 1.0, 0, p), mistakes={
            "you kept a token when the mass up to AND including it is <= p (an inclusive cumsum): that drops "
            "the token that crosses p; keep it when the mass strictly before it is < p": _top_p_inclusive(probs, p),
            "the kept probabilities do not sum to 1: renormalise them": _top_p_unnormalised(probs, p)})
    return "matches minillm.core.sampling.probs_from_logits for p = 0.01 .. 1"
