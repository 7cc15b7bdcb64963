"""Matrix multiply in a linear layer's layout, y = x W^T with W stored (N, K) as llama2.c and
torch.nn.Linear store it: a tiled matmul with shared memory (prefill: many rows of x) and a GEMV
(decode: one row), each on the GPU and as a CPU twin.

Why tiles (Kirk & Hwu, "Programming Massively Parallel Processors", ch. 5): in the naive kernel every
thread reads a whole row of x and a whole row of W from global memory, so each element is read N (or
M) times. A block of TILE x TILE threads instead copies one TILE x TILE tile of x and one of W into
shared memory, waits (syncthreads), and every thread reuses those 2*TILE values TILE times: global
reads drop by a factor of TILE.
"""
from __future__ import annotations

import numpy as np
from numba import float32, njit, prange

from . import blocks, check_array, cuda_kernel, empty_like, to_device

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

TILE = 16            # threads per tile side: TILE*TILE = 256 threads per block
TILE_PAD = TILE + 1  # a shared tile's row length, one spare column (shared-array shapes must be constants)
GEMV_THREADS = 32    # threads cooperating on one output row of a GEMV (one warp)


# ----------------------------------------------------------------------------- CUDA kernels

@cuda_kernel("void(float32[:, ::1], float32[:, ::1], float32[:, ::1])")
def matmul_tiled(x, w, y):
    """y (M, N) = x (M, K) @ w (N, K)^T. Grid (ceil(N/TILE), ceil(M/TILE)), block (TILE, TILE):
    thread (ty, tx) of block (bx, by) owns y[by*TILE + ty, bx*TILE + tx]."""
    xs = cuda.shared.array((TILE, TILE), float32)        # x tile: rows m, columns k
    ws = cuda.shared.array((TILE, TILE_PAD), float32)    # W tile: rows n, columns k (+1 column: no bank conflicts)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    m0, n0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    M, K = x.shape
    N = w.shape[0]
    acc = float32(0.0)
    for t in range((K + TILE - 1) // TILE):               # tile count from the problem size
        k = t * TILE + tx                                 # neighbouring threads read neighbouring k: coalesced
        xs[ty, tx] = x[m0 + ty, k] if m0 + ty < M and k < K else float32(0.0)
        ws[ty, tx] = w[n0 + ty, k] if n0 + ty < N and k < K else float32(0.0)
        cuda.syncthreads()                                # the tiles are complete before anyone reads them
        for j in range(TILE):
            acc += xs[ty, j] * ws[tx, j]
        cuda.syncthreads()                                # everyone is done before the next tile overwrites
    if m0 + ty < M and n0 + tx < N:
        y[m0 + ty, n0 + tx] = acc


@cuda_kernel("void(float32[:, ::1], float32[::1], float32[::1])")
def gemv(w, x, y):
    """y (N,) = w (N, K) @ x (K,). One block of GEMV_THREADS threads per output row: thread i sums
    k = i, i + 32, ... (neighbouring threads read neighbouring k: coalesced), then a tree reduction in
    shared memory adds the 32 partial sums."""
    part = cuda.shared.array(GEMV_THREADS, float32)
    n, i = cuda.blockIdx.x, cuda.threadIdx.x
    K = w.shape[1]
    acc = float32(0.0)
    if n < w.shape[0]:
        for k in range(i, K, GEMV_THREADS):
            acc += w[n, k] * x[k]
    part[i] = acc
    cuda.syncthreads()
    step = GEMV_THREADS // 2
    while step > 0:                                       # 32 -> 16 -> ... -> 1 partial sums
        if i < step:
            part[i] += part[i + step]
        cuda.syncthreads()
        step //= 2
    if i == 0 and n < w.shape[0]:
        y[n] = part[0]


def matmul_cuda(x, w):
    """x (M, K) @ w (N, K)^T -> (M, N) float32 on the GPU (or the simulator)."""
    check_array("x", x, np.float32, 2)
    check_array("w", w, np.float32, 2, (None, x.shape[1]))
    M, N = x.shape[0], w.shape[0]
    y = empty_like(x, (M, N))
    if M and N:
        matmul_tiled[(blocks(N, TILE), blocks(M, TILE)), (TILE, TILE)](to_device(x), to_device(w), to_device(y))
    return y


def gemv_cuda(w, x):
    """w (N, K) @ x (K,) -> (N,) float32 on the GPU (or the simulator)."""
    check_array("w", w, np.float32, 2)
    check_array("x", x, np.float32, 1, (w.shape[1],))
    y = empty_like(x, (w.shape[0],))
    if w.shape[0]:                       # a grid of zero blocks is an invalid launch on a GPU
        gemv[w.shape[0], GEMV_THREADS](to_device(w), to_device(x), to_device(y))
    return y


# ----------------------------------------------------------------------------- CPU twins

NR = 8       # CPU twin: output columns per tile (8 accumulators, one AVX2 register each once vectorised over k)
KC = 512     # CPU twin: inputs per pass; the tile's 8 weight rows (NR x KC floats, 16 KiB) stay in L1 for all M rows


@njit(parallel=True, fastmath=True, cache=True)
def linear_cpu(x, w, y):
    """y (M, N) = x (M, K) @ w (N, K)^T, in place: a blocked matmul. Tiles of NR output columns are split
    across threads (as run.c's `#pragma omp parallel for` over its matmul's rows); a tile's NR weight rows
    are read from memory once, KC inputs at a time, and used for every row of x while they sit in L1, so a
    batch of M rows (batched decode, the 1 + k tokens of speculative verification) costs little more than
    one. Each y[m, n] is summed in one fixed order (the k loop below, then the KC chunks in order),
    whatever M is, so a row's result does not depend on what else is in the batch, bit for bit.

    The inner loop is written out, NR named accumulators: each x value is loaded once for NR multiply-adds and
    LLVM vectorises the k loop (NR accumulators of 8 or 16 lanes); the indices are unsigned, since numba tests a
    signed index for wrap-around (x[-1]) and that test slows the loop. Keep it in this function's body: moved into
    a helper returning a tuple (even inline="always"), numba 0.68 compiles it 3-8x slower (`bench batched`
    reports the fraction of torch's matmul FLOP/s that shows it)."""
    M, K = x.shape
    N = w.shape[0]
    for t in prange((N + NR - 1) // NR):
        n0 = t * NR
        if n0 + NR <= N:
            w0, w1, w2, w3 = w[n0], w[n0 + 1], w[n0 + 2], w[n0 + 3]          # the tile's NR weight rows (K,)
            w4, w5, w6, w7 = w[n0 + 4], w[n0 + 5], w[n0 + 6], w[n0 + 7]
            for k0 in range(0, K, KC):
                o, nk = np.uint64(k0), np.uint64(min(KC, K - k0))   # unsigned: no wrap-around test on x[k]
                for m in range(M):
                    xr = x[m]
                    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
                    for i in range(nk):
                        k = o + i
                        xv = xr[k]
                        a0 += xv * w0[k]
                        a1 += xv * w1[k]
                        a2 += xv * w2[k]
                        a3 += xv * w3[k]
                        a4 += xv * w4[k]
                        a5 += xv * w5[k]
                        a6 += xv * w6[k]
                        a7 += xv * w7[k]
                    if k0 == 0:          # the first chunk's sums, then each later chunk's added in order
                        y[m, n0], y[m, n0 + 1], y[m, n0 + 2], y[m, n0 + 3] = a0, a1, a2, a3
                        y[m, n0 + 4], y[m, n0 + 5], y[m, n0 + 6], y[m, n0 + 7] = a4, a5, a6, a7
                    else:
                        y[m, n0] += a0
                        y[m, n0 + 1] += a1
                        y[m, n0 + 2] += a2
                        y[m, n0 + 3] += a3
                        y[m, n0 + 4] += a4
                        y[m, n0 + 5] += a5
                        y[m, n0 + 6] += a6
                        y[m, n0 + 7] += a7
        else:                             # the last N % NR columns: one at a time (the same columns at every M)
            for n in range(n0, N):
                for m in range(M):
                    acc = np.float32(0.0)
                    for k in range(K):
                        acc += x[m, k] * w[n, k]
                    y[m, n] = acc


def matmul_cpu(x, w):
    """x (M, K) @ w (N, K)^T -> (M, N), numpy float32 in and out."""
    check_array("x", x, np.float32, 2)
    check_array("w", w, np.float32, 2, (None, x.shape[1]))
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    linear_cpu(x, w, y)
    return y


def gemv_cpu(w, x):
    """w (N, K) @ x (K,) -> (N,): the M = 1 case of linear_cpu (the same sums, bit for bit)."""
    check_array("w", w, np.float32, 2)
    check_array("x", x, np.float32, 1, (w.shape[1],))
    return matmul_cpu(x[None, :], w)[0]
