"""RMSNorm, out = x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019), as llama2.c's run.c
`rmsnorm`, plus the fused residual-add + RMSNorm that every Llama block runs twice per layer
(FasterTransformer's `invokeGeneralAddResidualT5PreLayerNorm`, vLLM's `fused_add_rms_norm`).

Why fuse: a block does `residual = residual + x` and then normalizes the sum. Two kernels write the
sum to global memory and read it straight back; one kernel keeps it on chip between the add and the
norm, saving one read of the (M, C) activations (`bytes_moved` counts it). Both are memory-bound:
a handful of flops per byte, so bytes moved is the time.

GPU layout: one block per row. Each thread sums the squares of elements i, i + nt, i + 2nt, ...
(neighbouring threads read neighbouring elements: coalesced), then a tree reduction in shared memory
adds the nt partial sums. A second pass over the row (the block's own recent reads, served from
cache) scales and writes.
"""
from __future__ import annotations

import math

import numpy as np
from numba import float32, njit, prange

from . import blocks, check_array, cuda_kernel, empty_like, to_device
from .block_reduce import block_sum

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

THREADS = 128        # default threads per block (one block per row); a power of two
MAX_THREADS = 1024   # the shared partial-sum array's length (shared-array shapes must be constants)
ADD_THREADS = 256    # threads per block of the elementwise add of the unfused pair


def _check_threads(threads: int) -> int:
    if threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two in [1, {MAX_THREADS}], got {threads}")
    return threads


# ----------------------------------------------------------------------------- CUDA kernels

@cuda_kernel("void(float32[:, ::1], float32[::1], float32, float32[:, ::1])")
def rmsnorm_kernel(x, weight, eps, out):
    """out[m] (C,) = x[m] / sqrt(mean(x[m]^2) + eps) * weight. Grid M blocks, block nt threads."""
    part = cuda.shared.array(MAX_THREADS, float32)       # one partial sum of squares per thread
    m, i, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    C = x.shape[1]
    ss = float32(0.0)
    for k in range(i, C, nt):
        ss += x[m, k] * x[m, k]
    ss = block_sum(part, ss, i, nt)                      # nt -> nt/2 -> ... -> 1 partial sums
    scale = float32(1.0) / math.sqrt(ss / float32(C) + eps)
    for k in range(i, C, nt):
        out[m, k] = x[m, k] * scale * weight[k]


@cuda_kernel("void(float32[:, ::1], float32[:, ::1], float32[::1], float32, float32[:, ::1])")
def add_rmsnorm_kernel(x, residual, weight, eps, out):
    """residual[m] += x[m], then out[m] = rmsnorm(residual[m]) * weight, in one pass over memory.
    The same reduction as rmsnorm_kernel, so fused and unfused agree bit for bit."""
    part = cuda.shared.array(MAX_THREADS, float32)
    m, i, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    C = x.shape[1]
    ss = float32(0.0)
    for k in range(i, C, nt):
        r = residual[m, k] + x[m, k]
        residual[m, k] = r                               # the new residual stream, written once
        ss += r * r
    ss = block_sum(part, ss, i, nt)
    scale = float32(1.0) / math.sqrt(ss / float32(C) + eps)
    for k in range(i, C, nt):                            # this thread's own writes above: no sync needed
        out[m, k] = residual[m, k] * scale * weight[k]


