"""The int8 weight-only linear on the CPU (numba): w_q (N, K) int8 with one fp32 scale per output row (N,),
DESIGN.md's int8 layout, y[m, n] = scale[n] * sum_k w_q[n, k] x[m, k]. A tile of NR rows is converted to
float32 once and multiplied by every row of x (kernels/quant_rows_tiles.py says why)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import check_array
from .quant_rows_tiles import NR, _numpy, _rows, _rows_times_tile, _tile_buffer


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


def int8_linear_cpu(x, w_q, scales):
    """x (K,) or (M, K) @ int8 W (N, K)^T -> (N,) or (M, N) float32 (int8_linear_rows)."""
    x2, vec = _rows(x)
    w_q = check_array("w_q", _numpy(w_q), np.int8, 2, (None, x2.shape[1]))
    scales = check_array("scales", _numpy(scales), np.float32, 1, (w_q.shape[0],))
    y = np.empty((x2.shape[0], w_q.shape[0]), np.float32)                      # (M, N)
    int8_linear_rows(x2, w_q, scales, y)
    return y[0] if vec else y
