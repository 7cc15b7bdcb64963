"""Dequantizing GEMV: y = W x with W stored as int8 or int4 plus float scales, in DESIGN.md's layouts.

    int8: w_q (N, K) int8, scales (N,) fp32              y[n] = scale[n] * sum_k w_q[n, k] x[k]
    int4: w_packed (N, K/2) uint8, scales (N, K/G) fp32  y[n] = sum_g scale[n, g] * sum_{k in g} q[n, k] x[k]
          byte j of a row holds k = 2j in its LOW nibble and k = 2j + 1 in its high nibble, each as q + 8

Why: decode is memory-bound. Each weight is read once per token and used for one multiply-add, so the
time is the bytes of W divided by memory bandwidth. int8 halves fp16's bytes and int4 quarters them; the
dequantization (a multiply by a scale) costs arithmetic the GPU has to spare (LLM.int8(), Dettmers et al.
2022; GPTQ/AWQ kernels, Frantar et al. 2022, Lin et al. 2023). Scales are per output row (int8, as
gpt-fast's WeightOnlyInt8Linear) or per group of G inputs (int4, as llama.cpp's Q4 and gpt-fast's int4):
smaller groups follow the weights more closely, at the price of more scale bytes.
The scale is applied once per row (int8) or per group (int4), after the integer-weighted sum.
"""
from __future__ import annotations

import numpy as np
from numba import float32, int32, njit, prange

from . import check_array, cuda_kernel, empty_like, to_device
from .block_reduce import block_sum

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

GEMV_THREADS = 32    # threads cooperating on one output element (one warp), as matmul.py's gemv


# ----------------------------------------------------------------------------- quantizers (numpy)

