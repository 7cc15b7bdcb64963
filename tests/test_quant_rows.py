"""kernels/quant_rows.py: the numba backend's quantized linears (int8, int4, q8_0, W8A8) and int8-KV decode
attention, against the torch reference layers (minillm.llama.linears, the int8 KVCache and paged_attention),
bit-for-bit batch invariance, odd shapes, and the wrappers' errors."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.paged_attention import paged_attention_tree_rows
from minillm.kernels.quant_rows import (
    W8A8_MAX_K,
    int4_linear_cpu,
    int8_linear_cpu,
    kv_int8_write_cpu,
    paged_attention_int8kv_cpu,
    paged_attention_tree_rows_int8kv,
    q8_0_linear_cpu,
    q8_0_quantize_cpu,
    w8a8_linear_cpu,
)
from minillm.kernels.quant_rows_int4 import _unpack_int4, unpack_int4_plain

from minillm.config import ModelConfig
from minillm.llama.attention import AttentionMetadata, paged_attention
from minillm.llama.kv_cache import KVCache
from minillm.llama.linears import Int4Linear, Int8Linear, Q80Linear, W8A8Linear, q80_group_size, q80_quantize

U = 2.0 ** -24          # float32's unit roundoff


def linear(N, K, seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(K, N, bias=False)


def rows(M, K, seed):
    return torch.randn(M, K, generator=torch.Generator().manual_seed(seed))


def float32_bound(x, w, terms):
    """The worst-case rounding of a float32 dot product in any summation order, |fl(x.w) - x.w| <= n u |x|.|w|
    (Higham, "Accuracy and Stability of Numerical Algorithms", 2002, eq. 3.5) with n = `terms` roundings per
    product chain (the K - 1 additions plus the dequantizing and scaling multiplies): a bound, not a guess, so
    the kernels' and torch's different summation orders both fit inside it. x (M, K), w (N, K) -> (M, N)."""
    return terms * U * (x.double().abs() @ w.double().abs().T)


# ----------------------------------------------------------------------------- against the reference layers

SHAPES = [(1, 33, 128), (3, 5, 768), (17, 64, 40), (2, 1, 6), (4, 2049, 1536)]   # N past a tile, K past a chunk


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_int8_linear_equals_int8linear(M, N, K):
    ref, _ = Int8Linear.from_linear(linear(N, K, seed=N + K))
    x = rows(M, K, seed=M)
    got = torch.from_numpy(int8_linear_cpu(x.numpy(), ref.w_q.numpy(), ref.scales.numpy()))
    w = ref.dequantize(torch.float64)                                                     # (N, K) exact
    bound = float32_bound(x, w, K + 2)
    assert bool(((got.double() - x.double() @ w.T).abs() <= bound).all()), "int8 vs exact"
    assert bool(((got.double() - ref(x).double()).abs() <= 2 * bound).all()), "int8 vs Int8Linear"  # two roundings


# groups of 16k inputs take the 16-byte vector unpack, 16 and 48 the 8-byte one, the rest (8, 2, 600) plain loops
@pytest.mark.parametrize("M,N,K,G", [(1, 33, 128, 32), (3, 5, 768, 128), (17, 64, 40, 8), (2, 1, 6, 2),
                                     (4, 2049, 1536, 32), (2, 9, 1200, 600), (3, 10, 96, 16), (5, 11, 96, 48)])
def test_int4_linear_equals_int4linear(M, N, K, G):
    ref, _ = Int4Linear.from_linear(linear(N, K, seed=N + K), G)
    x = rows(M, K, seed=M)
    got = torch.from_numpy(int4_linear_cpu(x.numpy(), ref.w_packed.numpy(), ref.scales.numpy()))
    w = ref.dequantize(torch.float64)                                                     # (N, K) exact
    bound = float32_bound(x, w, K + 2)                        # + the (q - 8) * scale rounding, once per weight
    assert bool(((got.double() - x.double() @ w.T).abs() <= bound).all()), "int4 vs exact"
    assert bool(((got.double() - ref(x).double()).abs() <= 2 * bound).all()), "int4 vs Int4Linear"


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_q8_0_equals_q80linear_bit_for_bit(M, N, K):
    """Exact integer sums, then runq.c's float32 steps in its order: the same bits as the torch reference."""
    G = q80_group_size(K)
    ref, _ = Q80Linear.from_linear(linear(N, K, seed=N + K), G)
    x = rows(M, K, seed=M) * 3
    x[0, :G] = 0.0                                                      # an all-zero group: scale 0, q 0
    xq, xs = q8_0_quantize_cpu(x.numpy(), G)
    want_q, want_s, _ = q80_quantize(x, G)
    assert np.array_equal(xq, want_q.numpy()) and np.array_equal(xs, want_s.numpy())
    got = q8_0_linear_cpu(x.numpy(), ref.w_q.numpy(), ref.scales.numpy())
    assert np.array_equal(got, ref(x).numpy())


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("smoothed", [False, True])
def test_w8a8_equals_w8a8linear_bit_for_bit(M, N, K, smoothed):
    smooth = torch.rand(K, generator=torch.Generator().manual_seed(K)) + 0.5 if smoothed else None
    ref, _ = W8A8Linear.from_linear(linear(N, K, seed=N + K), smooth)
    x = rows(M, K, seed=M)
    got = w8a8_linear_cpu(x.numpy(), ref.w_q.numpy(), ref.w_scale.numpy(), None if smooth is None else smooth.numpy())
    assert np.array_equal(got, ref(x).numpy())


