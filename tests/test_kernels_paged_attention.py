"""CPU twins of paged decode attention and Flash-Decoding at real shapes: against the engine's torch
paged attention (minillm.llama.attention) and a plain torch reference, against each other, and batch-independent."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.flash_attention import flash_attention_cpu
from minillm.kernels.paged_attention import (
    CHUNK,
    flash_decoding_cpu,
    flash_decoding_rows,
    paged_attention_cpu,
    paged_attention_rows,
)

from minillm.llama.attention import AttentionMetadata, paged_attention


def make_pool(ctx, H, Hkv, D, BS, seed, spare=3):
    """Random q and pools, and shuffled block tables: row r's blocks are scattered over the pool. Table
    entries past a row's context point at real blocks too (the torch reference gathers them)."""
    rng = np.random.default_rng(seed)
    ctx = np.asarray(ctx, np.int64)
    M = max(1, -(-int(ctx.max()) // BS))
    NB = len(ctx) * M + spare
    tables = rng.permutation(NB)[:len(ctx) * M].reshape(len(ctx), M).astype(np.int64)   # (R, M)
    q = rng.standard_normal((len(ctx), H, D), dtype=np.float32)                          # (R, H, D)
    k_pool = rng.standard_normal((NB, BS, Hkv, D), dtype=np.float32)                     # (NB, BS, Hkv, D)
    v_pool = rng.standard_normal((NB, BS, Hkv, D), dtype=np.float32)                     # (NB, BS, Hkv, D)
    return q, k_pool, v_pool, tables, ctx


def torch_decode(q, k_pool, v_pool, tables, ctx):
    """Plain float64 reference: gather each row's positions through its table, softmax, weighted sum."""
    out = torch.zeros(q.shape, dtype=torch.float64)                                       # (R, H, D)
    BS, g = k_pool.shape[1], q.shape[1] // k_pool.shape[2]
    for r, n in enumerate(ctx):
        p = torch.arange(int(n))
        slots = torch.as_tensor(tables[r])[p // BS] * BS + p % BS                         # (n,)
        k = torch.as_tensor(k_pool).double().flatten(0, 1)[slots].repeat_interleave(g, 1)  # (n, H, D)
        v = torch.as_tensor(v_pool).double().flatten(0, 1)[slots].repeat_interleave(g, 1)  # (n, H, D)
        if n:
            s = torch.einsum("hd,jhd->hj", torch.as_tensor(q[r]).double(), k) / q.shape[2] ** 0.5  # (H, n)
            out[r] = torch.einsum("hj,jhd->hd", s.softmax(-1), v)
    return out


def engine_decode(q, k_pool, v_pool, tables, ctx):
    """minillm.llama.attention.paged_attention with one query token per row at position ctx - 1, in float64."""
    t = torch.from_numpy(ctx)
    attn = AttentionMetadata(None, torch.from_numpy(tables), t, (t - 1)[:, None])
    return paged_attention(torch.from_numpy(q)[:, None].double(), torch.from_numpy(k_pool).double(),
                           torch.from_numpy(v_pool).double(), attn)[:, 0]                  # (R, H, D)


# float32 scores of D <= 64 products (~1e-6 absolute rounding each) over <= 300 positions, as in the
# flash-attention tests; the worst seen is under 1e-6, so 1e-5 leaves a 10x margin.
TOL = dict(atol=1e-5, rtol=1e-5)
CASES = [  # contexts straddle block boundaries (BS - 1, BS, BS + 1), include 0, 1 and ~300
    ([1, 15, 16, 17, 300, 0], 4, 2, 64, 16),
    ([1, 2, 57, 299], 6, 3, 48, 1),
    ([63, 64, 65, 250], 6, 6, 48, 64),
    ([5, 129, 277], 4, 1, 64, 16),
]


@pytest.mark.parametrize("ctx,H,Hkv,D,BS", CASES)
def test_paged_attention_rows_equals_torch(ctx, H, Hkv, D, BS):
    q, k_pool, v_pool, tables, ctx = make_pool(ctx, H, Hkv, D, BS, seed=D + BS)
    out = np.empty_like(q)
    paged_attention_rows(q, k_pool, v_pool, tables, ctx, out)
    got = torch.from_numpy(out).double()
    assert_close(got, torch_decode(q, k_pool, v_pool, tables, ctx), **TOL, name="paged vs plain torch")
    assert_close(got, engine_decode(q, k_pool, v_pool, tables, ctx), **TOL, name="paged vs minillm.llama.attention")


@pytest.mark.parametrize("ctx,H,Hkv,D,BS", CASES)
def test_flash_decoding_equals_paged(ctx, H, Hkv, D, BS):
    q, k_pool, v_pool, tables, ctx = make_pool(ctx, H, Hkv, D, BS, seed=1)
    paged = paged_attention_cpu(q, k_pool, v_pool, tables, ctx)
    for S in (2, 3, 8, 400):           # 400 > every context: some splits are empty
        out = np.empty_like(q)
        flash_decoding_rows(q, k_pool, v_pool, tables, ctx, S, out)
        # a different summation order (per-split sums, then LSE weights): a few float32 ulps of the output
        assert_close(torch.from_numpy(out), torch.from_numpy(paged), atol=2e-6, rtol=2e-6, name=f"num_splits={S}")
    # one split: the same sums in the same order, and a combine with weight exp(0) = 1, on the rows that the
    # CPU paged attention also takes in one piece (a context of at most CHUNK positions; longer ones it cuts)
    one = ctx <= CHUNK
    assert one.any() and not one.all()
    assert np.array_equal(flash_decoding_cpu(q, k_pool, v_pool, tables, ctx, 1)[one], paged[one])


def test_a_rows_result_does_not_depend_on_the_other_rows():
    q, k_pool, v_pool, tables, ctx = make_pool([7, 300, 16, 1, 150, 33], 4, 2, 64, 16, seed=2)
    full = paged_attention_cpu(q, k_pool, v_pool, tables, ctx)
    order = np.array([5, 0, 3, 1, 4, 2])
    shuffled = paged_attention_cpu(q[order], k_pool, v_pool, tables[order], ctx[order])
    assert np.array_equal(shuffled, full[order])                               # bit for bit
    for r in range(len(ctx)):
        alone = paged_attention_cpu(q[r:r + 1], k_pool, v_pool, tables[r:r + 1], ctx[r:r + 1])
        assert np.array_equal(alone[0], full[r])


def test_prefill_as_one_row_per_token_equals_causal_attention():
    """paged == dense: each query token gets its own row with context_len = position + 1."""
    T, H, Hkv, D, BS = 70, 4, 2, 64, 16
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((T, h, D), dtype=np.float32) for h in (H, Hkv, Hkv))    # (T, H|Hkv, D)
    blocks = rng.permutation(10)[:-(-T // BS)]                                 # a shuffled block table
    k_pool, v_pool = np.zeros((10, BS, Hkv, D), np.float32), np.zeros((10, BS, Hkv, D), np.float32)
    p = np.arange(T)
    k_pool[blocks[p // BS], p % BS], v_pool[blocks[p // BS], p % BS] = k, v
    tables = np.tile(blocks.astype(np.int64), (T, 1))                          # (T, M): every row, one sequence
    got = paged_attention_cpu(q, k_pool, v_pool, tables, p.astype(np.int64) + 1)
    assert_close(torch.from_numpy(got), torch.from_numpy(flash_attention_cpu(q, k, v)), **TOL, name="paged prefill")


def test_guards_name_the_bad_value():
    q, k_pool, v_pool, tables, ctx = make_pool([20, 5], 4, 2, 16, 4, seed=0)
    NB = k_pool.shape[0]
    bad = tables.copy()
    bad[1, 1] = NB                                  # row 1 reads blocks 0 and 1 (5 positions, BS 4)
    with pytest.raises(ValueError, match=rf"row 1 reads block_tables\[1, 1\] = {NB}, outside \[0, NB\) = \[0, {NB}\)"):
        paged_attention_cpu(q, k_pool, v_pool, bad, ctx)
    bad[1, 1], bad[1, 4] = tables[1, 1], -1         # an entry past the context is never read: allowed
    paged_attention_cpu(q, k_pool, v_pool, bad, ctx)
    with pytest.raises(ValueError, match=r"context_lens\[0\] = 21 is outside \[0, M \* block_size\] = \[0, 20\]"):
        flash_decoding_cpu(q, k_pool, v_pool, tables, np.array([21, 5]), 2)
    with pytest.raises(ValueError, match="block_tables must be int64, got int32"):
        paged_attention_cpu(q, k_pool, v_pool, tables.astype(np.int32), ctx)
    with pytest.raises(ValueError, match="must divide q's H"):
        paged_attention_cpu(q, k_pool[:, :, :1].repeat(3, 2), v_pool[:, :, :1].repeat(3, 2), tables, ctx)
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        flash_decoding_cpu(q, k_pool, v_pool, tables, ctx, 0)


# Head dims that are not a multiple of the vector loops' 8 lanes (kernels.vec8): D = 4 is remainder only (no 8-float
# step), 12 and 20 are steps plus a remainder of 4, 13 an odd one (a Llama's D is even for RoPE; the kernel's is not
# tied to it). Every case above has D % 8 == 0, so none of them reads the remainder loops of attend_heads.
ODD_D = [  # contexts on both sides of CHUNK and of the block boundaries, as above
    ([1, 15, 16, 17, 130, 0], 4, 2, 12, 16),
    ([2, 63, 64, 65], 3, 3, 4, 8),
    ([9, 70, 200], 4, 1, 20, 4),
    ([33, 100], 2, 1, 13, 16),
]


@pytest.mark.parametrize("ctx,H,Hkv,D,BS", ODD_D)
def test_head_dims_off_the_8_lane_steps_equal_torch(ctx, H, Hkv, D, BS):
    """Both remainder loops (the score's q . k and the value sum's axpy, the last D % 8 lanes each) against the
    float64 references, in paged attention and in Flash-Decoding (TOL as above: these are shorter dots)."""
    q, k_pool, v_pool, tables, ctx = make_pool(ctx, H, Hkv, D, BS, seed=D)
    want = torch_decode(q, k_pool, v_pool, tables, ctx)
    out = np.empty_like(q)
    paged_attention_rows(q, k_pool, v_pool, tables, ctx, out)
    assert_close(torch.from_numpy(out).double(), want, **TOL, name=f"paged vs plain torch, D={D}")
    assert_close(torch.from_numpy(out).double(), engine_decode(q, k_pool, v_pool, tables, ctx), **TOL,
                 name=f"paged vs minillm.llama.attention, D={D}")
    for S in (1, 3):
        assert_close(torch.from_numpy(flash_decoding_cpu(q, k_pool, v_pool, tables, ctx, S)).double(), want, **TOL,
                     name=f"flash-decoding num_splits={S}, D={D}")


@pytest.mark.parametrize("ctx,H,Hkv,D,BS", ODD_D[:1] + ODD_D[2:3])
def test_an_int8_pool_at_head_dims_off_the_8_lane_steps_equals_torch(ctx, H, Hkv, D, BS):
    """The int8 pool goes through the same remainder loops (each int8 converted to float32, the scale applied to
    the sum): against the plain torch reference on the dequantized pool, k_q * k_scale."""
    from minillm.kernels.quant_rows import paged_attention_rows_int8kv
    q, k_pool, v_pool, tables, ctx = make_pool(ctx, H, Hkv, D, BS, seed=D + 1)
    rng = np.random.default_rng(D)
    kq, vq = (rng.integers(-127, 128, k_pool.shape).astype(np.int8) for _ in range(2))     # (NB, BS, Hkv, D) int8
    ks, vs = (rng.uniform(0.005, 0.02, k_pool.shape[:3]).astype(np.float32) for _ in range(2))  # (NB, BS, Hkv)
    out = np.empty_like(q)
    paged_attention_rows_int8kv(q, kq, vq, ks, vs, tables, ctx, out)
    want = torch_decode(q, kq * ks[..., None], vq * vs[..., None], tables, ctx)
    assert_close(torch.from_numpy(out).double(), want, **TOL, name=f"int8 pool vs plain torch, D={D}")
