"""Row softmax, out[m] = exp(x[m] - max x[m]) / sum exp(x[m] - max x[m]), two ways.

1. Three passes ("safe softmax"): a max reduction, a sum-of-exp reduction, a normalize pass. Subtracting
   the max keeps exp from overflowing; the price is reading x three times.
2. Online softmax (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"): one pass
   keeps a running max m and a running sum d of exp(x - m); when a new element raises the max, the sum
   so far is rescaled by exp(m_old - m_new). Two partial (m, d) pairs merge the same way, so threads
   (and blocks, and FlashAttention's key tiles) can each summarize a part of the row and combine. Then a
   normalize pass: two reads of x instead of three. This recurrence is the heart of FlashAttention.

GPU layout: one block per row, each thread striding over the row (coalesced), partial results combined
by tree reductions in shared memory.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import float32, njit, prange, types
from numba.extending import intrinsic

from . import check_array, cuda_kernel, empty_like, to_device
from .block_reduce import block_max, block_sum

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

THREADS = 128        # default threads per block (one block per row); a power of two
MAX_THREADS = 1024   # shared arrays' length (shared-array shapes must be constants)
LANES = 8            # independent running (max, sum) pairs per row in the CPU twin


# ----------------------------------------------------------------------------- CUDA kernels

@cuda_kernel("void(float32[:, ::1], float32[:, ::1])")
def softmax_kernel(x, out):
    """Three passes over row m = blockIdx.x of x (M, N): max, sum of exp, normalize."""
    red = cuda.shared.array(MAX_THREADS, float32)
    m, i, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    N = x.shape[1]
    mx = float32(-math.inf)
    for k in range(i, N, nt):                            # pass 1: this thread's max
        mx = max(mx, x[m, k])
    mx = block_max(red, mx, i, nt)                       # tree max: nt -> 1
    d = float32(0.0)
    for k in range(i, N, nt):                            # pass 2: this thread's sum of exp
        d += math.exp(x[m, k] - mx)
    d = block_sum(red, d, i, nt)                         # tree sum: nt -> 1
    for k in range(i, N, nt):                            # pass 3: normalize
        out[m, k] = math.exp(x[m, k] - mx) / d


@cuda_kernel("void(float32[:, ::1], float32[:, ::1])")
def online_softmax_kernel(x, out):
    """Online softmax of row m = blockIdx.x: each thread runs the (m, d) recurrence over its elements,
    a tree merges the nt pairs, then one normalize pass."""
    ms = cuda.shared.array(MAX_THREADS, float32)         # running max per thread
    ds = cuda.shared.array(MAX_THREADS, float32)         # running sum of exp(x - max) per thread
    m, i, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    N = x.shape[1]
    mx, d = float32(-math.inf), float32(0.0)
    for k in range(i, N, nt):                            # one read of x: the running (max, sum)
        v = x[m, k]
        if v > mx:
            d = d * math.exp(mx - v) + float32(1.0)      # rescale the old sum to the new max
            mx = v
        elif v > -math.inf:                              # a masked -inf adds 0 (exp(-inf - -inf) would be nan)
            d += math.exp(v - mx)
    ms[i], ds[i] = mx, d
    cuda.syncthreads()
    step = nt // 2                                       # block_reduce's tree, on pairs: (m, d) is not one float
    while step > 0:                                      # merge pairs: (m1, d1) + (m2, d2)
        if i < step:
            m1, d1, m2, d2 = ms[i], ds[i], ms[i + step], ds[i + step]
            mn = max(m1, m2)
            d1 = d1 * math.exp(m1 - mn) if d1 > 0 else d1    # an empty part (d = 0, m = -inf) adds 0, not nan
            d2 = d2 * math.exp(m2 - mn) if d2 > 0 else d2
            ms[i], ds[i] = mn, d1 + d2
        cuda.syncthreads()
        step //= 2
    mx, d = ms[0], ds[0]
    for k in range(i, N, nt):                            # second read of x: normalize
        out[m, k] = math.exp(x[m, k] - mx) / d


def _launch(kernel, x, threads):
    check_array("x", x, np.float32, 2)
    if threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two in [1, {MAX_THREADS}], got {threads}")
    out = empty_like(x, tuple(x.shape))                  # (M, N)
    if x.shape[0]:
        kernel[x.shape[0], threads](to_device(x), to_device(out))
    return out


def softmax_cuda(x, threads: int = THREADS):
    """Softmax of each row of x (M, N) -> (M, N) float32, three-pass kernel, on the GPU (or simulator)."""
    return _launch(softmax_kernel, x, threads)


def online_softmax_cuda(x, threads: int = THREADS):
    """Softmax of each row of x (M, N) -> (M, N) float32, online kernel, on the GPU (or simulator)."""
    return _launch(online_softmax_kernel, x, threads)


# ----------------------------------------------------------------------------- CPU twins

@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 `bits` (C's memcpy pun; LLVM's bitcast, which vectorises)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _bits_of_float32(typingctx, x):
    """The int32 holding the IEEE bits of the float32 x."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


