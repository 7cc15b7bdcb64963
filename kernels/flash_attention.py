"""FlashAttention forward (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention
with IO-Awareness", Algorithm 1), causal, with GQA: query head h reads KV head h // (H // Hkv).

Why: naive attention writes the whole (T, T) score matrix per head to memory, softmaxes it and reads it
back: O(T^2) memory and traffic. FlashAttention never forms it. A tile of BR query rows walks over the
keys in tiles of BC columns staged in fast (shared) memory and keeps, per query row, a running max m, a
running sum lsum and an unnormalised output accumulator (the "online softmax" of Milakov & Gimelshein 2018):
when a new tile raises the max from m to m', everything kept so far is rescaled by exp(m - m'). The
result is exact attention (up to rounding) in O(T) memory. Causality lets a query tile skip every key
tile above the diagonal entirely: about half the work.

For comparison, FLAT (Kao et al. 2021, "FLAT: An Optimized Dataflow for Mitigating Attention
Bottlenecks") tiles only the query rows: a tile of `rows` queries attends to ALL keys at once with an
ordinary softmax, so it needs O(rows * T) memory, not O(T^2) (row_tiled_attention below).
"""
from __future__ import annotations

import math

import numpy as np
from numba import float32, njit, prange

from . import blocks, check_array, cuda_kernel, empty_like, to_device

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

BR = 16               # query rows per block (threadIdx.y)
BC = 16               # key columns per tile (threadIdx.x): BR*BC = 256 threads per block
DMAX = 64             # the largest head dim the CUDA kernel handles (shared arrays have constant shapes)
DPAD = DMAX + 1       # K tile row length: one spare column, so threads tx reading ks[tx, d] hit different banks
BC_PAD = BC + 1
NACC = DMAX // BC     # output dims per thread: thread tx owns d = tx, tx + BC, tx + 2*BC, ...
NEG = -3.0e38         # "minus infinity" for the CPU twins: fastmath assumes no infs, so a finite sentinel


# ----------------------------------------------------------------------------- CUDA kernel

