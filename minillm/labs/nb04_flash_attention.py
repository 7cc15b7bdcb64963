"""Checkers for notebook 04_flash_attention."""
from __future__ import annotations

import numpy as np

from .common import checker


@checker
def check_online_softmax_update(fn):
    """fn(m, d, x) -> (m_new, d_new): the running max and the running sum of exp(. - max) after one more
    element x (Milakov & Gimelshein's recurrence; the first call gets m = -inf, d = 0)"""
    import math

    from ..kernels.softmax import online_softmax_steps, softmax_cpu
    rng = np.random.default_rng(4)
    cases = [("7 random values", rng.standard_normal(7) * 2), ("a rising row", np.arange(6.0)),
             ("a falling row", -np.arange(6.0)), ("values near 1000", 1000 + rng.standard_normal(9) * 5)]
    for name, xs in cases:
        m, d = -math.inf, 0.0
        for (i, m_ref, d_ref), x in zip(online_softmax_steps(xs), xs):
            m, d = (float(v) for v in fn(m, d, float(x)))
            assert math.isclose(m, m_ref, rel_tol=1e-12), \
                f"{name}, after element {i}: m = {m:.6g}, expected {m_ref:.6g}"
            assert math.isclose(d, d_ref, rel_tol=1e-6), \
                f"{name}, after element {i}: d = {d:.6g}, expected {d_ref:.6g} " \
                "(is the old sum rescaled when the max rises?)"
        if name == "7 random values":                       # (m, d) is all the softmax needs
            want = softmax_cpu(xs.astype(np.float32)[None])[0]
            got = np.exp(xs - m) / d
            assert np.allclose(got, want, atol=1e-6), f"{name}: exp(x - m) / d is not the softmax"
    return "matches online_softmax_steps after every element; exp(x - m) / d is the softmax, even near 1000"


def _split_partials(q, k, v, n, num_splits):
    """Flash-Decoding's per-split outputs o_s (S, H, D) and log-sum-exps (S, H) of one query row q (H, D)
    over its first n keys k, v (n, Hkv, D), in float64: split s covers ceil(n / S) positions."""
    H, D = q.shape
    group = H // k.shape[1]
    per = -(-n // num_splits)
    outs, lses = np.zeros((num_splits, H, D)), np.full((num_splits, H), -np.inf)
    for s in range(num_splits):
        p0, p1 = min(s * per, n), min((s + 1) * per, n)
        if p1 == p0:                                          # an empty split: o = 0, lse = -inf
            continue
        for h in range(H):
            sc = k[p0:p1, h // group].astype(np.float64) @ q[h] / np.sqrt(D)     # (p1 - p0,)
            e = np.exp(sc - sc.max())
            outs[s, h] = e @ v[p0:p1, h // group] / e.sum()
            lses[s, h] = sc.max() + np.log(e.sum())
    return outs, lses


@checker
def check_combine_splits(fn):
    """fn(outs (S, H, D), lses (S, H)) -> out (H, D): combine Flash-Decoding's per-split outputs, each
    normalised by its own sum, using their log-sum-exps (an empty split has lse = -inf)"""

    from ..kernels.paged_attention import paged_attention_cpu
    rng = np.random.default_rng(5)
    BS = 4
    for name, n, S, H, Hkv, D, shift in [("context 100, 4 splits", 100, 4, 2, 2, 16, 0.0),
                                         ("context 37, 3 uneven splits, GQA", 37, 3, 4, 1, 8, 0.0),
                                         ("context 5, 8 splits (3 empty)", 5, 8, 2, 2, 4, 0.0),
                                         ("scores shifted by +1000", 64, 4, 2, 2, 8, 1000.0),
                                         ("one split", 20, 1, 1, 1, 8, 0.0)]:
        k, v = (rng.standard_normal((n, Hkv, D)).astype(np.float32) for _ in range(2))
        q = rng.standard_normal((H, D)).astype(np.float32)
        nb = -(-n // BS)
        table = rng.permutation(nb + 2)[:nb].astype(np.int64)                # blocks anywhere in a pool
        k_pool, v_pool = (np.zeros((nb + 2, BS, Hkv, D), np.float32) for _ in range(2))
        for p in range(n):
            k_pool[table[p // BS], p % BS], v_pool[table[p // BS], p % BS] = k[p], v[p]
        want = paged_attention_cpu(q[None], k_pool, v_pool, table[None], np.array([n], np.int64))[0]   # (H, D)
        outs, lses = _split_partials(q, k, v, n, S)
        got = np.asarray(fn(outs.copy(), lses + shift), dtype=np.float64)   # a common shift cancels out
        assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
        assert np.isfinite(got).all(), f"{name}: non-finite output (subtract the largest lse before exp)"
        err = np.abs(got - want).max()
        assert err < 2e-5, f"{name}: max abs error {err:.3g} against paged_attention_cpu over the whole context"
    return "matches paged_attention_cpu over the whole context: uneven and empty splits, GQA, lse near 1000"
