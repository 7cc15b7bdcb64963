"""Quantized linear layers and an int8 KV cache on the CPU (numba), for the numba backend's forward:
y (M, N) = x (M, K) @ W^T with W stored in DESIGN.md's layouts, and decode attention over an int8 pool.

    int8   w_q (N, K) int8, scales (N,) fp32                  y[m, n] = scale[n] * sum_k w_q[n, k] x[m, k]
    int4   w_packed (N, K/2) uint8, scales (N, K/G) fp32       W[n, k] = scale[n, k // G] * (nibble - 8); byte j
           holds k = 2j in its low nibble and k = 2j + 1 in its high one
    q8_0   w_q (N, K) int8, w_s (N, K/G) fp32, and x quantized the same way per group (runq.c): per group an
           exact integer dot product, then y += ((float) ival * w_s) * x_s, groups in order, in float32
    W8A8   w_q (N, K) int8, w_scale (N,), x quantized per token (absmax / 127, round half to even), optionally
           divided by `smooth` first (SmoothQuant): y = (float) (x_q . w_q) * x_scale * w_scale
    int8 KV  k_pool, v_pool (NB, BS, Hkv, D) int8, k_scale, v_scale (NB, BS, Hkv) fp32 (minillm.llama.kv_cache)

Why: batch-1 decode reads every weight once per token for one multiply-add, so its time is the weight
bytes over memory bandwidth; int8 is 1/4 and int4 about 1/7 of float32's bytes. That pays only if unpacking
costs less than the bytes it saves, so every inner loop here is one that runs vectorised (AVX2: 8 floats at a
time):
- the weights of a tile of NR output rows are dequantized ONCE per call into a small float32 buffer, and the
  dot products then take it KC inputs at a time (16 KiB, L1-resident) for every input row, so a batch of M
  rows (batched decode, speculative verification, prefill chunks) reads each weight byte from memory once;
- int4's two nibbles go to two halves of the buffer (even k, then odd k), x is permuted to match once per call,
  and the unpack is written as explicit LLVM vector code (_unpack16_int4): a group is too short for
  LLVM's loop vectoriser, and numba leaves its SLP vectoriser off;
- numba computes int8 * int8 and nibble arithmetic in int64, which AVX2 can neither convert to float nor
  multiply at full rate: every integer expression is truncated to int32 explicitly;
- indices the compiler cannot prove non-negative carry numba's wrap-around test (x[-1]) and keep a loop
  scalar: the loops index 1-D views from 0, or with unsigned offsets.
Batch invariance: every y[m, n] is computed by the same compiled loops in one fixed order (k in the micro-
kernel's order, KC chunks in order, groups in order) whatever M is and wherever row m sits; a last tile with
fewer than NR rows is padded with zero rows rather than taking another code path. So a sequence's logits do
not depend on what shares its batch, bit for bit (tests/test_quant_rows.py checks it with np.array_equal).
q8_0 and W8A8 are exact integer sums followed by float32 operations in runq.c's / torch's order, compiled
without fastmath, so they equal the torch reference layers (minillm.llama.linears) bit for bit.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from . import check_array
from .paged_attention import attention_rows

NR = 8        # weight rows per tile: 8 accumulators, one AVX2 register each once the k loop is vectorised
KC = 512      # inputs per pass of the dot products: NR x KC dequantized floats (16 KiB) stay in L1 for all M rows
W8A8_MAX_K = (2**31 - 1) // (127 * 127)    # the longest int32 dot product of int8 values that cannot overflow


# ----------------------------------------------------------------------------- shared pieces

@njit(fastmath=True, cache=True, inline="always")
def _tile_dots(xr, wb, k0, nk, acc, m):
    """acc[m, :NR] += xr[k0:k0+nk] . wb[r, k0:k0+nk] for the NR rows r of a dequantized tile: one pass over k,
    each x value loaded once for NR multiply-adds. The same compiled loop for every row m, whatever M is. The
    indices are unsigned: numba tests a signed index that LLVM cannot prove non-negative for wrap-around
    (x[-1]), and that test kept this loop scalar."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    o = np.uint64(k0)
    for k in range(np.uint64(nk)):
        xv = xr[o + k]
        a0 += xv * wb[0, o + k]
        a1 += xv * wb[1, o + k]
        a2 += xv * wb[2, o + k]
        a3 += xv * wb[3, o + k]
        a4 += xv * wb[4, o + k]
        a5 += xv * wb[5, o + k]
        a6 += xv * wb[6, o + k]
        a7 += xv * wb[7, o + k]
    acc[m, 0] += a0
    acc[m, 1] += a1
    acc[m, 2] += a2
    acc[m, 3] += a3
    acc[m, 4] += a4
    acc[m, 5] += a5
    acc[m, 6] += a6
    acc[m, 7] += a7


