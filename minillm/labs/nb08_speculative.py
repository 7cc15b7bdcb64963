"""Checkers for notebook 08_speculative_decoding."""
from __future__ import annotations

import torch

from .common import _close, checker


@checker
def check_residual(fn):
    """fn(p (V,), q (V,)) -> the distribution sampled after a rejection: norm(max(0, p - q)), or p if that is 0"""
    from ..spec_decode.config import residual
    g = torch.Generator().manual_seed(11)
    for V in (2, 5, 33):
        p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
        _close(f"V={V}", torch.as_tensor(fn(p.clone(), q.clone()), dtype=torch.float64), residual(p, q, 0), atol=1e-12)
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    _close("p == q (empty residual: fall back to p)", torch.as_tensor(fn(p.clone(), p.clone()), dtype=torch.float64),
           p, atol=1e-12)
    return ("matches minillm.spec_decode.config.residual: rejected mass goes where the target wants more than "
            "the draft gave")


@checker
def check_ngram_lookup(fn):
    """fn(tokens, k, n) -> up to k tokens that followed the latest earlier occurrence of the last n tokens"""
    cases = [([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], 2, 3, [4, 5]), ([7, 8, 9], 3, 2, []), ([4, 1, 4, 2, 4], 1, 1, [2]),
             ([5, 6, 5, 6, 7, 5, 6], 2, 2, [7, 5]), ([3, 3, 3], 1, 2, [3])]
    for tokens, k, n, want in cases:
        got = list(fn(list(tokens), k, n))
        assert got[:len(want)] == want and len(got) <= k, f"tokens={tokens}, k={k}, n={n}: got {got}, want {want}"
        assert got == want or len(got) > len(want), f"tokens={tokens}, k={k}, n={n}: got {got}, want {want}"
    return "finds the latest match and copies what followed it"
