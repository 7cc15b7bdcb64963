"""Q8_0 as llama2.c's runq.c runs it, on the CPU (numba): w_q (N, K) int8 with fp32 scales w_s (N, K/G), and x
quantized the same way per group of G inputs at every call. Per group an exact integer dot product, then
y += ((float) ival * w_s) * x_s, groups in order, in float32. Exact integer sums followed by float32 operations
in runq.c's order, compiled without fastmath, so it equals the torch reference layer Q80Linear
(minillm.llama.linears) bit for bit."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import check_array
from .quant_rows_tiles import NR, _groups, _idots, _numpy, _rows, _tile_rows


@njit(cache=True)
def q8_0_quantize_rows(x, gs, xq, xs):
    """runq.c's quantize() of activations, per group of gs along each row: scale = max |x| / 127 (float32),
    q = round(x / scale) with C's round (half away from zero, on the float32 quotient). x (M, K) float32 ->
    xq (M, K) int8, xs (M, K/gs) float32, in place. An all-zero group gets scale 0 and q 0 (as
    minillm.llama.linears.q80_quantize). No fastmath: x / scale must stay a division."""
    M, K = x.shape
    for m in range(M):
        for g in range(K // gs):
            xg, qg = x[m, g * gs:(g + 1) * gs], xq[m, g * gs:(g + 1) * gs]   # (gs,) views of one group
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
        isum = np.empty(NR, np.int32)                                # (NR,)
        val = np.empty(NR, np.float32)                               # (NR,)
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
