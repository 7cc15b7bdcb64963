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


# ----------------------------------------------------------------------------- core: one query row of FlashAttention

def _row_reference(q, k, v, block, scale=None, rescale_acc=True, rescale_l=True):
    """One query row's attention, in float64 and in tiles of `block` keys, with the common mistakes as switches:
    q (D,), k, v (n, D) -> (D,). The defaults give softmax(k q / sqrt(D)) v."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[0]) if scale is None else scale
    m, lsum, acc = -np.inf, 0.0, np.zeros(q.shape[0])
    for k0 in range(0, k.shape[0], block):
        s = k[k0:k0 + block] @ q * scale                                    # (block,) this tile's scores
        m_new = max(m, s.max())
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new)                                               # (block,)
        lsum = (lsum * alpha if rescale_l else lsum) + p.sum()
        acc = (acc * alpha if rescale_acc else acc) + p @ v[k0:k0 + block]  # (D,)
        m = m_new
    return acc / lsum


def _row_case(scores, D, seed):
    """q (D,), k, v (n, D) float32 whose scores k q / sqrt(D) are exactly `scores`: q = 2 e_0 with D = 4, so
    each score is k[:, 0] (the other dims of k are noise that q ignores)."""
    assert D == 4
    rng = np.random.default_rng(seed)
    q = np.zeros(D, np.float32)
    q[0] = 2.0
    k = rng.standard_normal((len(scores), D)).astype(np.float32)
    k[:, 0] = scores
    v = rng.standard_normal((len(scores), D)).astype(np.float32)
    return q, k, v


def _row_out(fn, q, k, v, block, case):
    out = np.asarray(fn(q.copy(), k.copy(), v.copy(), block), dtype=np.float64)
    assert out.shape == q.shape, f"{case}: returned shape {out.shape}, expected ({q.shape[0]},): one output row"
    return out


def _peak_extra_bytes(fn, *args) -> int:
    """Peak bytes Python and numpy allocated while fn(*args) ran, beyond what was allocated before (tracemalloc;
    memory allocated by torch or numba's own runtime is not seen)."""
    import tracemalloc
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn(*args)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not was:
            tracemalloc.stop()


def _naive_row(q, k, v, block):
    """All n scores at once, then the softmax: what a row costs without tiles (block is ignored)."""
    s = k @ q / np.float32(np.sqrt(q.shape[0]))                              # (n,): the whole score row
    p = np.exp(s - s.max())
    return (p / p.sum()) @ v


MEM_N, MEM_D, MEM_BLOCK = 32768, 16, 32     # one row over 32768 keys: its score row alone is 128 KiB in float32


def row_memory(fn, n: int = MEM_N, D: int = MEM_D, block: int = MEM_BLOCK) -> dict:
    """Peak extra bytes (tracemalloc) of one query row over n keys: fn's tiles of `block` vs all scores at once.
    -> {"tiled": bytes, "naive": bytes, "score_row": bytes of one float32 score row}."""
    rng = np.random.default_rng(9)
    q = rng.standard_normal(D).astype(np.float32)
    k, v = (rng.standard_normal((n, D)).astype(np.float32) for _ in range(2))
    fn(q, k[:2 * block], v[:2 * block], block)                             # first call: imports, caches
    return {"tiled": _peak_extra_bytes(fn, q, k, v, block), "naive": _peak_extra_bytes(_naive_row, q, k, v, block),
            "score_row": 4 * n}


@checker(kind="core", signature="q, k, v, block")
def check_flash_row(fn):
    """fn(q (D,), k (n, D), v (n, D), block) -> (D,): softmax(k q / sqrt(D)) v for one query row, walking the keys
    in tiles of `block` with a running max m, a running sum l and an unnormalised accumulator acc. Graded on rows
    built to expose each mistake, then as the kernel of causal GQA attention (every (query, head) row, as
    flash_attention_rows runs them) against naive_attention, then by its peak memory on a long row."""
    n = 24
    rng = np.random.default_rng(14)
    cases = [("one tile (block 32 > 24 keys)", rng.standard_normal(n) * 2, 32),
             ("4 tiles of 6, the max in the first key", np.linspace(3.0, -3.0, n), 6),
             ("tiles of 5 (the last has 4 keys), the max in the first key", np.linspace(3.0, -3.0, n), 5),
             ("tiles of 3, the max rising in every tile", np.linspace(-3.0, 3.0, n) + rng.standard_normal(n) * .3, 3),
             ("scores near 1000, tiles of 4, rising", 1000 + np.linspace(0.0, 4.0, n) + rng.standard_normal(n), 4),
             ("scores near -1000, tiles of 4", -1000 + rng.standard_normal(n), 4)]
    for i, (case, scores, block) in enumerate(cases):
        q, k, v = _row_case(scores.astype(np.float32), 4, seed=i)
        got, want = _row_out(fn, q, k, v, block, case), _row_reference(q, k, v, block)
        if np.abs(got - want).max() < 1e-5:
            continue
        hint = {0: "one tile holds all n keys when block > n",
                1: "right with one tile but not with several, although the max never changes: keep acc "
                   "unnormalised and divide by l once, after the last tile (not inside the loop)",
                2: "the last tile holds n % block keys: is it skipped, or read past its end?",
                3: "wrong once the max grows from tile to tile: rescale both l and acc by exp(m_old - m_new)",
                4: "exp of a score near 1000 overflows: subtract the running max m before exp",
                5: "exp of a score near -1000 underflows to 0: start m at -inf, not 0"}[i]
        assert np.isfinite(got).all(), f"{case}: non-finite output (nan or inf); {hint}"
        named = {"scores not scaled by 1/sqrt(D)": dict(scale=1.0),
                 "acc is not rescaled by exp(m_old - m_new) when the max grows (l is)": dict(rescale_acc=False),
                 "l is not rescaled by exp(m_old - m_new) when the max grows (acc is)": dict(rescale_l=False),
                 "neither l nor acc is rescaled by exp(m_old - m_new) when the max grows":
                     dict(rescale_acc=False, rescale_l=False)}
        for why, wrong in named.items():
            assert np.abs(got - _row_reference(q, k, v, block, **wrong)).max() > 1e-5, f"{case}: {why}"
        raise AssertionError(f"{case}: max abs error {np.abs(got - want).max():.3g}; {hint}")

    from ..kernels.flash_attention import naive_attention
    T, H, Hkv, D = 13, 4, 2, 8                  # causal GQA: query head h reads KV head h // 2
    q, k, v = (rng.standard_normal((T, h, D)).astype(np.float32) for h in (H, Hkv, Hkv))
    want = naive_attention(*(a.astype(np.float64) for a in (q, k, v)))     # (T, H, D)
    for block in (1, 3, 5, 16):
        got = np.stack([np.stack([_row_out(fn, q[i, h], k[:i + 1, h // 2], v[:i + 1, h // 2], block,
                                           f"causal attention, row {i}, head {h}, block {block}")
                                  for h in range(H)]) for i in range(T)])  # (T, H, D)
        err = np.abs(got - want).max()
        assert err < 1e-5, f"causal GQA attention (T={T}, H={H}, Hkv={Hkv}) built from your rows, block {block}: " \
                           f"max abs error {err:.3g} against naive_attention"

    mem = row_memory(fn)
    assert mem["tiled"] < mem["score_row"] / 4, \
        f"one row over {MEM_N} keys, block {MEM_BLOCK}: your function's peak extra memory is {mem['tiled']:,} bytes; " \
        f"the whole score row is {mem['score_row']:,}: keep only one tile of scores at a time (and copy no k or v)"
    return (f"equals softmax attention on rows built to catch each mistake (one tile, partial tiles, a rising max, "
            f"scores near +-1000), and as the kernel of causal GQA attention at blocks 1, 3, 5 and 16 (> T = {T}); "
            f"over {MEM_N} keys its peak extra memory is under a quarter of one score row")
