"""CPU twins of FlashAttention (and its comparison points) at real shapes against a plain torch reference."""
import tracemalloc

import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.flash_attention import (
    attention_peak_bytes,
    flash_attention_cpu,
    flash_attention_rows,
    naive_attention,
    row_tiled_attention,
)


def torch_causal(q, k, v):
    """softmax(q k^T / sqrt(D), causal) v in float64, GQA by repeating KV heads. q (T, H, D), k, v (T, Hkv, D)."""
    q, k, v = (torch.as_tensor(x).double() for x in (q, k, v))
    T, H, D = q.shape
    g = H // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)        # (T, H, D)
    s = torch.einsum("ihd,jhd->hij", q, k) / D ** 0.5                          # (H, T, T)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hij,jhd->ihd", s.softmax(-1), v)                      # (T, H, D)


def qkv(T, H, Hkv, D, seed, B=None):
    rng = np.random.default_rng(seed)
    lead = (T,) if B is None else (B, T)
    return (rng.standard_normal(lead + (H, D), dtype=np.float32),
            rng.standard_normal(lead + (Hkv, D), dtype=np.float32),
            rng.standard_normal(lead + (Hkv, D), dtype=np.float32))


# float32 scores are D <= 64 products of N(0, 1) numbers scaled to ~N(0, 1): each carries ~1e-6 absolute
# rounding, which moves a softmax-weighted mean of N(0, 1) values by about as much; the worst seen is 5e-7.
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T,H,Hkv,D,block", [(1, 4, 2, 64, 16), (37, 4, 4, 48, 16), (300, 6, 2, 64, 64),
                                             (129, 6, 3, 48, 1), (100, 4, 1, 64, 7)])
def test_flash_attention_rows_equals_torch(T, H, Hkv, D, block):
    q, k, v = qkv(T, H, Hkv, D, seed=T + block)
    out = np.empty_like(q)
    flash_attention_rows(q, k, v, out, block)
    assert_close(torch.from_numpy(out).double(), torch_causal(q, k, v), **TOL, name="flash_attention_rows")


def test_batched_flash_attention_is_each_sequence():
    q, k, v = qkv(45, 4, 2, 64, seed=3, B=3)
    out = flash_attention_cpu(q, k, v, block=16)
    for b in range(3):
        assert_close(torch.from_numpy(out[b]).double(), torch_causal(q[b], k[b], v[b]), **TOL, name=f"batch {b}")


def test_the_tile_size_changes_only_the_rounding():
    q, k, v = qkv(200, 4, 2, 64, seed=7)
    outs = [flash_attention_cpu(q, k, v, block) for block in (1, 16, 64, 200, 512)]
    for o in outs[1:]:
        assert_close(torch.from_numpy(o), torch.from_numpy(outs[0]), atol=2e-6, rtol=2e-6, name="block sweep")


def test_naive_and_row_tiled_references_equal_torch():
    q, k, v = qkv(150, 6, 3, 48, seed=11)
    want = torch_causal(q, k, v)
    assert_close(torch.from_numpy(naive_attention(q, k, v)).double(), want, **TOL, name="naive")
    for rows in (1, 16, 64, 150, 1000):
        assert_close(torch.from_numpy(row_tiled_attention(q, k, v, rows)).double(), want, **TOL, name=f"rows={rows}")
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))       # in float64 the numpy reference is exact
    assert_close(torch.from_numpy(naive_attention(q64, k64, v64)), want, name="naive float64")


def test_peak_bytes_naive_quadratic_flash_linear():
    H, D = 4, 64
    for method, growth in (("naive", 4.0), ("flash", 2.0), ("row_tiled", 2.0)):
        small, big = (attention_peak_bytes(T, H, D, method, 16) for T in (1024, 2048))
        assert abs(big / small - growth) < 0.2, (method, big / small)
    assert attention_peak_bytes(1024, H, D, "naive") > 10 * attention_peak_bytes(1024, H, D, "flash")
    with pytest.raises(ValueError, match="method must be"):
        attention_peak_bytes(8, 1, 1, "fast")


def test_naive_attention_allocates_what_the_formula_says():
    q, k, v = qkv(256, 4, 4, 32, seed=5)
    tracemalloc.start()
    naive_attention(q, k, v)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    want = attention_peak_bytes(256, 4, 32, "naive")
    assert 0.9 * want <= peak <= 1.6 * want, (peak, want)   # plus the GQA copies and a (T, T) mask


def test_wrapper_refuses_bad_arrays():
    q, k, v = qkv(8, 4, 2, 16, seed=0)
    with pytest.raises(ValueError, match="must divide q's H"):
        flash_attention_cpu(q, q[:, :3].copy(), q[:, :3].copy())
    with pytest.raises(ValueError, match="k must be float32"):
        flash_attention_cpu(q, k.astype(np.float64), v)
    with pytest.raises(ValueError, match=r"v has shape \(7, 2, 16\)"):
        flash_attention_cpu(q, k, v[:7].copy())
    with pytest.raises(ValueError, match="block must be"):
        flash_attention_cpu(q, k, v, block=0)