@cuda_kernel("void(float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1])")
def flash_attention_fwd(q, k, v, out):
    """out (B, T, H, D) = causal softmax(q k^T / sqrt(D)) v. Grid (ceil(T/BR), H, B), block (BC, BR):
    thread (ty, tx) owns query row q0 + ty; it scores key k0 + tx of each tile and accumulates the
    output dims tx, tx + BC, ... Every thread of a row recomputes that row's max and sum from the shared
    score tile (16 reads): redundant, but no cross-thread reduction is needed."""
    qs = cuda.shared.array((BR, DMAX), float32)       # this block's query rows
    ks = cuda.shared.array((BC, DPAD), float32)       # the current key tile
    vs = cuda.shared.array((BC, DMAX), float32)       # the current value tile
    ps = cuda.shared.array((BR, BC_PAD), float32)     # the current score tile
    acc = cuda.local.array(NACC, float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tid = ty * BC + tx
    q0, h, b = cuda.blockIdx.x * BR, cuda.blockIdx.y, cuda.blockIdx.z
    T, H, D = q.shape[1], q.shape[2], q.shape[3]
    hk = h // (H // k.shape[2])
    scale = float32(1.0 / math.sqrt(D))
    for e in range(tid, BR * D, BR * BC):             # neighbouring threads load neighbouring d: coalesced
        r, d = e // D, e % D
        qs[r, d] = q[b, q0 + r, h, d] if q0 + r < T else float32(0.0)
    i = q0 + ty
    m, lsum = float32(-math.inf), float32(0.0)
    for a in range(NACC):
        acc[a] = float32(0.0)
    n_tiles = (min(T, q0 + BR) + BC - 1) // BC        # causal: key tiles right of the block's last row are skipped
    for t in range(n_tiles):
        k0 = t * BC
        cuda.syncthreads()                            # qs loaded; everyone done with the previous tile
        for e in range(tid, BC * D, BR * BC):
            r, d = e // D, e % D
            ks[r, d] = k[b, k0 + r, hk, d] if k0 + r < T else float32(0.0)
            vs[r, d] = v[b, k0 + r, hk, d] if k0 + r < T else float32(0.0)
        cuda.syncthreads()
        s = float32(-math.inf)                        # masked: key after the query (or past T)
        if i < T and k0 + tx <= i:
            dot = float32(0.0)
            for d in range(D):
                dot += qs[ty, d] * ks[tx, d]
            s = dot * scale
        ps[ty, tx] = s
        cuda.syncthreads()
        if i < T:                                     # tile 0 holds key 0 <= i, so m is finite from then on
            m_new = m
            for c in range(BC):
                m_new = max(m_new, ps[ty, c])
            alpha = math.exp(m - m_new)               # rescale what was kept under the old max (0 at tile 0)
            lsum *= alpha
            for a in range(NACC):
                acc[a] *= alpha
            for c in range(BC):
                p = math.exp(ps[ty, c] - m_new)       # exp(-inf) = 0 for masked keys
                lsum += p
                for a in range(NACC):
                    if tx + a * BC < D:
                        acc[a] += p * vs[c, tx + a * BC]
            m = m_new
    if i < T:
        for a in range(NACC):
            if tx + a * BC < D:
                out[b, i, h, tx + a * BC] = acc[a] / lsum


def _check_qkv(q, k, v):
    ndim = len(q.shape)
    if ndim not in (3, 4):
        raise ValueError(f"q must be (T, H, D) or (B, T, H, D), got shape {tuple(q.shape)}")
    check_array("q", q, np.float32, ndim)
    H = q.shape[-2]
    check_array("k", k, np.float32, ndim, tuple(q.shape[:-2]) + (None, q.shape[-1]))
    check_array("v", v, np.float32, ndim, tuple(k.shape))
    if k.shape[-2] < 1 or H % k.shape[-2]:
        raise ValueError(f"k has {k.shape[-2]} KV heads: must divide q's H = {H} (GQA)")


def flash_attention_cuda(q, k, v):
    """Causal attention on the GPU (or the simulator): q (T, H, D) or (B, T, H, D); k, v (..., T, Hkv, D)
    -> the shape of q, float32."""
    _check_qkv(q, k, v)
    if q.shape[-1] > DMAX:
        raise ValueError(f"head dim D = {q.shape[-1]} exceeds the CUDA kernel's DMAX = {DMAX}")
    q4, k4, v4 = (x if len(x.shape) == 4 else x.reshape((1,) + tuple(x.shape)) for x in (q, k, v))
    B, T, H, _ = q4.shape
    out = empty_like(q, tuple(q4.shape))                                      # (B, T, H, D)
    flash_attention_fwd[(blocks(T, BR), H, B), (BC, BR)](to_device(q4), to_device(k4), to_device(v4), to_device(out))
    return out.reshape(tuple(q.shape))


# ----------------------------------------------------------------------------- CPU twin

@njit(parallel=True, fastmath=True, cache=True)
def flash_attention_rows(q, k, v, out, block):
    """out (T, H, D) = causal attention of q (T, H, D) over k, v (T, Hkv, D), in place, walking the keys
    in tiles of `block` with the online softmax (Dao et al. 2022, Alg. 1, one query row at a time).
    Rows and heads are independent: prange over them. `block` changes only the rounding."""
    T, H, D = q.shape
    group = H // k.shape[1]
    scale = np.float32(1.0 / np.sqrt(D))
    for idx in prange(T * H):
        i, h = idx // H, idx % H
        hk = h // group
        s = np.empty(block, np.float32)              # one tile of scores: O(block), never O(T)
        acc = out[i, h]                               # (D,) view: the accumulator is the output row
        acc[:] = 0.0
        m, lsum = np.float32(NEG), np.float32(0.0)
        for k0 in range(0, i + 1, block):             # causal: tiles past the diagonal never start
            k1 = min(k0 + block, i + 1)
            m_new = m
            for j in range(k0, k1):
                dot = np.float32(0.0)
                for d in range(D):
                    dot += q[i, h, d] * k[j, hk, d]
                s[j - k0] = dot * scale
                m_new = max(m_new, s[j - k0])
            alpha = np.exp(m - m_new)                 # 0 at the first tile (m = NEG), else rescales
            lsum *= alpha
            for d in range(D):
                acc[d] *= alpha
            for j in range(k0, k1):
                p = np.exp(s[j - k0] - m_new)
                lsum += p
                for d in range(D):
                    acc[d] += p * v[j, hk, d]
            m = m_new
        for d in range(D):
            acc[d] /= lsum


def flash_attention_cpu(q, k, v, block: int = BC):
    """Causal attention, numpy in and out: q (T, H, D) or (B, T, H, D); k, v (..., T, Hkv, D)."""
    _check_qkv(q, k, v)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    out = np.empty(q.shape, np.float32)                                       # (..., T, H, D)
    if q.ndim == 3:
        flash_attention_rows(q, k, v, out, block)
    else:
        for b in range(q.shape[0]):
            flash_attention_rows(q[b], k[b], v[b], out[b], block)
    return out


# ----------------------------------------------------------------------------- references for comparison

def _heads(q, k, v):
    """Head-major views, KV heads repeated for GQA: -> (H, T, D) each."""
    H = q.shape[1]
    kv_of = np.arange(H) // (H // k.shape[1])                                 # (H,) KV head of each query head
    return q.transpose(1, 0, 2), k.transpose(1, 0, 2)[kv_of], v.transpose(1, 0, 2)[kv_of]


def naive_attention(q, k, v):
    """Causal attention the textbook way, materialising all H (T, T) score matrices (O(T^2) memory).
    q (T, H, D), k, v (T, Hkv, D) -> (T, H, D), in q's dtype; the softmax runs in place on the scores."""
    T, H, D = q.shape
    qh, kh, vh = _heads(q, k, v)                                              # (H, T, D) each
    s = qh @ kh.transpose(0, 2, 1)                                            # (H, T, T): the O(T^2) matrix
    s *= 1.0 / math.sqrt(D)
    np.copyto(s, -np.inf, where=np.triu(np.ones((T, T), dtype=bool), 1))     # key j > query i: masked
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return np.ascontiguousarray((s @ vh).transpose(1, 0, 2))                  # (T, H, D)


def row_tiled_attention(q, k, v, rows: int):
    """FLAT-style (Kao et al. 2021): `rows` query rows at a time attend to ALL T keys with a full softmax.
    q (T, H, D), k, v (T, Hkv, D) -> (T, H, D). Memory O(H * rows * T): linear in T for fixed rows."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    T, H, D = q.shape
    qh, kh, vh = _heads(q, k, v)                                              # (H, T, D) each
    out = np.empty_like(q)                                                    # (T, H, D)
    for r0 in range(0, T, rows):
        r1 = min(r0 + rows, T)
        s = qh[:, r0:r1] @ kh.transpose(0, 2, 1)                              # (H, rows, T): all keys at once
        s *= 1.0 / math.sqrt(D)
        np.copyto(s, -np.inf, where=np.arange(T)[None, :] > np.arange(r0, r1)[:, None])  # causal mask, this tile
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        out[r0:r1] = (s @ vh).transpose(1, 0, 2)                              # (rows, H, D)
    return out


def attention_peak_bytes(T: int, H: int, D: int, method: str, block: int = BC, itemsize: int = 4) -> int:
    """Bytes attention must hold beyond its inputs q, k, v, by the algorithm (not by any one
    implementation's temporaries): the output (T, H, D) plus the intermediates of one tile of work.
    naive: all H (T, T) score matrices, O(T^2). row_tiled: H score tiles of (block rows, T), O(T).
    flash: the running max and sum per query row (a GPU kernel keeps them; FlashAttention stores them
    for the backward pass) plus H (block, block) score tiles, O(T). The CPU twin keeps its running
    statistics in per-thread scratch, so what tracemalloc measures for it is about the output alone;
    numpy implementations of naive and row_tiled allocate a few temporaries of the score's size on top."""
    out = T * H * D
    extra = {"naive": H * T * T, "row_tiled": H * min(block, T) * T, "flash": 2 * T * H + H * block * block}
    if method not in extra:
        raise ValueError(f"method must be 'naive', 'row_tiled' or 'flash', got {method!r}")
    return itemsize * (out + extra[method])
