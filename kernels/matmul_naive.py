"""The naive matmul, kept as the baseline the tiled one is measured against: one thread per output,
every operand straight from global memory, no shared memory, no reuse.

Why keep a slow kernel: the access diagram (minillm.kernels.access_trace) counts its reads. Thread
(m, n) reads row m of x and row n of W, so each x[m, k] is read by all N threads of its output row and
each W[n, k] by all M threads of its column: M*N*2K global reads for 2*M*N*K flops, one read per
flop. matmul.matmul_tiled reads the same data TILE times fewer (Kirk & Hwu, ch. 5).
"""
from __future__ import annotations

import numpy as np
from numba import float32

from . import blocks, check_array, cuda_kernel, empty_like, to_device
from .matmul import TILE

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)


@cuda_kernel("void(float32[:, ::1], float32[:, ::1], float32[:, ::1])")
def matmul_naive(x, w, y):
    """y (M, N) = x (M, K) @ w (N, K)^T. Grid (ceil(N/TILE), ceil(M/TILE)), block (TILE, TILE):
    thread (n, m) = cuda.grid(2) owns y[m, n] and loops over all of k itself."""
    n, m = cuda.grid(2)                                   # x runs along N: neighbouring threads write neighbouring y
    M, K = x.shape
    N = w.shape[0]
    if m < M and n < N:
        acc = float32(0.0)
        for k in range(K):                                # 2K global reads per output: no reuse between threads
            acc += x[m, k] * w[n, k]
        y[m, n] = acc


def matmul_naive_cuda(x, w):
    """x (M, K) @ w (N, K)^T -> (M, N) float32 with the naive kernel (GPU or simulator), same launch
    shape as matmul.matmul_cuda so the two compare thread for thread."""
    check_array("x", x, np.float32, 2)
    check_array("w", w, np.float32, 2, (None, x.shape[1]))
    M, N = x.shape[0], w.shape[0]
    y = empty_like(x, (M, N))
    matmul_naive[(blocks(N, TILE), blocks(M, TILE)), (TILE, TILE)](to_device(x), to_device(w), to_device(y))
    return y