@njit(fastmath=True, cache=True, inline="always")
def _rows_times_tile(x, wb, acc):
    """acc (M, NR) = x (M, K) @ wb (NR, K)^T: KC inputs at a time, all M rows per chunk (the chunk of the tile
    stays in L1 while every row uses it); each acc[m, r] summed in one fixed order, chunk by chunk."""
    M, K = x.shape
    acc[:] = 0.0
    for k0 in range(0, K, KC):
        for m in range(M):
            _tile_dots(x[m], wb, k0, min(KC, K - k0), acc, m)


@njit(cache=True, inline="always")
def _tile_buffer(nr, K):
    """The (NR, K) float32 buffer a tile is dequantized into; rows past the last weight row (nr < NR, the last
    tile only) are zeros, so the last tile runs the same code as the others."""
    wb = np.empty((NR, K), np.float32)
    for r in range(nr, NR):
        wb[r, :] = 0.0
    return wb


# ----------------------------------------------------------------------------- int8 (weight-only)

@njit(parallel=True, fastmath=True, cache=True)
def int8_linear_rows(x, w_q, scales, y):
    """y (M, N) = x (M, K) @ (scales[:, None] * w_q (N, K))^T, in place. prange over tiles of NR output rows;
    a tile's int8 rows are converted to float32 once and used for all M rows; each row's scale multiplies its
    finished dot product (as int8_gemv_rows)."""
    M, K = x.shape
    N = w_q.shape[0]
    for t in prange((N + NR - 1) // NR):
        n0 = t * NR
        nr = min(NR, N - n0)
        wb = _tile_buffer(nr, K)                                     # (NR, K)
        for r in range(nr):
            src, dst = w_q[n0 + r], wb[r]
            for k in range(K):
                dst[k] = np.float32(src[k])
        acc = np.empty((M, NR), np.float32)                          # (M, NR)
        _rows_times_tile(x, wb, acc)
        for m in range(M):
            for r in range(nr):
                y[m, n0 + r] = scales[n0 + r] * acc[m, r]


# ----------------------------------------------------------------------------- int4 (weight-only, group-wise)

def _make_unpack_int4(lanes: int):
    """An intrinsic that unpacks `lanes` bytes of int4 weights in explicit LLVM vector code (see below)."""
    vi8, vi32 = ir.VectorType(ir.IntType(8), lanes), ir.VectorType(ir.IntType(32), lanes)
    vf32 = ir.VectorType(ir.FloatType(), lanes)            # 8 lanes: one AVX2 register; 16: two

    @intrinsic
    def unpack(typingctx, src, j, scale, dst, d_lo, d_hi):
        sig = types.void(src, types.intp, types.float32, dst, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            src_v, j_v, s_v, dst_v, lo_v, hi_v = args
            sa = context.make_array(signature.args[0])(context, builder, src_v)
            da = context.make_array(signature.args[3])(context, builder, dst_v)
            z = builder.zext(builder.load(builder.bitcast(builder.gep(sa.data, [j_v]), vi8.as_pointer()), align=1),
                             vi32)                                                    # the bytes as int32 lanes

            def splat(value):                                                         # one float in every lane
                undef = ir.Constant(vf32, ir.Undefined)
                return builder.shuffle_vector(builder.insert_element(undef, value, ir.Constant(ir.IntType(32), 0)),
                                              undef, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
            sv, offset = splat(s_v), splat(builder.fmul(s_v, ir.Constant(ir.FloatType(), -8.0)))
            fma = builder.module.declare_intrinsic(f"llvm.fma.v{lanes}f32", fnty=ir.FunctionType(vf32, [vf32] * 3))
            for nib, at in ((builder.and_(z, ir.Constant(vi32, [15] * lanes)), lo_v),
                            (builder.lshr(z, ir.Constant(vi32, [4] * lanes)), hi_v)):
                w = builder.call(fma, [builder.sitofp(nib, vf32), sv, offset])       # (nibble - 8) * scale
                builder.store(w, builder.bitcast(builder.gep(da.data, [at]), vf32.as_pointer()), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return unpack


# dst[d_lo:d_lo+L] <- (low nibble of src[j:j+L] - 8) * scale and dst[d_hi:d_hi+L] <- (high nibble - 8) * scale,
# float32, for L = 16 or 8 bytes, written as vector code in LLVM IR: one load, and/shift, convert, one fused
# multiply-add nibble * scale + (-8 * scale), two vector stores. Why by hand: a group's unpack loop is G/2 = 16
# bytes at G = 32, too short for LLVM's loop vectoriser (its 32-wide body never runs), and numba leaves the SLP
# vectoriser off, so the plain loop ran scalar. The values are the plain loop's bit for bit: -8 * scale is exact,
# so the FMA rounds (nibble - 8) * scale once, as the multiply does. No bounds checks: the caller keeps
# j + L <= len(src) and d + L <= len(dst).
_unpack16_int4, _unpack8_int4 = _make_unpack_int4(16), _make_unpack_int4(8)


@njit(cache=True)
def _int4_permute(x, xp):
    """xp (M, K) <- each row of x reordered as [its even k | its odd k], the order in which the int4 tile
    buffer holds a row's low and high nibbles."""
    M, K = x.shape
    for m in range(M):
        src, even, odd = x[m], xp[m, :K // 2], xp[m, K // 2:]
        for i in range(K // 2):
            even[i] = src[2 * i]
            odd[i] = src[2 * i + 1]


@njit(fastmath=True, cache=True, inline="always")
def _unpack_int4(src, sr, G2, dst):
    """One packed row src (K/2,) with its group scales sr (K/G,) -> dst[:K/2] the low nibbles (even k) and
    dst[K/2:] the high nibbles (odd k), minus 8, times their group's scale, float32. Groups of a multiple of 16
    inputs go 16 or 8 bytes at a time through _unpack16_int4 / _unpack8_int4; others (tests' tiny groups) take a
    plain loop, which computes the same values."""
    K2 = src.shape[0]
    for g in range(sr.shape[0]):
        s = sr[g]
        if G2 % 16 == 0:
            for b in range(g * G2, (g + 1) * G2, 16):
                _unpack16_int4(src, b, s, dst, b, K2 + b)
        elif G2 % 8 == 0:
            for b in range(g * G2, (g + 1) * G2, 8):
                _unpack8_int4(src, b, s, dst, b, K2 + b)
        else:
            for b in range(g * G2, (g + 1) * G2):
                v = src[b]
                dst[b] = np.float32(np.int32((v & 15) - 8)) * s             # int32: numba's int64 would stay scalar
                dst[K2 + b] = np.float32(np.int32((v >> 4) - 8)) * s


@njit(parallel=True, fastmath=True, cache=True)
def int4_linear_rows(x, w_packed, scales, y):
    """y (M, N) = x (M, K) @ W^T with W int4 group-wise (G = K // scales.shape[1]), in place. prange over tiles
    of NR output rows: each byte is unpacked once into the tile's float32 buffer, low nibbles (even k) then high
    nibbles (odd k), already times its group's scale, and the dot products run over x permuted to match, for
    all M rows. One fixed order per y[m, n] whatever M is."""
    M, K = x.shape
    N, K2 = w_packed.shape
    G2 = K2 // scales.shape[1]                                   # bytes per group: G / 2
    xp = np.empty((M, K), np.float32)                            # (M, K) x in the buffer's order
    _int4_permute(x, xp)
    for t in prange((N + NR - 1) // NR):
        n0 = t * NR
        nr = min(NR, N - n0)
        wb = _tile_buffer(nr, K)                                 # (NR, K) [low nibbles | high nibbles] per row
        for r in range(nr):
            _unpack_int4(w_packed[n0 + r], scales[n0 + r], G2, wb[r])
        acc = np.empty((M, NR), np.float32)                      # (M, NR)
        _rows_times_tile(xp, wb, acc)
        for m in range(M):
            for r in range(nr):
                y[m, n0 + r] = acc[m, r]


# ----------------------------------------------------------------------------- integer dot products

@njit(cache=True, inline="always")
def _idots(xq, w0, w1, w2, w3, w4, w5, w6, w7, out):
    """out[r] = sum_k xq[k] * w_r[k] for NR int8 rows (1-D views of equal length), exactly, in int32: one
    pass over k with xq loaded once. The products and sums are truncated to int32 explicitly (numba would
    widen them to int64, which AVX2 multiplies and adds at half the rate). Exact, so the order is moot."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.int32(0)
    for k in range(xq.shape[0]):
        xv = np.int32(xq[k])
        a0 = np.int32(a0 + xv * np.int32(w0[k]))
        a1 = np.int32(a1 + xv * np.int32(w1[k]))
        a2 = np.int32(a2 + xv * np.int32(w2[k]))
        a3 = np.int32(a3 + xv * np.int32(w3[k]))
        a4 = np.int32(a4 + xv * np.int32(w4[k]))
        a5 = np.int32(a5 + xv * np.int32(w5[k]))
        a6 = np.int32(a6 + xv * np.int32(w6[k]))
        a7 = np.int32(a7 + xv * np.int32(w7[k]))
    out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7] = a0, a1, a2, a3, a4, a5, a6, a7


@njit(cache=True, inline="always")
def _tile_rows(N, n0):
    """The NR weight row indices of the tile at n0; rows past N repeat row N - 1 (their results are dropped),
    so every tile runs the same code."""
    r = np.empty(NR, np.int64)
    for i in range(NR):
        r[i] = min(n0 + i, N - 1)
    return r


# ----------------------------------------------------------------------------- q8_0 (runq.c)

@njit(cache=True)
def q8_0_quantize_rows(x, gs, xq, xs):
    """runq.c's quantize() of activations, per group of gs along each row: scale = max |x| / 127 (float32),
    q = round(x / scale) with C's round (half away from zero, on the float32 quotient). x (M, K) float32 ->
    xq (M, K) int8, xs (M, K/gs) float32, in place. An all-zero group gets scale 0 and q 0 (as
    minillm.llama.linears.q80_quantize). No fastmath: x / scale must stay a division."""
    M, K = x.shape
    for m in range(M):
        for g in range(K // gs):
            xg, qg = x[m, g * gs:(g + 1) * gs], xq[m, g * gs:(g + 1) * gs]
            wmax = np.float32(0.0)
            for i in range(gs):
                wmax = max(wmax, abs(xg[i]))
            scale = wmax / np.float32(127.0)
            xs[m, g] = scale
            for i in range(gs):
                if scale == 0:
                    qg[i] = 0
                else:
                    v = np.float64(xg[i] / scale)                    # float32 quotient, rounded as a double
                    qg[i] = np.int8(np.floor(v + 0.5) if v >= 0 else -np.floor(-v + 0.5))


@njit(parallel=True, cache=True)
def q8_0_linear_rows(xq, xs, w_q, w_s, y):
    """y (M, N) from runq.c's matmul, in place: xq (M, K) int8 and xs (M, K/G) from q8_0_quantize_rows, w_q
    (N, K) int8, w_s (N, K/G). Per group an exact int32 dot product; then val += ((float) ival * w_s) * x_s,
    groups in order, in float32 (no fastmath: the torch reference Q80Linear computes the same, bit for bit).
    prange over tiles of NR output rows, each tile's weights read from memory once for all M rows."""
    M, K = xq.shape
    N = w_q.shape[0]
    ng = w_s.shape[1]
    G = K // ng
    for t in prange((N + NR - 1) // NR):
        n0 = t * NR
        rows = _tile_rows(N, n0)
        isum = np.empty(NR, np.int32)
        val = np.empty(NR, np.float32)
        for m in range(M):
            val[:] = 0.0
            for g in range(ng):
                a, b = g * G, (g + 1) * G
                _idots(xq[m, a:b], w_q[rows[0], a:b], w_q[rows[1], a:b], w_q[rows[2], a:b], w_q[rows[3], a:b],
                       w_q[rows[4], a:b], w_q[rows[5], a:b], w_q[rows[6], a:b], w_q[rows[7], a:b], isum)
                for r in range(NR):
                    val[r] = val[r] + (np.float32(isum[r]) * w_s[rows[r], g]) * xs[m, g]
            for r in range(min(NR, N - n0)):
                y[m, n0 + r] = val[r]


# ----------------------------------------------------------------------------- W8A8 (SmoothQuant's layout)

@njit(cache=True)
def w8a8_quantize_rows(x, smooth, xq, xs):
    """W8A8Linear's activation quantization, per row (token): x' = x / smooth (when smooth has K entries; an
    empty smooth skips it), scale = max(max |x'| / 127, 1e-30), q = round half to even(x' / scale). x (M, K)
    float32 -> xq (M, K) int8, xs (M,) float32, in place. No fastmath: the divisions stay divisions."""
    M, K = x.shape
    tmp = np.empty(K, np.float32)
    for m in range(M):
        xr, qr = x[m], xq[m]
        for k in range(K):
            tmp[k] = xr[k] / smooth[k] if smooth.shape[0] else xr[k]
        amax = np.float32(0.0)
        for k in range(K):
            amax = max(amax, abs(tmp[k]))
        scale = max(amax / np.float32(127.0), np.float32(1e-30))
        xs[m] = scale
        for k in range(K):
            qr[k] = np.int8(np.rint(tmp[k] / scale))


@njit(parallel=True, cache=True)
def w8a8_linear_rows(xq, xs, w_q, w_scale, y):
    """y (M, N) = (float) (xq . w_q) * xs[m] * w_scale[n], in place: xq (M, K) int8 and xs (M,) from
    w8a8_quantize_rows, w_q (N, K) int8, w_scale (N,). An exact int32 dot product per output (K must not exceed
    W8A8_MAX_K), then two float32 multiplies in W8A8Linear's order. prange over tiles of NR output rows."""
    M, K = xq.shape
    N = w_q.shape[0]
    for t in prange((N + NR - 1) // NR):
        n0 = t * NR
        rows = _tile_rows(N, n0)
        isum = np.empty(NR, np.int32)
        for m in range(M):
            _idots(xq[m], w_q[rows[0]], w_q[rows[1]], w_q[rows[2]], w_q[rows[3]], w_q[rows[4]], w_q[rows[5]],
                   w_q[rows[6]], w_q[rows[7]], isum)
            for r in range(min(NR, N - n0)):
                y[m, n0 + r] = np.float32(isum[r]) * xs[m] * w_scale[n0 + r]


# ----------------------------------------------------------------------------- int8 KV cache

@njit(cache=True)
def kv_int8_write_rows(new, slots, pool, scale_pool):
    """KVCache.update's int8 write, for one layer's K or V: new (R, Hkv, D) float32 is quantized per (row,
    head), scale = max |new| / 127 and q = round half to even(new / max(scale, 1e-30)), into pool (NB, BS, Hkv, D)
    int8 and scale_pool (NB, BS, Hkv) float32 at slots (R,) (slot = block * BS + offset; -1: padding, skipped).
    No fastmath: it must write what the torch cache writes, bit for bit."""
    R, Hkv, D = new.shape
    BS = pool.shape[1]
    for r in range(R):
        if slots[r] < 0:
            continue
        blk, off = slots[r] // BS, slots[r] % BS
        for h in range(Hkv):
            v = new[r, h]
            amax = np.float32(0.0)
            for d in range(D):
                amax = max(amax, abs(v[d]))
            scale = amax / np.float32(127.0)
            scale_pool[blk, off, h] = scale
            safe = max(scale, np.float32(1e-30))
            q = pool[blk, off, h]
            for d in range(D):
                q[d] = np.int8(np.rint(v[d] / safe))


@njit(parallel=True, fastmath=True, cache=True)
def paged_attention_tree_rows_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, starts,
                                     visible, out):
    """paged_attention.paged_attention_tree_rows over an int8 pool (k_pool, v_pool (NB, BS, Hkv, D) int8, k_scale,
    v_scale (NB, BS, Hkv) float32, minillm.llama.kv_cache's layout), dequantized on read (the score is
    (q . k_q) * k_scale / sqrt(D), the value weight exp(s - m) * v_scale: one multiply on a scalar each).
    out (R, H, D) in place; each (row, head) computed alone in a fixed order: a row's result never depends on
    the others."""
    attention_rows(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, starts, visible, out)


@njit(parallel=True, fastmath=True, cache=True)
def paged_attention_rows_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, out):
    """paged_attention.paged_attention_rows over an int8 pool: out (R, H, D) <- row r's query q[r] (H, D)
    attending to its first context_lens[r] cached positions, in place."""
    paged_attention_tree_rows_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, context_lens,
                                     np.zeros((q.shape[0], 0), np.bool_), out)


# ----------------------------------------------------------------------------- numpy in, numpy out (checked)

def _numpy(a):
    """A torch CPU tensor as a numpy view (the kernels take numpy arrays); numpy arrays pass as they are."""
    return a.detach().numpy() if type(a).__module__.startswith("torch") else a


def _rows(x):
    """x (K,) or (M, K) float32 -> the (M, K) view the kernels take, and whether to drop the M axis after."""
    x = _numpy(x)
    if len(getattr(x, "shape", ())) == 1:
        check_array("x", x, np.float32, 1)
        return x.reshape(1, -1), True
    return check_array("x", x, np.float32, 2), False


def _groups(name: str, K: int, n_groups: int) -> int:
    """The group size K / n_groups, or a ValueError naming the scales array and both numbers."""
    if n_groups < 1 or K % n_groups:
        raise ValueError(f"{name} has {n_groups} groups per row, which must divide K = {K}")
    return K // n_groups


def int8_linear_cpu(x, w_q, scales):
    """x (K,) or (M, K) @ int8 W (N, K)^T -> (N,) or (M, N) float32 (int8_linear_rows)."""
    x2, vec = _rows(x)
    w_q = check_array("w_q", _numpy(w_q), np.int8, 2, (None, x2.shape[1]))
    scales = check_array("scales", _numpy(scales), np.float32, 1, (w_q.shape[0],))
    y = np.empty((x2.shape[0], w_q.shape[0]), np.float32)                      # (M, N)
    int8_linear_rows(x2, w_q, scales, y)
    return y[0] if vec else y


def int4_linear_cpu(x, w_packed, scales):
    """x (K,) or (M, K) @ int4 W (N, K)^T -> (N,) or (M, N) float32 (int4_linear_rows); the group size is
    K / scales.shape[1] and must be even (a byte never straddles two groups)."""
    x2, vec = _rows(x)
    K = x2.shape[1]
    if K % 2:
        raise ValueError(f"int4 packs two inputs per byte: x's K = {K} must be even")
    w_packed = check_array("w_packed", _numpy(w_packed), np.uint8, 2, (None, K // 2))
    scales = check_array("scales", _numpy(scales), np.float32, 2, (w_packed.shape[0], None))
    G = _groups("scales", K, scales.shape[1])
    if G % 2:
        raise ValueError(f"int4 group size G = K / scales.shape[1] = {G} must be even (a byte never straddles groups)")
    y = np.empty((x2.shape[0], w_packed.shape[0]), np.float32)                 # (M, N)
    int4_linear_rows(x2, w_packed, scales, y)
    return y[0] if vec else y


def q8_0_quantize_cpu(x, gs: int):
    """runq.c's activation quantization: x (M, K) float32 -> (xq (M, K) int8, xs (M, K/gs) float32)."""
    x = check_array("x", _numpy(x), np.float32, 2)
    if gs < 1 or x.shape[1] % gs:
        raise ValueError(f"Q8_0 group size gs = {gs} must be >= 1 and divide K = {x.shape[1]}")
    xq = np.empty(x.shape, np.int8)                                            # (M, K)
    xs = np.empty((x.shape[0], x.shape[1] // gs), np.float32)                  # (M, K/gs)
    q8_0_quantize_rows(x, gs, xq, xs)
    return xq, xs


def q8_0_linear_cpu(x, w_q, w_s):
    """x (K,) or (M, K) @ Q8_0 W (N, K)^T -> (N,) or (M, N) float32, runq.c's way: x quantized per group
    (group size K / w_s.shape[1]), integer dot products per group (q8_0_linear_rows)."""
    x2, vec = _rows(x)
    w_q = check_array("w_q", _numpy(w_q), np.int8, 2, (None, x2.shape[1]))
    w_s = check_array("w_s", _numpy(w_s), np.float32, 2, (w_q.shape[0], None))
    xq, xs = q8_0_quantize_cpu(x2, _groups("w_s", x2.shape[1], w_s.shape[1]))
    y = np.empty((x2.shape[0], w_q.shape[0]), np.float32)                      # (M, N)
    q8_0_linear_rows(xq, xs, w_q, w_s, y)
    return y[0] if vec else y


def w8a8_linear_cpu(x, w_q, w_scale, smooth=None):
    """x (K,) or (M, K) @ W8A8 W (N, K)^T -> (N,) or (M, N) float32: x (divided by smooth (K,) when given)
    quantized per row, an exact integer dot product, then x_scale * w_scale (W8A8Linear's math)."""
    x2, vec = _rows(x)
    K = x2.shape[1]
    if K > W8A8_MAX_K:
        raise ValueError(f"W8A8: K = {K} exceeds {W8A8_MAX_K}, beyond which an int32 sum of int8 products can overflow")
    w_q = check_array("w_q", _numpy(w_q), np.int8, 2, (None, K))
    w_scale = check_array("w_scale", _numpy(w_scale), np.float32, 1, (w_q.shape[0],))
    smooth = np.zeros(0, np.float32) if smooth is None else check_array("smooth", _numpy(smooth), np.float32, 1, (K,))
    xq = np.empty(x2.shape, np.int8)                                           # (M, K)
    xs = np.empty(x2.shape[0], np.float32)                                     # (M,)
    w8a8_quantize_rows(x2, smooth, xq, xs)
    y = np.empty((x2.shape[0], w_q.shape[0]), np.float32)                      # (M, N)
    w8a8_linear_rows(xq, xs, w_q, w_scale, y)
    return y[0] if vec else y


def check_paged_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens):
    """paged_attention.check_paged for an int8 pool: dtypes, shapes, contiguity, GQA, and that each row reads
    only blocks that exist. Returns the arguments as numpy arrays."""
    q = check_array("q", _numpy(q), np.float32, 3)
    R, H, D = q.shape
    k_pool = check_array("k_pool", _numpy(k_pool), np.int8, 4, (None, None, None, D))
    v_pool = check_array("v_pool", _numpy(v_pool), np.int8, 4, tuple(k_pool.shape))
    k_scale = check_array("k_scale", _numpy(k_scale), np.float32, 3, tuple(k_pool.shape[:3]))
    v_scale = check_array("v_scale", _numpy(v_scale), np.float32, 3, tuple(k_pool.shape[:3]))
    block_tables = check_array("block_tables", _numpy(block_tables), np.int64, 2, (R, None))
    context_lens = check_array("context_lens", _numpy(context_lens), np.int64, 1, (R,))
    NB, BS, Hkv, _ = k_pool.shape
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"k_pool has {Hkv} KV heads: must divide q's H = {H} (GQA)")
    M = block_tables.shape[1]
    for r in range(R):
        n = int(context_lens[r])
        if not 0 <= n <= M * BS:
            raise ValueError(f"context_lens[{r}] = {n} is outside [0, M * block_size] = [0, {M * BS}]")
        used = block_tables[r, :(n + BS - 1) // BS]                            # the entries row r reads
        bad = np.flatnonzero((used < 0) | (used >= NB))
        if bad.size:
            raise ValueError(f"row {r} reads block_tables[{r}, {bad[0]}] = {used[bad[0]]}, outside [0, NB) = [0, {NB})")
    return q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens


def paged_attention_int8kv_cpu(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens):
    """Decode attention over an int8 KV pool, numpy out: q (R, H, D) -> (R, H, D) float32."""
    args = check_paged_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens)
    out = np.empty(args[0].shape, np.float32)                                  # (R, H, D)
    paged_attention_rows_int8kv(*args, out)
    return out


def kv_int8_write_cpu(new, slots, pool, scale_pool):
    """kv_int8_write_rows with its arguments checked: new (R, Hkv, D) float32, slots (R,) int64 (-1: skip),
    pool (NB, BS, Hkv, D) int8 and scale_pool (NB, BS, Hkv) float32, written in place."""
    new = check_array("new", _numpy(new), np.float32, 3)
    R, Hkv, D = new.shape
    pool = check_array("pool", _numpy(pool), np.int8, 4, (None, None, Hkv, D))
    scale_pool = check_array("scale_pool", _numpy(scale_pool), np.float32, 3, tuple(pool.shape[:3]))
    slots = check_array("slots", _numpy(slots), np.int64, 1, (R,))
    n_slots = pool.shape[0] * pool.shape[1]
    bad = np.flatnonzero((slots < -1) | (slots >= n_slots))
    if bad.size:
        raise ValueError(f"slots[{bad[0]}] = {slots[bad[0]]} is outside [-1, NB * block_size) = [-1, {n_slots})")
    kv_int8_write_rows(new, slots, pool, scale_pool)
