"""Paged decode attention and Flash-Decoding CUDA kernels in the simulator against a plain torch reference:
contexts that straddle blocks, shuffled block tables, GQA, empty contexts and empty splits."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels import simulating
from minillm.kernels.paged_attention import flash_decoding_cuda, paged_attention_cuda


def test_the_simulator_is_on():
    assert simulating()


def make_pool(ctx, H, Hkv, D, BS, seed):
    rng = np.random.default_rng(seed)
    ctx = np.asarray(ctx, np.int64)
    M = max(1, -(-int(ctx.max()) // BS))
    NB = len(ctx) * M + 2
    tables = rng.permutation(NB)[:len(ctx) * M].reshape(len(ctx), M).astype(np.int64)   # (R, M), shuffled
    q = rng.standard_normal((len(ctx), H, D), dtype=np.float32)                          # (R, H, D)
    k_pool, v_pool = (rng.standard_normal((NB, BS, Hkv, D), dtype=np.float32) for _ in range(2))  # (NB, BS, Hkv, D)
    return q, k_pool, v_pool, tables, ctx


def torch_decode(q, k_pool, v_pool, tables, ctx):
    """Plain float64 reference: gather each row's positions through its table, softmax, weighted sum."""
    out = torch.zeros(q.shape, dtype=torch.float64)                                       # (R, H, D)
    BS, g = k_pool.shape[1], q.shape[1] // k_pool.shape[2]
    for r, n in enumerate(ctx):
        if n:
            p = torch.arange(int(n))
            slots = torch.as_tensor(tables[r])[p // BS] * BS + p % BS                     # (n,)
            k = torch.as_tensor(k_pool).double().flatten(0, 1)[slots].repeat_interleave(g, 1)  # (n, H, D)
            v = torch.as_tensor(v_pool).double().flatten(0, 1)[slots].repeat_interleave(g, 1)  # (n, H, D)
            s = torch.einsum("hd,jhd->hj", torch.as_tensor(q[r]).double(), k) / q.shape[2] ** 0.5  # (H, n)
            out[r] = torch.einsum("hj,jhd->hd", s.softmax(-1), v)
    return out


# float32 scores of D <= 16 products over <= 130 positions: ~1e-7 absolute error in the scores, worst
# seen 1.4e-6 in the outputs at 130 positions; 1e-5 leaves room for the tree-reduction order.
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ctx,H,Hkv,D,BS", [([1, 23, 0], 4, 2, 16, 4), ([9, 5], 2, 1, 7, 1),
                                            ([130, 65], 2, 1, 8, 8)])   # 3 and 2 chunks of 64 positions: the rescale
def test_paged_attention_kernel_equals_torch(ctx, H, Hkv, D, BS):
    q, k_pool, v_pool, tables, ctx = make_pool(ctx, H, Hkv, D, BS, seed=BS)
    got = paged_attention_cuda(q, k_pool, v_pool, tables, ctx)
    assert_close(torch.from_numpy(got).double(), torch_decode(q, k_pool, v_pool, tables, ctx), **TOL, name="paged")


@pytest.mark.parametrize("ctx,S", [([17, 8], 3), ([3], 5)])   # ([3], 5): splits 3 and 4 hold no position
def test_flash_decoding_kernels_equal_torch(ctx, S):
    q, k_pool, v_pool, tables, ctx = make_pool(ctx, 2, 1, 16, 4, seed=S)
    got = flash_decoding_cuda(q, k_pool, v_pool, tables, ctx, S)
    assert_close(torch.from_numpy(got).double(), torch_decode(q, k_pool, v_pool, tables, ctx), **TOL,
                 name=f"flash-decoding S={S}")


def test_launchers_refuse_bad_inputs_before_launching():
    q, k_pool, v_pool, tables, ctx = make_pool([6, 3], 2, 1, 8, 4, seed=0)
    NB = k_pool.shape[0]
    bad = tables.copy()
    bad[0, 1] = -1
    with pytest.raises(ValueError, match=rf"row 0 reads block_tables\[0, 1\] = -1, outside \[0, NB\) = \[0, {NB}\)"):
        paged_attention_cuda(q, k_pool, v_pool, bad, ctx)
    with pytest.raises(ValueError, match=r"context_lens\[1\] = 9 is outside \[0, M \* block_size\] = \[0, 8\]"):
        flash_decoding_cuda(q, k_pool, v_pool, tables, np.array([6, 9]), 2)
    with pytest.raises(ValueError, match="context_lens must be int64, got int32"):
        paged_attention_cuda(q, k_pool, v_pool, tables, ctx.astype(np.int32))
    with pytest.raises(ValueError, match=r"v_pool has shape"):
        paged_attention_cuda(q, k_pool, v_pool[:, :2].copy(), tables, ctx)
    with pytest.raises(ValueError, match=r"k_pool has shape .*: dimension 3 must be 8"):
        paged_attention_cuda(q, k_pool[..., :4].copy(), v_pool, tables, ctx)
    with pytest.raises(ValueError, match="C-contiguous"):
        paged_attention_cuda(np.ones((8, 2, 2), np.float32).transpose(2, 1, 0), k_pool, v_pool, tables, ctx)
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        flash_decoding_cuda(q, k_pool, v_pool, tables, ctx, 0)
    big = np.ones((2, 1, 4, 130), np.float32)
    with pytest.raises(ValueError, match="D = 130 exceeds the CUDA kernel's DMAX = 128"):
        paged_attention_cuda(np.ones((2, 4, 130), np.float32), big, big, np.zeros((2, 1), np.int64),
                             np.ones(2, np.int64))