EXP32_HI = np.float32(88.72283)     # exp32 is inf above: exp(88.72284) overflows float32
EXP32_LO = np.float32(-86.99)       # and 0 below: from here on 2^n times exp(r) would leave the normal range


@njit(fastmath={"nnan", "ninf", "nsz", "arcp", "contract", "afn"}, cache=True)   # all but reassoc (see below)
def exp32(x):
    """exp(x) for a float32 x, in plain float32 arithmetic so that a loop over it vectorises (numba's np.exp
    calls libm's expf once per element: 4 ns, the largest cost of SwiGLU and attention on 32 rows). Cephes'
    expf: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n ln2 is exact), exp(r) by a degree-6
    polynomial, then n added to its exponent bits (ldexp: exact, and no 2^n that could overflow on its own).
    Within 2 ulp of exp (tests/test_kernels_softmax.py); inf above EXP32_HI, 0 below EXP32_LO (no values near
    float32's smallest normal, 1.2e-38); exp(-inf) = 0; a NaN gives 0 (its callers' fastmath assumes none).
    Compiled without fastmath's reassociation, which would fold the two parts of n ln2 into one and lose the
    reduction's precision (4.6 ulp); LLVM inlines it into the caller's loop as it is."""
    c = min(max(x, EXP32_LO), EXP32_HI)
    n = np.floor(c * np.float32(1.44269504088896341) + np.float32(0.5))     # round(x / ln2)
    r = c - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)  # x - n ln2, ln2 in two parts
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    e = p * r * r + r + np.float32(1.0)                                    # exp(r), in [0.70, 1.42]
    v = _float32_from_bits(_bits_of_float32(e) + (np.int32(n) << 23))      # exp(r) 2^n
    if x > EXP32_HI:
        return np.float32(np.inf)
    return v if x >= EXP32_LO else np.float32(0.0)


@njit(parallel=True, fastmath=True, cache=True)
def softmax_rows(x, out):
    """out (M, N) = softmax of each row of x (M, N), three passes, rows across threads (run.c's
    softmax). Each row is summed in one fixed order: its result does not depend on the batch."""
    M, N = x.shape
    for m in prange(M):
        mx = np.float32(-np.inf)
        for k in range(N):
            mx = max(mx, x[m, k])
        d = np.float32(0.0)
        for k in range(N):
            d += np.exp(x[m, k] - mx)
        for k in range(N):
            out[m, k] = np.exp(x[m, k] - mx) / d


@njit(parallel=True, cache=True)   # no fastmath: it may assume no infinities, and masked rows hold -inf
def online_softmax_rows(x, out):
    """out (M, N) = softmax of each row of x (M, N): one pass for the running (max, sum), then normalize.
    Element k goes to lane k % LANES, each lane a running (m, d) as a GPU thread keeps; the lanes merge
    at the end as the kernel's tree does. One lane would be the paper's loop verbatim, but a float32 sum
    of 32000 terms in one chain loses ~4e-5 relative; eight chains of N/8 lose a fraction of that."""
    M, N = x.shape
    for m in prange(M):
        ms = np.full(LANES, -np.inf, dtype=np.float32)   # (LANES,) running max per lane
        ds = np.zeros(LANES, dtype=np.float32)           # (LANES,) running sum of exp(x - max) per lane
        for k in range(N):
            v, j = x[m, k], k % LANES
            if v > ms[j]:
                ds[j] = ds[j] * np.exp(ms[j] - v) + np.float32(1.0)   # rescale the old sum to the new max
                ms[j] = v
            elif v > -np.inf:                                         # a masked -inf adds 0, not nan
                ds[j] += np.exp(v - ms[j])
        mx = ms.max()
        d = np.float32(0.0)
        for j in range(LANES):                           # merge: each lane's sum rescaled to the row max
            if ds[j] > 0:
                d += ds[j] * np.exp(ms[j] - mx)
        for k in range(N):
            out[m, k] = np.exp(x[m, k] - mx) / d


def softmax_cpu(x):
    """Softmax of each row of x (M, N) -> new (M, N) numpy float32 (three passes)."""
    check_array("x", x, np.float32, 2)
    out = np.empty(x.shape, np.float32)                  # (M, N)
    softmax_rows(x, out)
    return out


def online_softmax_cpu(x):
    """Softmax of each row of x (M, N) -> new (M, N) numpy float32 (online)."""
    check_array("x", x, np.float32, 2)
    out = np.empty(x.shape, np.float32)                  # (M, N)
    online_softmax_rows(x, out)
    return out


def online_softmax_steps(x) -> list[tuple[int, float, float]]:
    """(i, m, d) after each element i of a 1-D x: the running max and the running sum of exp(x - m),
    in float64, for a notebook to show the rescaling step by step (Milakov & Gimelshein, Algorithm 3)."""
    steps, m, d = [], -math.inf, 0.0
    for i, v in enumerate(np.asarray(x, dtype=np.float64).ravel()):
        if v > -math.inf:                # a masked -inf changes nothing (and -inf - -inf would be nan)
            m_new = max(m, float(v))
            d = d * math.exp(m - m_new) + math.exp(float(v) - m_new)   # exp(-inf) = 0 on the first step
            m = m_new
        steps.append((i, m, d))
    return steps
