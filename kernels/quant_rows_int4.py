"""The int4 weight-only linear on the CPU (numba), group-wise, in DESIGN.md's int4 layout: w_packed (N, K/2)
uint8, byte j holds k = 2j in its low nibble and k = 2j + 1 in its high one, each stored as q + 8, and fp32
scales (N, K/G) for group size G: W[n, k] = scale[n, k // G] * (nibble - 8).

How it stays fast (kernels/quant_rows_tiles.py has the tile scheme): a tile's two nibbles go to two halves of
its float32 buffer (even k, then odd k), x is permuted to match once per call, and the unpack is written as
explicit LLVM vector code (_unpack16_int4): a group is too short for LLVM's loop vectoriser, and numba leaves
its SLP vectoriser off.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from . import check_array
from .quant_rows_tiles import NR, _groups, _numpy, _rows, _rows_times_tile, _tile_buffer

# ----------------------------------------------------------------------------- unpacking nibbles

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
def unpack_int4_plain(src, sr, dst):
    """What _unpack_int4 computes with the vector code above, as one plain loop over the bytes: a packed row src
    (K/2,) with its group scales sr (K/G,) -> dst (K,), dst[b] = (low nibble of src[b] - 8) * its group's scale
    and dst[K/2 + b] = (high nibble - 8) * the same scale (tests/test_quant_rows.py: equal bit for bit)."""
    K2 = src.shape[0]
    G2 = K2 // sr.shape[0]                                       # bytes per group: G / 2
    for b in range(K2):
        s = sr[b // G2]
        v = np.int32(src[b])
        dst[b] = np.float32((v & 15) - 8) * s
        dst[K2 + b] = np.float32((v >> 4) - 8) * s


@njit(cache=True)
def _int4_permute(x, xp):
    """xp (M, K) <- each row of x reordered as [its even k | its odd k], the order in which the int4 tile
    buffer holds a row's low and high nibbles."""
    M, K = x.shape
    for m in range(M):
        src, even, odd = x[m], xp[m, :K // 2], xp[m, K // 2:]        # (K,), (K/2,), (K/2,) views
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


# ----------------------------------------------------------------------------- the linear

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