@pytest.mark.parametrize("G", [32, 16, 64, 6])   # per group: one 16-byte vector unpack, one 8-byte, two 16-byte, plain
def test_int4_unpack_vector_code_equals_its_plain_twin_bit_for_bit(G):
    """_unpack_int4's LLVM vector unpack (one fma: nibble * s + (-8 s), exact -8 s, so one rounding) against
    unpack_int4_plain ((nibble - 8) * s, one rounding of the same exact product): equal bit for bit; and the plain
    twin against numpy's own float32 arithmetic on the layout."""
    rng = np.random.default_rng(G)
    K = 4 * G if G > 6 else 36
    src = rng.integers(0, 256, K // 2, dtype=np.uint8)                                   # (K/2,) one packed row
    sr = (rng.standard_normal(K // G) * 0.1).astype(np.float32)                          # (K/G,) group scales
    ir_out, plain_out = np.full(K, np.nan, np.float32), np.full(K, np.nan, np.float32)   # (K,) [low | high]
    _unpack_int4(src, sr, K // 2 // sr.shape[0], ir_out)
    unpack_int4_plain(src, sr, plain_out)
    assert np.array_equal(ir_out, plain_out)
    s = np.repeat(sr, G // 2)                                                            # (K/2,) each byte's scale
    lo, hi = (src & 15).astype(np.float32) - 8, (src >> 4).astype(np.float32) - 8
    assert np.array_equal(plain_out, np.concatenate([lo * s, hi * s]))


def test_vector_in_vector_out_and_torch_tensors_accepted():
    ref, _ = Int8Linear.from_linear(linear(7, 16, seed=1))
    x = rows(1, 16, seed=2)
    y = int8_linear_cpu(x[0], ref.w_q, ref.scales)                                        # torch (K,) in
    assert y.shape == (7,) and np.array_equal(y, int8_linear_cpu(x.numpy(), ref.w_q.numpy(), ref.scales.numpy())[0])


# ----------------------------------------------------------------------------- batch invariance, bit for bit

def _kernels(K, seed=0):
    """name -> f(x (M, K) numpy) -> (M, N) for every quantized linear, on the same random weights (N = 37)."""
    lin = linear(37, K, seed)
    i8, _ = Int8Linear.from_linear(lin)
    i4, _ = Int4Linear.from_linear(lin, 32)
    q8, _ = Q80Linear.from_linear(lin, q80_group_size(K))
    smooth = np.linspace(0.5, 2.0, K, dtype=np.float32)
    wa, _ = W8A8Linear.from_linear(lin, torch.from_numpy(smooth))
    return {"int8": lambda x: int8_linear_cpu(x, i8.w_q.numpy(), i8.scales.numpy()),
            "int4": lambda x: int4_linear_cpu(x, i4.w_packed.numpy(), i4.scales.numpy()),
            "q8_0": lambda x: q8_0_linear_cpu(x, q8.w_q.numpy(), q8.scales.numpy()),
            "w8a8": lambda x: w8a8_linear_cpu(x, wa.w_q.numpy(), wa.w_scale.numpy(), smooth)}


@pytest.mark.parametrize("K", [768, 1088])          # 1088: two chunks, the second partial
def test_a_row_is_bit_identical_whatever_shares_its_batch(K):
    """The engine's promise: a sequence's logits do not depend on its batch. Row `probe` computed alone, and
    at several positions inside batches of M = 3, 17 and 32 other rows, gives the same bits."""
    rng = np.random.default_rng(K)
    probe = rng.standard_normal((1, K), dtype=np.float32)
    for name, f in _kernels(K).items():
        alone = f(probe)[0]
        for M in (3, 17, 32):
            batch = rng.standard_normal((M, K), dtype=np.float32) * 2
            for pos in sorted({0, M // 2, M - 1}):
                batch[pos] = probe[0]
                assert np.array_equal(f(batch)[pos], alone), f"{name}: row at {pos} of {M} differs from alone"
                batch[pos] = rng.standard_normal(K, dtype=np.float32)


# ----------------------------------------------------------------------------- int8 KV cache

def int8_cache(ctx, H, Hkv, D, BS, seed, spare=2):
    """An int8 KVCache (one layer) filled through KVCache.update with random K/V at every slot, shuffled block
    tables, and random queries: the pools exactly as the engine's int8 cache holds them."""
    g = torch.Generator().manual_seed(seed)
    ctx = np.asarray(ctx, np.int64)
    M = max(1, -(-int(ctx.max()) // BS))
    NB = len(ctx) * M + spare
    kv = KVCache(ModelConfig(dim=H * D, n_heads=H, n_kv_heads=Hkv, n_layers=1), NB, BS, dtype=torch.int8)
    slots = torch.arange(NB * BS)[None]                                                   # (1, NB*BS)
    kv.update(0, slots, 3 * torch.randn(1, NB * BS, Hkv, D, generator=g), torch.randn(1, NB * BS, Hkv, D, generator=g))
    tables = torch.randperm(NB, generator=g)[:len(ctx) * M].view(len(ctx), M)             # (R, M)
    q = torch.randn(len(ctx), H, D, generator=g)                                          # (R, H, D)
    return q, kv, tables, torch.from_numpy(ctx)


def torch_int8_decode(q, kv, tables, ctx):
    """minillm.llama.attention.paged_attention on the int8 pool (dequantized as it gathers), in float64."""
    attn = AttentionMetadata(None, tables, ctx, (ctx - 1)[:, None])
    return paged_attention(q[:, None].double(), *kv.layer(0)[:2], attn, *kv.layer(0)[2:])[:, 0]   # (R, H, D)


# float32 scores of D <= 64 products over <= 300 positions, as tests/test_kernels_paged_attention.py: the worst
# difference seen from the float64 reference is about 1e-6, so 1e-5 leaves a 10x margin.
TOL = dict(atol=1e-5, rtol=1e-5)
CASES = [([1, 15, 16, 17, 300, 0], 4, 2, 64, 16), ([1, 2, 57, 299], 6, 3, 48, 1), ([5, 129, 277], 4, 1, 64, 16)]


@pytest.mark.parametrize("ctx,H,Hkv,D,BS", CASES)
def test_int8kv_attention_equals_torch_on_the_int8_cache(ctx, H, Hkv, D, BS):
    q, kv, tables, ctx = int8_cache(ctx, H, Hkv, D, BS, seed=D + BS)
    got = paged_attention_int8kv_cpu(q, *kv.layer(0), tables, ctx)
    assert_close(torch.from_numpy(got).double(), torch_int8_decode(q, kv, tables, ctx), **TOL, name="int8 KV")


def test_int8kv_tree_attention_equals_the_float_kernel_on_dequantized_pools():
    """Medusa's tree rows: the same visibility rules as paged_attention_tree_rows, on the dequantized pool."""
    q, kv, tables, ctx = int8_cache([40, 40, 40], 4, 2, 32, 16, seed=5)
    k, v, ks, vs = (t.numpy() for t in kv.layer(0))
    starts = np.array([36, 36, 36], np.int64)                                          # 4 new tokens each
    visible = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 1]], np.bool_)         # (R, T) tree rows
    got, want = np.empty(q.shape, np.float32), np.empty(q.shape, np.float32)
    paged_attention_tree_rows_int8kv(q.numpy(), k, v, ks, vs, tables.numpy(), ctx.numpy(), starts, visible, got)
    kf, vf = k * ks[..., None], v * vs[..., None]                                      # (NB, BS, Hkv, D) float32
    paged_attention_tree_rows(q.numpy(), kf, vf, tables.numpy(), ctx.numpy(), starts, visible, want)
    assert_close(torch.from_numpy(got), torch.from_numpy(want), **TOL, name="int8 tree vs float tree")
    assert not np.allclose(got[0], got[1])                                             # the mask changed something


def test_int8kv_rows_do_not_depend_on_the_other_rows():
    q, kv, tables, ctx = int8_cache([30, 7, 64, 1], 4, 2, 32, 8, seed=3)
    pools = kv.layer(0)
    full = paged_attention_int8kv_cpu(q, *pools, tables, ctx)
    for r in range(4):
        alone = paged_attention_int8kv_cpu(q[r:r + 1], *pools, tables[r:r + 1], ctx[r:r + 1])
        assert np.array_equal(full[r], alone[0])


def test_kv_int8_write_matches_kvcache_update_bit_for_bit():
    cfg = ModelConfig(dim=64, n_heads=4, n_kv_heads=2, n_layers=1)
    kv = KVCache(cfg, num_blocks=3, block_size=4, dtype=torch.int8)
    new = 2 * torch.randn(5, 2, 16, generator=torch.Generator().manual_seed(0))
    new[1, 0] = 0.0                                                                    # an all-zero head: scale 0
    slots = torch.tensor([0, 5, -1, 11, 6])
    kv.update(0, slots[None], new[None], new[None])
    pool, scale = np.zeros((3, 4, 2, 16), np.int8), np.zeros((3, 4, 2), np.float32)
    kv_int8_write_cpu(new.numpy(), slots.numpy(), pool, scale)
    assert np.array_equal(pool, kv.k[0].numpy()) and np.array_equal(scale, kv.k_scale[0].numpy())


# ----------------------------------------------------------------------------- users' mistakes

def test_bad_shapes_and_dtypes_raise_clear_errors():
    x = np.ones((2, 8), np.float32)
    w8, s8 = np.ones((3, 8), np.int8), np.ones(3, np.float32)
    with pytest.raises(ValueError, match="x must be float32, got float64"):
        int8_linear_cpu(x.astype(np.float64), w8, s8)
    with pytest.raises(ValueError, match="w_q has shape \\(3, 6\\): dimension 1 must be 8"):
        int8_linear_cpu(x, w8[:, :6].copy(), s8)
    with pytest.raises(ValueError, match="scales has shape \\(2,\\): dimension 0 must be 3"):
        int8_linear_cpu(x, w8, s8[:2].copy())
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        int8_linear_cpu(np.ones((8, 2), np.float32).T, w8, s8)
    w4 = np.ones((3, 4), np.uint8)
    with pytest.raises(ValueError, match="K = 7 must be even"):
        int4_linear_cpu(np.ones((1, 7), np.float32), w4, np.ones((3, 1), np.float32))
    with pytest.raises(ValueError, match="3 groups per row, which must divide K = 8"):
        int4_linear_cpu(x, w4, np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match="group size G = K / scales.shape\\[1\\] = 1 must be even"):
        int4_linear_cpu(x, w4, np.ones((3, 8), np.float32))
    with pytest.raises(ValueError, match="w_packed must be uint8, got int8"):
        int4_linear_cpu(x, w4.astype(np.int8), np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="w_s has 3 groups per row, which must divide K = 8"):
        q8_0_linear_cpu(x, w8, np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match="group size gs = 3 must be >= 1 and divide K = 8"):
        q8_0_quantize_cpu(x, 3)
    with pytest.raises(ValueError, match="smooth has shape \\(7,\\): dimension 0 must be 8"):
        w8a8_linear_cpu(x, w8, s8, np.ones(7, np.float32))
    K = W8A8_MAX_K + 1
    with pytest.raises(ValueError, match=f"K = {K} exceeds {W8A8_MAX_K}"):
        w8a8_linear_cpu(np.ones((1, K), np.float32), np.ones((1, K), np.int8), np.ones(1, np.float32))


def test_bad_int8kv_arguments_raise_clear_errors():
    q, kv, tables, ctx = int8_cache([5, 9], 4, 2, 16, 4, seed=1)
    k, v, ks, vs = kv.layer(0)
    with pytest.raises(ValueError, match="k_pool must be int8, got float32"):
        paged_attention_int8kv_cpu(q, k.float(), v, ks, vs, tables, ctx)
    with pytest.raises(ValueError, match="k_scale has shape"):
        paged_attention_int8kv_cpu(q, k, v, ks[:, :2].contiguous(), vs, tables, ctx)
    with pytest.raises(ValueError, match="k_pool has 2 KV heads: must divide q's H = 3"):
        paged_attention_int8kv_cpu(q[:, :3].contiguous(), k, v, ks, vs, tables, ctx)
    bad = tables.clone()
    bad[1, 0] = 99
    with pytest.raises(ValueError, match="row 1 reads block_tables\\[1, 0\\] = 99, outside \\[0, NB\\)"):
        paged_attention_int8kv_cpu(q, k, v, ks, vs, bad, ctx)
    with pytest.raises(ValueError, match="context_lens\\[0\\] = 100 is outside"):
        paged_attention_int8kv_cpu(q, k, v, ks, vs, tables, torch.tensor([100, 9]))
    with pytest.raises(ValueError, match="slots\\[0\\] = 99 is outside"):
        kv_int8_write_cpu(np.ones((1, 2, 16), np.float32), np.array([99]), k.numpy(), ks.numpy())


# ----------------------------------------------------------------------------- the micro-benchmark

def test_bench_linear_rows_reports_bytes_seconds_and_speedup_per_format():
    from minillm.bench.quant import LINEAR_ROWS_FORMATS, bench_linear_rows, linear_rows_layer
    res = bench_linear_rows(N=20, K=128, M=3, repeats=2, layers=2, threads=1)
    assert res["shape"] == (20, 128) and res["M"] == 3 and res["layers"] == 2 and res["threads"] == 1
    assert list(res["rows"]) == list(LINEAR_ROWS_FORMATS)
    for fmt, r in res["rows"].items():
        assert r["weight_bytes"] == 2 * sum(a.nbytes for a in linear_rows_layer(fmt, 20, 128).values())
        assert r["gb_s"] == pytest.approx(r["weight_bytes"] / r["seconds"] / 1e9)
        assert r["spread"][0] <= r["seconds"] <= r["spread"][1]
        assert r["speedup"] == pytest.approx(res["rows"]["fp32"]["seconds"] / r["seconds"])
    assert res["rows"]["int4 g32"]["weight_bytes"] == 2 * (20 * 64 + 4 * 20 * 4)             # nibbles + scales
    small = bench_linear_rows(N=8, K=64, repeats=1, formats=("int8",), llc_bytes=10_000)     # layers of 544 bytes
    assert small["layers"] == 28 and 28 * 544 >= 1.5 * 10_000 > 27 * 544                     # the fewest past 1.5 LLC
    with pytest.raises(ValueError, match="unknown format 'int4 g3' for K = 64"):
        bench_linear_rows(N=8, K=64, formats=("fp32", "int4 g3"))
