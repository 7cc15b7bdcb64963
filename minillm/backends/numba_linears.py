"""The weight types the numba forward runs: float32, int8, int4, Q8_0 and W8A8, behind one `linear(x, w, y)`.

numba compiles a function once per argument type, so the forward (minillm.backends.numba_model.forward_rows) is
written once over "a weight" and compiled for each kind: a float32 array, or one of the namedtuples below, whose
arrays follow DESIGN.md's shared layouts (minillm.llama.linears holds the torch twins). `linear` and `layer` are
resolved at compile time by their @overload, which looks at the weight's type, as a C++ template would:

    float32 (N, K)                              kernels.matmul.linear_cpu
    Int8W(q (N, K) int8, s (N,))                kernels.quant_rows.int8_linear_rows   (per-row scales)
    Int4W(q (N, K/2) uint8, s (N, K/G))         kernels.quant_rows.int4_linear_rows   (group scales, q + 8 nibbles)
    Q80W(q (N, K) int8, s (N, K/G))             runq.c: activations quantized per group too, integer dots
    W8A8W(q (N, K) int8, s (N,), smooth (K,))   int8 x int8 with per-token activation scales (smooth: ones)

A model's weights are stacked by layer ((L, N, K) arrays, llama2.c's order); `layer(w, li)` takes layer li's.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import torch
import torch.nn as nn
from numba import types
from numba.extending import overload

from ..kernels.matmul import linear_cpu
from ..kernels.quant_rows import (
    int4_linear_rows,
    int8_linear_rows,
    q8_0_linear_rows,
    q8_0_quantize_rows,
    w8a8_linear_rows,
    w8a8_quantize_rows,
)
from ..llama.linears import Int4Linear, Int8Linear, Q80Linear, W8A8Linear

Int8W = namedtuple("Int8W", "q s")
Int4W = namedtuple("Int4W", "q s")
Q80W = namedtuple("Q80W", "q s")
W8A8W = namedtuple("W8A8W", "q s smooth")
KINDS = {Int8Linear: Int8W, Int4Linear: Int4W, Q80Linear: Q80W, W8A8Linear: W8A8W}


def linear(x, w, y):
    """y (M, N) = x (M, K) @ W^T in place, for any weight kind above (compiled code only)."""
    raise NotImplementedError("numba_linears.linear runs inside numba-compiled code")


def layer(w, li):
    """Layer li of a stacked weight (compiled code only)."""
    raise NotImplementedError("numba_linears.layer runs inside numba-compiled code")


def out_features(w):
    """N, the output size of a weight of any kind, stacked or not (compiled code only)."""
    raise NotImplementedError("numba_linears.out_features runs inside numba-compiled code")


def _kind(w):
    return w.instance_class if isinstance(w, types.BaseNamedTuple) else None


@overload(layer)
def _layer(w, li):
    if isinstance(w, types.Array):
        return lambda w, li: w[li]
    kind = _kind(w)
    if kind is W8A8W:
        return lambda w, li: W8A8W(w.q[li], w.s[li], w.smooth[li])
    if kind in (Int8W, Int4W, Q80W):
        return lambda w, li: kind(w.q[li], w.s[li])


@overload(out_features)
def _out_features(w):
    if isinstance(w, types.Array):
        return lambda w: w.shape[w.ndim - 2]
    return lambda w: w.q.shape[w.q.ndim - 2]


@overload(linear)
def _linear(x, w, y):
    if isinstance(w, types.Array):
        def fp32(x, w, y):
            linear_cpu(x, w, y)
        return fp32
    kind = _kind(w)
    if kind is Int8W:
        def int8(x, w, y):
            int8_linear_rows(x, w.q, w.s, y)
        return int8
    if kind is Int4W:
        def int4(x, w, y):
            int4_linear_rows(x, w.q, w.s, y)
        return int4
    if kind is Q80W:
        def q8_0(x, w, y):
            M, K = x.shape
            gs = K // w.s.shape[1]
            xq = np.empty((M, K), np.int8)                      # (M, K) activations, int8 per group of gs
            xs = np.empty((M, K // gs), np.float32)             # (M, K/G) their scales
            q8_0_quantize_rows(x, gs, xq, xs)
            q8_0_linear_rows(xq, xs, w.q, w.s, y)
        return q8_0
    if kind is W8A8W:
        def w8a8(x, w, y):
            M, K = x.shape
            xq = np.empty((M, K), np.int8)                      # (M, K) activations, int8 per token
            xs = np.empty(M, np.float32)                        # (M,) their scales
            w8a8_quantize_rows(x, w.smooth, xq, xs)
            w8a8_linear_rows(xq, xs, w.q, w.s, y)
        return w8a8


def _arrays(mod: nn.Module):
    """One linear module -> its kind's namedtuple of numpy arrays (N first), or a float32 weight array."""
    if type(mod) is nn.Linear:
        return mod.weight.detach().float().numpy()
    kind = KINDS.get(type(mod))             # exact types: AWQLinear (an Int4Linear with a smoothing) is not int4 here
    if kind is None:
        raise TypeError(f"backend='numba' has no kernel for {type(mod).__name__}")
    if kind is W8A8W:
        smooth = mod.smooth if mod.smooth is not None else torch.ones(mod.in_features)
        return W8A8W(mod.w_q.numpy(), mod.w_scale.numpy(), smooth.float().numpy())
    return kind(mod.w_packed.numpy() if kind is Int4W else mod.w_q.numpy(), mod.scales.numpy())


def fuse(mods) -> object:
    """Linears that read the same input (wq|wk|wv, w1|w3) as one weight: outputs concatenated along N, so one
    pass over the input serves all (vLLM's QKVParallelLinear). W8A8 with different smoothings cannot share one
    quantized input: refused (smoothquant runs on torch; the capability table says so)."""
    parts = [_arrays(m) for m in mods]
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    if isinstance(parts[0], W8A8W) and any(not np.array_equal(p.smooth, parts[0].smooth) for p in parts):
        raise ValueError("backend='numba' fuses wq|wk|wv into one W8A8 matmul: their smoothing factors must agree")
    return type(parts[0])(*[np.concatenate([p[i] for p in parts]) if i < 2 else parts[0][i]
                            for i in range(len(parts[0]))])


def stack(per_layer: list) -> object:
    """Weights of every layer -> one stacked weight ((L, ...) arrays)."""
    if isinstance(per_layer[0], np.ndarray):
        return np.ascontiguousarray(np.stack(per_layer))
    return type(per_layer[0])(*[np.ascontiguousarray(np.stack([w[i] for w in per_layer]))
                                for i in range(len(per_layer[0]))])