@cuda_kernel("void(float32[:, ::1], float32[:, ::1])")
def add_kernel(x, residual):
    """residual (M, C) += x (M, C), one thread per element: the first half of the unfused pair."""
    j = cuda.grid(1)
    C = x.shape[1]
    if j < x.shape[0] * C:
        residual[j // C, j % C] += x[j // C, j % C]


def _check(x, weight, threads: int, residual=None):
    """Every launcher's guard: x (M, C), residual like x, weight (C,), all float32 and contiguous."""
    check_array("x", x, np.float32, 2)
    if residual is not None:
        check_array("residual", residual, np.float32, 2, tuple(x.shape))
    check_array("weight", weight, np.float32, 1, (x.shape[1],))
    _check_threads(threads)


def rmsnorm_cuda(x, weight, eps: float = 1e-5, threads: int = THREADS):
    """rmsnorm of each row of x (M, C) -> (M, C) float32 on the GPU (or the simulator)."""
    _check(x, weight, threads)
    out = empty_like(x, tuple(x.shape))                  # (M, C)
    if x.shape[0]:
        rmsnorm_kernel[x.shape[0], threads](to_device(x), to_device(weight), np.float32(eps), to_device(out))
    return out


def add_rmsnorm_cuda(x, residual, weight, eps: float = 1e-5, threads: int = THREADS):
    """Fused: residual (M, C) += x (M, C) in place, returns rmsnorm(residual) (M, C)."""
    _check(x, weight, threads, residual)
    out = empty_like(x, tuple(x.shape))                  # (M, C)
    if x.shape[0]:
        add_rmsnorm_kernel[x.shape[0], threads](to_device(x), to_device(residual), to_device(weight),
                                                np.float32(eps), to_device(out))
    return out


def add_then_rmsnorm_cuda(x, residual, weight, eps: float = 1e-5, threads: int = THREADS):
    """The unfused pair, two launches (the baseline the fused kernel is measured against)."""
    _check(x, weight, threads, residual)
    n = x.shape[0] * x.shape[1]
    if n:
        add_kernel[blocks(n, ADD_THREADS), ADD_THREADS](to_device(x), to_device(residual))
    return rmsnorm_cuda(residual, weight, eps, threads)


def bytes_moved(rows: int, dim: int, fused: bool) -> int:
    """Global-memory bytes (float32) read + written by the unfused pair or the fused kernel, counting
    compulsory traffic: each array crosses once per kernel; a block's second pass over its own row and
    the weight shared by all blocks come from cache.
        unfused: add reads x, residual, writes residual (3MC); rmsnorm reads residual, weight,
                 writes out (2MC + C)                              -> 5MC + C floats
        fused:   reads x, residual, weight, writes residual, out  -> 4MC + C floats"""
    mc = rows * dim
    return 4 * ((4 * mc if fused else 5 * mc) + dim)


# ----------------------------------------------------------------------------- CPU twins

@njit(fastmath=True, cache=True)
def _inv_rms(row, eps):
    """1 / sqrt(mean(row^2) + eps) for one row (C,): one loop, one summation order for every caller."""
    ss = np.float32(0.0)
    for k in range(row.shape[0]):
        ss += row[k] * row[k]
    return np.float32(1.0) / np.sqrt(ss / np.float32(row.shape[0]) + eps)


@njit(fastmath=True, cache=True)
def _rmsnorm_row(x, weight, e, out):
    scale = _inv_rms(x, e)
    for k in range(x.shape[0]):
        out[k] = x[k] * scale * weight[k]


@njit(fastmath=True, cache=True)
def _add_rmsnorm_row(x, residual, weight, e, out):
    for k in range(x.shape[0]):
        residual[k] += x[k]
    scale = _inv_rms(residual, e)
    for k in range(x.shape[0]):
        out[k] = residual[k] * scale * weight[k]


@njit(parallel=True, fastmath=True, cache=True)
def rmsnorm_rows(x, weight, eps, out):
    """out (M, C) = rmsnorm(x (M, C)) * weight (C,), in place, rows split across threads as run.c
    parallelizes its loops. Each row's sum of squares runs in one fixed order whatever M is, so a row's
    result does not depend on the rest of the batch, bit for bit."""
    e = np.float32(eps)
    if x.shape[0] == 1:                 # batch-1 decode: one row costs less than waking the threads
        _rmsnorm_row(x[0], weight, e, out[0])
        return
    for m in prange(x.shape[0]):
        _rmsnorm_row(x[m], weight, e, out[m])


@njit(parallel=True, fastmath=True, cache=True)
def add_rmsnorm_rows(x, residual, weight, eps, out):
    """residual (M, C) += x (M, C) in place, then out (M, C) = rmsnorm(residual) * weight (C,). On a CPU
    the row is in L1 cache after the add, so the fusion here is one parallel loop instead of two; the
    sum of squares is rmsnorm_rows's own, so fused and unfused agree bit for bit."""
    e = np.float32(eps)
    if x.shape[0] == 1:                 # batch-1 decode: one row costs less than waking the threads
        _add_rmsnorm_row(x[0], residual[0], weight, e, out[0])
        return
    for m in prange(x.shape[0]):
        _add_rmsnorm_row(x[m], residual[m], weight, e, out[m])


def rmsnorm_cpu(x, weight, eps: float = 1e-5):
    """rmsnorm of each row of x (M, C) -> new (M, C) numpy float32."""
    check_array("x", x, np.float32, 2)
    check_array("weight", weight, np.float32, 1, (x.shape[1],))
    out = np.empty(x.shape, np.float32)                  # (M, C)
    rmsnorm_rows(x, weight, eps, out)
    return out


def add_rmsnorm_cpu(x, residual, weight, eps: float = 1e-5):
    """residual (M, C) += x in place; returns rmsnorm(residual) as a new (M, C) numpy float32."""
    check_array("x", x, np.float32, 2)
    check_array("residual", residual, np.float32, 2, tuple(x.shape))
    check_array("weight", weight, np.float32, 1, (x.shape[1],))
    out = np.empty(x.shape, np.float32)                  # (M, C)
    add_rmsnorm_rows(x, residual, weight, eps, out)
    return out
