"""A block reduction: the nt threads of a CUDA block each hold one value, and each gets back their sum
(block_sum) or their max (block_max). Written once here; every kernel in this package that sums or maxes
per-thread partial results (the GEMVs, RMSNorm, three-pass softmax, paged attention) calls it. (The online
softmax kernel merges (max, sum) pairs, not single floats, with the same tree written out in softmax.py.)

How (Harris, "Optimizing Parallel Reduction in CUDA", 2007, the sequential-addressing version): every
thread writes its value to a shared array, then n partial results become ceil(n / 2) at each step: thread
t < floor(n / 2) combines entry t with entry t + ceil(n / 2), and the block waits (syncthreads) before the
next step reads what this one wrote. After ceil(log2 nt) steps entry 0 holds the result. The step count
comes from the thread count nt the caller passes (the problem's launch), never from gridDim; nt need not be
a power of two (an odd n leaves its middle entry for the next step). For a power of two this is the usual
`step = nt / 2, ..., 1` loop, the same additions in the same order. Each result is one fixed tree of
operations: it never depends on timing.

Every thread of the block must call these (syncthreads inside: a thread that skipped the call would leave
the others waiting forever), with the same nt, and `shared` must hold at least nt floats. They end with a
syncthreads after every thread has read the result, so the caller may reuse `shared` at once.
"""
from __future__ import annotations

import math

import numpy as np
from numba import float32

from . import check_array, cuda_device, cuda_kernel, empty_like, to_device

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

MAX_THREADS = 1024   # threads per block on every CUDA GPU, and the demo kernel's shared array length
SUM, MAX = 0, 1      # which combine a block reduction applies


# ----------------------------------------------------------------------------- device helpers

def _block_reduce(op: int, name: str, doc: str):
    """The device function that reduces `value` over the block with op (SUM or MAX): one tree for both,
    made twice (as matmul._make_tile makes its micro-kernels) so that a kernel calls it directly."""
    def reduce(shared, value, tid, nthreads):
        shared[tid] = value
        cuda.syncthreads()                      # every value written before any is read
        n = nthreads
        while n > 1:                            # n partial results -> ceil(n / 2)
            half = (n + 1) // 2
            if tid < n - half:
                a, b = shared[tid], shared[tid + half]
                shared[tid] = a + b if op == SUM else max(a, b)
            cuda.syncthreads()                  # every thread, every step: a sync inside the `if` would hang
            n = half
        total = shared[0]
        cuda.syncthreads()                      # all have read shared[0] before the caller reuses shared
        return total
    reduce.__name__ = reduce.__qualname__ = name
    reduce.__doc__ = doc
    return cuda_device(reduce)


block_sum = _block_reduce(SUM, "block_sum", """block_sum(shared, value, tid, nthreads): the sum of `value` over the
    nthreads threads of the block (thread index tid), returned to every thread.""")
block_max = _block_reduce(MAX, "block_max", """block_max(shared, value, tid, nthreads): the max of `value` over the
    nthreads threads of the block (thread index tid), returned to every thread.""")


# ----------------------------------------------------------------------------- a kernel that shows them

@cuda_kernel("void(float32[:, ::1], float32[::1], float32[::1])")
def row_sum_max(x, sums, maxes):
    """sums[m], maxes[m] = the sum and the max of row m of x (M, L). Grid M blocks of nt threads (any nt up to
    MAX_THREADS): thread t folds elements t, t + nt, ... (coalesced), then block_sum and block_max combine the
    nt partial results, one after the other in the same shared array."""
    part = cuda.shared.array(MAX_THREADS, float32)        # (MAX_THREADS,) one partial result per thread
    m, t, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    s, mx = float32(0.0), float32(-math.inf)
    for k in range(t, x.shape[1], nt):
        s += x[m, k]
        mx = max(mx, x[m, k])
    total = block_sum(part, s, t, nt)
    top = block_max(part, mx, t, nt)
    if t == 0:
        sums[m] = total
        maxes[m] = top


def row_sum_max_cuda(x, threads: int):
    """(sums (M,), maxes (M,)) of the rows of x (M, L) float32, each row reduced by one block of `threads`
    threads (1 to MAX_THREADS, not necessarily a power of two), on the GPU (or the simulator)."""
    check_array("x", x, np.float32, 2)
    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads must be in [1, {MAX_THREADS}], got {threads}")
    sums, maxes = empty_like(x, (x.shape[0],)), empty_like(x, (x.shape[0],))   # (M,), (M,)
    if x.shape[0]:
        row_sum_max[x.shape[0], threads](to_device(x), to_device(sums), to_device(maxes))
    return sums, maxes