def quantize_int8(w):
    """Symmetric absmax per output row: scale[n] = max_k |w[n, k]| / 127, q = round(w / scale).
    w (N, K) float -> (w_q (N, K) int8, scales (N,) float32, max abs error of scale * q vs w)."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"w must be (N, K), got shape {w.shape}")
    scales = np.abs(w).max(axis=1) / 127.0                                    # (N,)
    safe = np.where(scales > 0, scales, 1.0)[:, None]                         # (N, 1): an all-zero row stays 0
    q = np.clip(np.rint(w / safe), -127, 127).astype(np.int8)                 # (N, K)
    scales = scales.astype(np.float32)
    err = float(np.abs(q * scales[:, None].astype(np.float64) - w).max(initial=0.0))   # in float64: exact
    return q, scales, err


def quantize_int4(w, group: int):
    """Symmetric absmax per group of `group` inputs: scale = max |w| / 7, q = round(w / scale) in [-7, 7]
    (the layout allows -8 too; symmetric rounding never produces it). w (N, K) float ->
    (w_packed (N, K/2) uint8, scales (N, K/G) float32, max abs error)."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"w must be (N, K), got shape {w.shape}")
    N, K = w.shape
    _check_int4_shape(K, group)
    wg = w.reshape(N, K // group, group)                                      # (N, K/G, G)
    scales = np.abs(wg).max(axis=2) / 7.0                                     # (N, K/G)
    safe = np.where(scales > 0, scales, 1.0)[:, :, None]                      # (N, K/G, 1)
    q = np.clip(np.rint(wg / safe), -8, 7).astype(np.int8).reshape(N, K)      # (N, K)
    u = (q + 8).astype(np.uint8)                                              # (N, K) stored nibbles, 0..15
    packed = u[:, 0::2] | (u[:, 1::2] << 4)                                   # (N, K/2): even k low, odd k high
    scales = scales.astype(np.float32)
    err = float(np.abs(q.reshape(N, K // group, group) * scales[:, :, None].astype(np.float64) - wg).max(initial=0.0))
    return np.ascontiguousarray(packed), scales, err


def _check_int4_shape(K: int, group: int):
    if K % 2:
        raise ValueError(f"int4 packs two inputs per byte: K = {K} must be even")
    if group < 2 or group % 2:
        raise ValueError(f"int4 group size must be even and >= 2 (a byte never straddles groups), got {group}")
    if K % group:
        raise ValueError(f"K = {K} is not divisible by the group size G = {group}")


# ----------------------------------------------------------------------------- CUDA kernels

@cuda_kernel("void(float32[:, ::1], int8[:, ::1], float32[::1], float32[:, ::1])")
def int8_gemv(x, w_q, scales, y):
    """y (M, N) = x (M, K) @ dequant(w_q)^T. Grid (N, M), GEMV_THREADS threads: block (n, m) makes
    y[m, n]; thread i sums k = i, i + 32, ... (coalesced int8 reads), a shared-memory tree adds the 32
    partial sums, and the row's scale is applied once at the end."""
    part = cuda.shared.array(GEMV_THREADS, float32)
    n, m, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    K = x.shape[1]
    acc = float32(0.0)
    for k in range(i, K, GEMV_THREADS):
        acc += float32(w_q[n, k]) * x[m, k]
    total = block_sum(part, acc, i, GEMV_THREADS)
    if i == 0:
        y[m, n] = scales[n] * total


@cuda_kernel("void(float32[:, ::1], uint8[:, ::1], float32[:, ::1], float32[:, ::1])")
def int4_gemv(x, w_packed, scales, y):
    """y (M, N) = x (M, K) @ dequant(w_packed)^T, G = K / scales.shape[1]. Grid (N, M), GEMV_THREADS
    threads: for each group, thread i unpacks bytes j = i, i + 32, ... of the group (two inputs each),
    then multiplies its group sum by the group's scale; a shared-memory tree adds the 32 partial sums."""
    part = cuda.shared.array(GEMV_THREADS, float32)
    n, m, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    n_groups = scales.shape[1]
    half = w_packed.shape[1] // n_groups              # bytes per group: G / 2
    acc = float32(0.0)
    for g in range(n_groups):
        s = float32(0.0)
        for j in range(g * half + i, (g + 1) * half, GEMV_THREADS):
            byte = int32(w_packed[n, j])
            s += float32((byte & 15) - 8) * x[m, 2 * j] + float32((byte >> 4) - 8) * x[m, 2 * j + 1]
        acc += scales[n, g] * s
    total = block_sum(part, acc, i, GEMV_THREADS)
    if i == 0:
        y[m, n] = total


def _rows(x):
    """x (K,) or (M, K): the 2-D view the kernels take, and whether to drop the M axis afterwards."""
    if len(x.shape) == 1:
        check_array("x", x, np.float32, 1)
        return x.reshape((1, x.shape[0])), True
    return check_array("x", x, np.float32, 2), False


def _check_int8(x, w_q, scales):
    x2, vec = _rows(x)
    check_array("w_q", w_q, np.int8, 2, (None, x2.shape[1]))
    check_array("scales", scales, np.float32, 1, (w_q.shape[0],))
    return x2, vec


def _check_int4(x, w_packed, scales, group):
    x2, vec = _rows(x)
    K = x2.shape[1]
    _check_int4_shape(K, group)
    check_array("w_packed", w_packed, np.uint8, 2, (None, K // 2))
    check_array("scales", scales, np.float32, 2, (w_packed.shape[0], K // group))
    return x2, vec


def int8_gemv_cuda(x, w_q, scales):
    """x (K,) or (M, K) @ int8 W (N, K)^T -> (N,) or (M, N) float32, on the GPU (or the simulator)."""
    x2, vec = _check_int8(x, w_q, scales)
    M, N = x2.shape[0], w_q.shape[0]
    y = empty_like(x, (M, N))                                                 # (M, N)
    if M and N:
        int8_gemv[(N, M), GEMV_THREADS](to_device(x2), to_device(w_q), to_device(scales), to_device(y))
    return y.reshape((N,)) if vec else y


def int4_gemv_cuda(x, w_packed, scales, group: int):
    """x (K,) or (M, K) @ int4 W (N, K)^T -> (N,) or (M, N) float32, on the GPU (or the simulator)."""
    x2, vec = _check_int4(x, w_packed, scales, group)
    M, N = x2.shape[0], w_packed.shape[0]
    y = empty_like(x, (M, N))                                                 # (M, N)
    if M and N:
        int4_gemv[(N, M), GEMV_THREADS](to_device(x2), to_device(w_packed), to_device(scales), to_device(y))
    return y.reshape((N,)) if vec else y


# ----------------------------------------------------------------------------- CPU twins

@njit(parallel=True, fastmath=True, cache=True)
def int8_gemv_rows(x, w_q, scales, y):
    """y (M, N) = x (M, K) @ dequant(w_q (N, K))^T, in place. prange over output rows n (each weight row
    is read from memory once and used for all M inputs); one fixed summation order per y[m, n]."""
    M, K = x.shape
    N = w_q.shape[0]
    for n in prange(N):
        for m in range(M):
            acc = np.float32(0.0)
            for k in range(K):
                acc += np.float32(w_q[n, k]) * x[m, k]
            y[m, n] = scales[n] * acc


@njit(parallel=True, fastmath=True, cache=True)
def int4_gemv_rows(x, w_packed, scales, group, y):
    """y (M, N) = x (M, K) @ dequant(w_packed (N, K/2))^T with scales (N, K/G), in place: per group, the
    integer-weighted sum of its G inputs times the group's scale. prange over output rows n."""
    M, K = x.shape
    N = w_packed.shape[0]
    half = group // 2
    for n in prange(N):
        for m in range(M):
            acc = np.float32(0.0)
            for g in range(K // group):
                s = np.float32(0.0)
                for j in range(g * half, (g + 1) * half):
                    byte = np.int32(w_packed[n, j])
                    s += np.float32((byte & 15) - 8) * x[m, 2 * j] + np.float32((byte >> 4) - 8) * x[m, 2 * j + 1]
                acc += scales[n, g] * s
            y[m, n] = acc


def int8_gemv_cpu(x, w_q, scales):
    """x (K,) or (M, K) @ int8 W (N, K)^T -> (N,) or (M, N), numpy float32."""
    x2, vec = _check_int8(x, w_q, scales)
    y = np.empty((x2.shape[0], w_q.shape[0]), np.float32)                     # (M, N)
    int8_gemv_rows(x2, w_q, scales, y)
    return y[0] if vec else y


def int4_gemv_cpu(x, w_packed, scales, group: int):
    """x (K,) or (M, K) @ int4 W (N, K)^T -> (N,) or (M, N), numpy float32."""
    x2, vec = _check_int4(x, w_packed, scales, group)
    y = np.empty((x2.shape[0], w_packed.shape[0]), np.float32)                # (M, N)
    int4_gemv_rows(x2, w_packed, scales, group, y)
    return y[0] if vec else y
