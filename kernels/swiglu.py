"""SwiGLU activation, out = silu(gate) * up with silu(g) = g * sigmoid(g) = g / (1 + exp(-g))
(Shazeer 2020, "GLU Variants Improve Transformer"): the middle of Llama's feed-forward,
w2(silu(w1 x) * w3 x), as llama2.c's run.c computes it in one loop over the hidden dim.

Why fuse: written as two kernels, silu(gate) goes to a temporary in global memory and the multiply
reads it back, 5 floats moved per element; fused, each thread reads gate and up and writes out, 3
floats (`bytes_moved` counts them). The arithmetic is a few flops per element either way, so the time
is the bytes (vLLM's `silu_and_mul` kernel fuses it the same way).
"""
from __future__ import annotations

import math

import numpy as np
from numba import float32, njit, prange

from . import blocks, check_array, cuda_kernel, empty_like, to_device
from .softmax import exp32

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

THREADS = 256   # threads per block, one thread per element


# ----------------------------------------------------------------------------- CUDA kernels

@cuda_kernel("void(float32[:, ::1], float32[:, ::1], float32[:, ::1])")
def swiglu_kernel(gate, up, out):
    """out (M, F) = silu(gate) * up; thread t owns element (t // F, t % F): neighbouring threads,
    neighbouring addresses (coalesced)."""
    t = cuda.grid(1)
    M, F = gate.shape
    if t < M * F:
        m, f = t // F, t % F
        g = gate[m, f]
        out[m, f] = g / (float32(1.0) + math.exp(-g)) * up[m, f]


@cuda_kernel("void(float32[:, ::1], float32[:, ::1])")
def silu_kernel(gate, tmp):
    """tmp (M, F) = silu(gate): the first kernel of the unfused pair."""
    t = cuda.grid(1)
    M, F = gate.shape
    if t < M * F:
        m, f = t // F, t % F
        g = gate[m, f]
        tmp[m, f] = g / (float32(1.0) + math.exp(-g))


@cuda_kernel("void(float32[:, ::1], float32[:, ::1], float32[:, ::1])")
def mul_kernel(tmp, up, out):
    """out (M, F) = tmp * up: the second kernel of the unfused pair."""
    t = cuda.grid(1)
    M, F = tmp.shape
    if t < M * F:
        m, f = t // F, t % F
        out[m, f] = tmp[m, f] * up[m, f]


def _check(gate, up):
    check_array("gate", gate, np.float32, 2)
    check_array("up", up, np.float32, 2, tuple(gate.shape))


def swiglu_cuda(gate, up):
    """silu(gate (M, F)) * up (M, F) -> (M, F) float32, one fused kernel, on the GPU (or simulator)."""
    _check(gate, up)
    out = empty_like(gate, tuple(gate.shape))            # (M, F)
    n = gate.shape[0] * gate.shape[1]
    if n:
        swiglu_kernel[blocks(n, THREADS), THREADS](to_device(gate), to_device(up), to_device(out))
    return out


def swiglu_unfused_cuda(gate, up):
    """The same result from two kernels through a temporary: the baseline the fused kernel is measured
    against (same operations in the same order, so the same bits)."""
    _check(gate, up)
    tmp = empty_like(gate, tuple(gate.shape))            # (M, F) silu(gate), a round trip through memory
    out = empty_like(gate, tuple(gate.shape))            # (M, F)
    n = gate.shape[0] * gate.shape[1]
    if n:
        silu_kernel[blocks(n, THREADS), THREADS](to_device(gate), to_device(tmp))
        mul_kernel[blocks(n, THREADS), THREADS](to_device(tmp), to_device(up), to_device(out))
    return out


def bytes_moved(rows: int, hidden: int, fused: bool) -> int:
    """Global-memory bytes (float32) read + written for rows x hidden elements:
        unfused: silu reads gate, writes tmp; mul reads tmp, up, writes out -> 5 floats per element
        fused:   reads gate, up, writes out                              -> 3 floats per element"""
    return 4 * rows * hidden * (3 if fused else 5)


# ----------------------------------------------------------------------------- CPU twin

@njit(fastmath={"nnan", "ninf", "nsz", "contract"}, inline="always", cache=True)   # see swiglu_rows
def _swiglu_row(g_row, u_row, o_row):
    """o_row (F,) = silu(g_row) * u_row. Inlined into its caller (numba's IR, inline="always"): there numba
    vectorises this loop, exp32 included (8x faster than np.exp's libm calls); called as a function it ran
    scalar, 5x slower on 32 rows of 768. In place (o_row is g_row) LLVM runs its scalar copy of the loop
    instead; exact division keeps both copies' bits equal."""
    for f in range(np.uint64(g_row.shape[0])):       # unsigned: no wrap-around test, so the loop vectorises
        g = g_row[f]
        o_row[f] = g / (np.float32(1.0) + exp32(-g)) * u_row[f]


@njit(parallel=True, fastmath={"nnan", "ninf", "nsz", "contract"}, cache=True)   # no approximate division:
def swiglu_rows(gate, up, out):
    """out (M, F) = silu(gate (M, F)) * up (M, F), in place (out may be gate), rows across threads.
    Elementwise: no element depends on any other, so nothing depends on the batch. One row goes through the
    parallel loop too: numba vectorises the loop there and not in a plain function (2.7 us for a row of 768
    run serially, 1.5 us as a one-iteration parallel loop, thread wake-up included)."""
    for m in prange(gate.shape[0]):
        _swiglu_row(gate[m], up[m], out[m])


SPAN = 256   # elements per task of swiglu_packed_rows: a row of 768 keeps 2 threads busy at batch 1


@njit(parallel=True, fastmath={"nnan", "ninf", "nsz", "contract"}, cache=True)
def swiglu_packed_rows(h, out):
    """out (M, F) = silu(h[:, :F]) * h[:, F:] for h (M, 2F), the fused w1|w3 matmul's output (gate | up side by
    side), without copying the halves apart: a strided view of each half does not vectorise, and copying them
    cost more than the SwiGLU (25 us against 6.5 at 32 rows of 768). Tasks are spans of SPAN elements of a
    row; the same arithmetic as swiglu_rows, element by element, so the two agree bit for bit."""
    M, F = out.shape
    per = (F + SPAN - 1) // SPAN
    for t in prange(M * per):
        m, c = t // per, t % per
        f0, f1 = c * SPAN, min(c * SPAN + SPAN, F)
        row, o = h[m], out[m]
        _swiglu_row(row[f0:f1], row[F + f0:F + f1], o[f0:f1])


def swiglu_cpu(gate, up):
    """silu(gate (M, F)) * up (M, F) -> new (M, F) numpy float32."""
    _check(gate, up)
    out = np.empty(gate.shape, np.float32)               # (M, F)
    swiglu_rows(gate, up, out)
    return out
