"""2:4 semi-structured sparsity: a compressed weight layout and its GEMV (a CUDA kernel and its CPU twin).

In every group of 4 consecutive inputs of a weight row, at most 2 weights are nonzero (NVIDIA's sparse tensor cores,
Mishra et al. 2021, "Accelerating Sparse Deep Neural Networks"). Only the 2 kept values are stored, with a 2-bit
index each saying where in its group of 4 the value sits:

    values (N, K/2) float32      value v of row n belongs to group v // 2 (inputs 4 (v // 2) .. 4 (v // 2) + 3)
    meta   (N, K/8) uint8        byte b holds the 2-bit indices of values 4b .. 4b + 3, lowest bits first:
                                 idx(v) = (meta[n, v // 4] >> 2 (v % 4)) & 3; value v multiplies x[4 (v // 2) + idx(v)]

That is 2K + K/8 bytes per row instead of 4K: 0.53x of dense float32 (the GPU format stores fp16 values and
the same 2-bit indices). Why it pays at batch 1: decode reads every weight once per token, so half the values
is about half the bytes, and the gather from x (which stays in cache) is cheap.
"""
from __future__ import annotations

import numpy as np
from numba import float32, int32, njit, prange

from . import check_array, cuda_kernel, empty_like, to_device
from .block_reduce import block_sum

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

GEMV_THREADS = 32          # one warp per output element: thread i reads meta bytes i, i + 32, ... (coalesced)

# ----------------------------------------------------------------------------- layout (numpy)

