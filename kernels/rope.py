"""Rotary position embedding (RoPE; Su et al. 2021, RoFormer) in llama2.c's pair layout: within every
head, the pair (x[2j], x[2j+1]) is rotated by the angle pos * freq_j,

    x[2j]   <- x[2j] cos - x[2j+1] sin
    x[2j+1] <- x[2j] sin + x[2j+1] cos,

with cos, sin read from tables (S, D/2) precomputed once (minillm.llama.transformer.rope_tables, cast to
float32), as run.c does per token and vLLM's `rotary_embedding` kernel does from its cos_sin_cache.
HF checkpoints use the other layout (pairs (j, j + D/2), "rotate_half"); the loaders permute wq/wk
so that this one layout serves both.

Why a kernel of its own: each pair needs only its token's position, so RoPE is embarrassingly parallel
(one GPU thread per pair) and memory-bound; production engines fuse it into the QKV projection or the
attention kernel, which is the next step after this one.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import blocks, check_array, cuda_kernel, empty_like, to_device

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

THREADS = 128   # threads per block, one thread per rotated pair


# ----------------------------------------------------------------------------- CUDA kernel

@cuda_kernel("void(float32[:, :, ::1], int64[::1], float32[:, ::1], float32[:, ::1], float32[:, :, ::1])")
def rope_kernel(x, positions, cos, sin, out):
    """out (M, H, D) = x rotated pairwise; thread t owns pair j of head h of row m, t = (m*H + h)*D/2 + j.
    Neighbouring threads own neighbouring pairs of a head: their reads of x are coalesced, and all of
    a row's heads share one row of the tables (cached). out may be x itself (each thread reads its pair
    before writing it)."""
    t = cuda.grid(1)
    M, H, D = x.shape
    half = D // 2
    if t < M * H * half:
        j = t % half
        h = (t // half) % H
        m = t // (half * H)
        p = positions[m]
        c, s = cos[p, j], sin[p, j]
        x0, x1 = x[m, h, 2 * j], x[m, h, 2 * j + 1]
        out[m, h, 2 * j] = x0 * c - x1 * s
        out[m, h, 2 * j + 1] = x0 * s + x1 * c


def _host(a) -> np.ndarray:
    """A host copy of a small index array (positions), whichever side it lives on."""
    if type(a).__module__.startswith("torch"):
        return a.detach().cpu().numpy()
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    return np.asarray(a)


def _check(x, positions, cos, sin):
    """The guard shared by both wrappers: shapes agree and every position has a row in the tables."""
    check_array("x", x, np.float32, 3)
    M, H, D = x.shape
    if D % 2:
        raise ValueError(f"x has head dim D={D}: RoPE rotates pairs, D must be even")
    check_array("positions", positions, np.int64, 1, (M,))
    check_array("cos", cos, np.float32, 2, (None, D // 2))
    S = cos.shape[0]
    check_array("sin", sin, np.float32, 2, (S, D // 2))
    p = _host(positions)
    bad = np.flatnonzero((p < 0) | (p >= S))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"positions[{i}] = {int(p[i])} is outside the RoPE tables: positions must be in [0, {S}) "
                         f"(the tables' max_seq_len is {S})")


def rope_cuda(x, positions, cos, sin):
    """x (M, H, D) rotated at positions (M,) -> new (M, H, D) float32 on the GPU (or the simulator)."""
    _check(x, positions, cos, sin)
    M, H, D = x.shape
    out = empty_like(x, (M, H, D))                                   # (M, H, D)
    n = M * H * (D // 2)                                             # pairs to rotate
    if n:
        rope_kernel[blocks(n, THREADS), THREADS](to_device(x), to_device(positions), to_device(cos),
                                                 to_device(sin), to_device(out))
    return out


# ----------------------------------------------------------------------------- CPU twin

@njit(parallel=True, fastmath=True, cache=True)
def rope_rows(x, positions, cos, sin):
    """Rotate x (M, H, D) in place, row m at positions[m] (M,), from cos, sin (S, D/2): run.c's loop
    over the pairs of q and k. Every output is two products and a sum of its own pair: nothing depends
    on the other rows."""
    if x.shape[0] == 1:                 # batch-1 decode: one row costs less than waking the threads
        _rope_row(x[0], positions[0], cos, sin)
        return
    for m in prange(x.shape[0]):
        _rope_row(x[m], positions[m], cos, sin)


@njit(fastmath=True, cache=True)
def _rope_row(x, p, cos, sin):
    """x (H, D) in place at position p."""
    H, D = x.shape
    for h in range(H):
        for j in range(D // 2):
            c, s = cos[p, j], sin[p, j]
            x0, x1 = x[h, 2 * j], x[h, 2 * j + 1]
            x[h, 2 * j] = x0 * c - x1 * s
            x[h, 2 * j + 1] = x0 * s + x1 * c


def rope_cpu(x, positions, cos, sin):
    """x (M, H, D) rotated at positions (M,) -> new (M, H, D) numpy float32 (x is left as it was)."""
    _check(x, positions, cos, sin)
    out = x.copy()                                                   # (M, H, D)
    rope_rows(out, positions, cos, sin)
    return out
