"""The pieces every quantized row matmul of the CPU fast path shares (kernels/quant_rows.py lists the weight
types): a tile of NR weight rows dequantized once into a float32 buffer and multiplied by every row of x, the
exact int32 dot products of Q8_0 and W8A8, and the host-side argument checks.

Why tiles: batch-1 decode reads every weight once per token for one multiply-add, so its time is the weight
bytes over memory bandwidth; int8 is 1/4 and int4 about 1/7 of float32's bytes. That pays only if unpacking
costs less than the bytes it saves, so every inner loop here is one that runs vectorised (AVX2: 8 floats at a
time):
- the weights of a tile of NR output rows are dequantized ONCE per call into a small float32 buffer, and the
  dot products then take it KC inputs at a time (16 KiB, L1-resident) for every input row, so a batch of M
  rows (batched decode, speculative verification, prefill chunks) reads each weight byte from memory once;
- numba computes int8 * int8 and nibble arithmetic in int64, which AVX2 can neither convert to float nor
  multiply at full rate: every integer expression is truncated to int32 explicitly;
- indices the compiler cannot prove non-negative carry numba's wrap-around test (x[-1]) and keep a loop
  scalar: the loops index 1-D views from 0, or with unsigned offsets.
Batch invariance: every y[m, n] is computed by the same compiled loops in one fixed order (k in the micro-
kernel's order, KC chunks in order, groups in order) whatever M is and wherever row m sits; a last tile with
fewer than NR rows is padded with zero rows rather than taking another code path.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import check_array

NR = 8        # weight rows per tile: 8 accumulators, one AVX2 register each once the k loop is vectorised
KC = 512      # inputs per pass of the dot products: NR x KC dequantized floats (16 KiB) stay in L1 for all M rows


# ----------------------------------------------------------------------------- a float32 tile times every row of x

@njit(fastmath=True, cache=True, inline="always")
def _tile_dots(xr, wb, k0, nk, acc, m):
    """acc[m, :NR] += xr[k0:k0+nk] . wb[r, k0:k0+nk] for the NR rows r of a dequantized tile: one pass over k,
    each x value loaded once for NR multiply-adds. The same compiled loop for every row m, whatever M is. The
    indices are unsigned: numba tests a signed index that LLVM cannot prove non-negative for wrap-around
    (x[-1]), and that test kept this loop scalar."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    o = np.uint64(k0)
    for k in range(np.uint64(nk)):
        xv = xr[o + k]
        a0 += xv * wb[0, o + k]
        a1 += xv * wb[1, o + k]
        a2 += xv * wb[2, o + k]
        a3 += xv * wb[3, o + k]
        a4 += xv * wb[4, o + k]
        a5 += xv * wb[5, o + k]
        a6 += xv * wb[6, o + k]
        a7 += xv * wb[7, o + k]
    acc[m, 0] += a0
    acc[m, 1] += a1
    acc[m, 2] += a2
    acc[m, 3] += a3
    acc[m, 4] += a4
    acc[m, 5] += a5
    acc[m, 6] += a6
    acc[m, 7] += a7


@njit(fastmath=True, cache=True, inline="always")
def _rows_times_tile(x, wb, acc):
    """acc (M, NR) = x (M, K) @ wb (NR, K)^T: KC inputs at a time, all M rows per chunk (the chunk of the tile
    stays in L1 while every row uses it); each acc[m, r] summed in one fixed order, chunk by chunk."""
    M, K = x.shape
    acc[:] = 0.0
    for k0 in range(0, K, KC):
        for m in range(M):
            _tile_dots(x[m], wb, k0, min(KC, K - k0), acc, m)


@njit(cache=True, inline="always")
def _tile_buffer(nr, K):
    """The (NR, K) float32 buffer a tile is dequantized into; rows past the last weight row (nr < NR, the last
    tile only) are zeros, so the last tile runs the same code as the others."""
    wb = np.empty((NR, K), np.float32)                               # (NR, K)
    for r in range(nr, NR):
        wb[r, :] = 0.0
    return wb


# ----------------------------------------------------------------------------- integer dot products (Q8_0, W8A8)

@njit(cache=True, inline="always")
def _idots(xq, w0, w1, w2, w3, w4, w5, w6, w7, out):
    """out[r] = sum_k xq[k] * w_r[k] for NR int8 rows (1-D views of equal length), exactly, in int32: one
    pass over k with xq loaded once. The products and sums are truncated to int32 explicitly (numba would
    widen them to int64, which AVX2 multiplies and adds at half the rate). Exact, so the order is moot."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.int32(0)
    for k in range(xq.shape[0]):
        xv = np.int32(xq[k])
        a0 = np.int32(a0 + xv * np.int32(w0[k]))
        a1 = np.int32(a1 + xv * np.int32(w1[k]))
        a2 = np.int32(a2 + xv * np.int32(w2[k]))
        a3 = np.int32(a3 + xv * np.int32(w3[k]))
        a4 = np.int32(a4 + xv * np.int32(w4[k]))
        a5 = np.int32(a5 + xv * np.int32(w5[k]))
        a6 = np.int32(a6 + xv * np.int32(w6[k]))
        a7 = np.int32(a7 + xv * np.int32(w7[k]))
    out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7] = a0, a1, a2, a3, a4, a5, a6, a7


@njit(cache=True, inline="always")
def _tile_rows(N, n0):
    """The NR weight row indices of the tile at n0; rows past N repeat row N - 1 (their results are dropped),
    so every tile runs the same code."""
    r = np.empty(NR, np.int64)                                       # (NR,)
    for i in range(NR):
        r[i] = min(n0 + i, N - 1)
    return r


# ----------------------------------------------------------------------------- numpy in, numpy out (checked)

def _numpy(a):
    """A torch CPU tensor as a numpy view (the kernels take numpy arrays); numpy arrays pass as they are."""
    return a.detach().numpy() if type(a).__module__.startswith("torch") else a


def _rows(x):
    """x (K,) or (M, K) float32 -> the (M, K) view the kernels take, and whether to drop the M axis after."""
    x = _numpy(x)
    if len(getattr(x, "shape", ())) == 1:
        check_array("x", x, np.float32, 1)
        return x.reshape(1, -1), True                                # (1, K)
    return check_array("x", x, np.float32, 2), False


def _groups(name: str, K: int, n_groups: int) -> int:
    """The group size K / n_groups, or a ValueError naming the scales array and both numbers."""
    if n_groups < 1 or K % n_groups:
        raise ValueError(f"{name} has {n_groups} groups per row, which must divide K = {K}")
    return K // n_groups
