"""W8A8 (SmoothQuant's layout, Xiao et al. 2023) on the CPU (numba): w_q (N, K) int8 with one fp32 scale per
output row w_scale (N,), and x quantized per token at every call (absmax / 127, round half to even), divided by
`smooth` first when SmoothQuant migrated activation outliers into the weights: y = (float) (x_q . w_q) * x_scale
* w_scale. An exact integer sum, then float32 operations in W8A8Linear's order, compiled without fastmath, so it
equals the torch reference layer (minillm.llama.linears.W8A8Linear) bit for bit."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import check_array
from .quant_rows_tiles import NR, _idots, _numpy, _rows, _tile_rows

W8A8_MAX_K = (2**31 - 1) // (127 * 127)    # the longest int32 dot product of int8 values that cannot overflow


@njit(cache=True)
def w8a8_quantize_rows(x, smooth, xq, xs):
    """W8A8Linear's activation quantization, per row (token): x' = x / smooth (when smooth has K entries; an
    empty smooth skips it), scale = max(max |x'| / 127, 1e-30), q = round half to even(x' / scale). x (M, K)
    float32 -> xq (M, K) int8, xs (M,) float32, in place. No fastmath: the divisions stay divisions."""
    M, K = x.shape
    tmp = np.empty(K, np.float32)                                    # (K,) one row, smoothed
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
        isum = np.empty(NR, np.int32)                                # (NR,)
        for m in range(M):
            _idots(xq[m], w_q[rows[0]], w_q[rows[1]], w_q[rows[2]], w_q[rows[3]], w_q[rows[4]], w_q[rows[5]],
                   w_q[rows[6]], w_q[rows[7]], isum)
            for r in range(min(NR, N - n0)):
                y[m, n0 + r] = np.float32(isum[r]) * xs[m] * w_scale[n0 + r]


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