def compress_24(w):
    """w (N, K) float with at most 2 nonzeros in every group of 4 inputs -> (values (N, K/2) float32,
    meta (N, K/8) uint8). A group with fewer than 2 nonzeros stores zeros at the first free positions."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"w must be (N, K), got shape {w.shape}")
    N, K = w.shape
    if K % 8:
        raise ValueError(f"2:4 packs the indices of 2 groups of 4 per byte: K = {K} must be divisible by 8")
    g = w.reshape(N, K // 4, 4)                                               # (N, K/4, 4)
    nnz = (g != 0).sum(-1)                                                    # (N, K/4)
    if (nnz > 2).any():
        n, grp = np.argwhere(nnz > 2)[0]
        raise ValueError(f"not 2:4 sparse: row {n}, inputs {4 * grp}..{4 * grp + 3} hold {nnz[n, grp]} nonzeros")
    # the 2 positions kept per group: nonzeros first (stable), then the lowest zero positions
    order = np.argsort(g == 0, axis=-1, kind="stable")[..., :2]               # (N, K/4, 2)
    order = np.sort(order, axis=-1)                                           # (N, K/4, 2) ascending positions
    values = np.take_along_axis(g, order, axis=-1).reshape(N, K // 2)         # (N, K/2)
    idx = order.reshape(N, K // 8, 4).astype(np.uint8)                        # (N, K/8, 4) 2-bit each
    meta = idx[..., 0] | (idx[..., 1] << 2) | (idx[..., 2] << 4) | (idx[..., 3] << 6)   # (N, K/8)
    return np.ascontiguousarray(values), np.ascontiguousarray(meta.astype(np.uint8))


def decompress_24(values, meta):
    """The dense (N, K) float32 weight the compressed layout stands for."""
    N, half = values.shape
    K = 2 * half
    idx = np.stack([(meta >> s) & 3 for s in (0, 2, 4, 6)], axis=-1).reshape(N, half).astype(np.int64)  # (N, K/2)
    cols = 4 * (np.arange(half) // 2)[None, :] + idx                         # (N, K/2) input of each value
    w = np.zeros((N, K), np.float32)
    np.put_along_axis(w, cols, values, axis=1)
    return w


def _check(x, values, meta):
    if len(x.shape) == 1:
        check_array("x", x, np.float32, 1)
        x2, vec = x.reshape((1, x.shape[0])), True
    else:
        x2, vec = check_array("x", x, np.float32, 2), False
    K = x2.shape[1]
    if K % 8:
        raise ValueError(f"2:4 needs K divisible by 8, got K = {K}")
    check_array("values", values, np.float32, 2, (None, K // 2))
    check_array("meta", meta, np.uint8, 2, (values.shape[0], K // 8))
    return x2, vec


# ----------------------------------------------------------------------------- CUDA kernel

@cuda_kernel("void(float32[:, ::1], float32[:, ::1], uint8[:, ::1], float32[:, ::1])")
def sparse24_gemv(x, values, meta, y):
    """y (M, N) = x (M, K) @ W^T, W in the 2:4 layout. Grid (N, M), GEMV_THREADS threads: block (n, m) makes
    y[m, n]; thread i takes meta bytes b = i, i + 32, ... (8 inputs, 4 stored values each), then a shared-memory
    tree adds the 32 partial sums. On a GPU with sparse tensor cores (sm_80+) cuSPARSELt does this in the MMA."""
    part = cuda.shared.array(GEMV_THREADS, float32)
    n, m, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    acc = float32(0.0)
    for b in range(i, meta.shape[1], GEMV_THREADS):
        byte = int32(meta[n, b])
        base, v = 8 * b, 4 * b
        acc += values[n, v] * x[m, base + (byte & 3)] + values[n, v + 1] * x[m, base + ((byte >> 2) & 3)]
        acc += values[n, v + 2] * x[m, base + 4 + ((byte >> 4) & 3)]
        acc += values[n, v + 3] * x[m, base + 4 + ((byte >> 6) & 3)]
    total = block_sum(part, acc, i, GEMV_THREADS)
    if i == 0:
        y[m, n] = total


def sparse24_gemv_cuda(x, values, meta):
    """x (K,) or (M, K) @ W (N, K)^T in the 2:4 layout -> (N,) or (M, N) float32, on the GPU (or the simulator)."""
    x2, vec = _check(x, values, meta)
    M, N = x2.shape[0], values.shape[0]
    y = empty_like(x, (M, N))                                                 # (M, N)
    if M and N:
        sparse24_gemv[(N, M), GEMV_THREADS](to_device(x2), to_device(values), to_device(meta), to_device(y))
    return y.reshape((N,)) if vec else y


# ----------------------------------------------------------------------------- CPU twin

@njit(parallel=True, fastmath=True, cache=True)
def sparse24_gemv_rows(x, values, meta, y):
    """y (M, N) = x (M, K) @ W^T with W in the 2:4 layout, in place. prange over output rows n; per meta byte
    (8 inputs, 4 stored values) one byte read and 4 gathers from x, into 4 accumulators (the gathers do not
    vectorize, so independent sums keep the core busy). One fixed summation order per y[m, n]."""
    M, K = x.shape
    N = values.shape[0]
    for n in prange(N):
        vn, mn = values[n], meta[n]                                           # (K/2,), (K/8,)
        for m in range(M):
            xm = x[m]                                                         # (K,)
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for b in range(K // 8):
                byte = np.int32(mn[b])
                base, v = 8 * b, 4 * b
                a0 += vn[v] * xm[base + (byte & 3)]
                a1 += vn[v + 1] * xm[base + ((byte >> 2) & 3)]
                a2 += vn[v + 2] * xm[base + 4 + ((byte >> 4) & 3)]
                a3 += vn[v + 3] * xm[base + 4 + ((byte >> 6) & 3)]
            y[m, n] = (a0 + a1) + (a2 + a3)


@njit(parallel=True, fastmath=True, cache=True)
def dense_gemv_rows(x, w, y):
    """y (M, N) = x (M, K) @ w (N, K)^T with the same loop order as sparse24_gemv_rows: the dense baseline its
    speed is compared with (bench sparsity), so the only difference is the bytes read and the gather."""
    M, K = x.shape
    N = w.shape[0]
    for n in prange(N):
        for m in range(M):
            acc = np.float32(0.0)
            for k in range(K):
                acc += w[n, k] * x[m, k]
            y[m, n] = acc


def sparse24_gemv_cpu(x, values, meta):
    """x (K,) or (M, K) @ W (N, K)^T in the 2:4 layout -> (N,) or (M, N), numpy float32."""
    x2, vec = _check(x, values, meta)
    y = np.empty((x2.shape[0], values.shape[0]), np.float32)                 # (M, N)
    sparse24_gemv_rows(x2, values, meta, y)
    return y[0] if vec else y
