"""The KV pools the numba forward reads and writes: float32, or int8 with a scale per (token, KV head).

As numba_linears does for weights, `kv_write` and `kv_attend` are resolved at compile time from the pool's
dtype, so minillm.backends.numba_model.forward_rows is written once and compiled for each kind:

    float32 K, V (NB, BS, Hkv, D)                          written as they are; kernels.paged_attention
    int8 K, V (NB, BS, Hkv, D), scales (NB, BS, Hkv)      KVCache.update's absmax rounding (kernels.quant_rows),
                                                          dequantized on read by one multiply per position
A float pool's scales are empty arrays (never read).
"""
from __future__ import annotations

from numba import types
from numba.extending import overload

from ..kernels.paged_attention import paged_attention_tree_rows
from ..kernels.quant_rows import kv_int8_write_rows, paged_attention_tree_rows_int8kv


def kv_write(pool, scale, new, slots):
    """One layer's new K or V (R, Hkv, D) into its pool at slots (R,) (-1: padding) (compiled code only)."""
    raise NotImplementedError("numba_kv.kv_write runs inside numba-compiled code")


def kv_attend(q, k_pool, v_pool, k_scale, v_scale, tables, ends, starts, visible, out):
    """paged_attention_tree_rows over either pool kind (compiled code only)."""
    raise NotImplementedError("numba_kv.kv_attend runs inside numba-compiled code")


def _int8(pool) -> bool:
    return isinstance(pool, types.Array) and pool.dtype == types.int8


@overload(kv_write)
def _kv_write(pool, scale, new, slots):
    if _int8(pool):
        def int8(pool, scale, new, slots):
            kv_int8_write_rows(new, slots, pool, scale)
        return int8

    def fp32(pool, scale, new, slots):
        BS = pool.shape[1]
        for r in range(new.shape[0]):
            if slots[r] >= 0:
                pool[slots[r] // BS, slots[r] % BS] = new[r]
    return fp32


@overload(kv_attend)
def _kv_attend(q, k_pool, v_pool, k_scale, v_scale, tables, ends, starts, visible, out):
    if _int8(k_pool):
        def int8(q, k_pool, v_pool, k_scale, v_scale, tables, ends, starts, visible, out):
            paged_attention_tree_rows_int8kv(q, k_pool, v_pool, k_scale, v_scale, tables, ends, starts, visible, out)
        return int8

    def fp32(q, k_pool, v_pool, k_scale, v_scale, tables, ends, starts, visible, out):
        paged_attention_tree_rows(q, k_pool, v_pool, tables, ends, starts, visible, out)
    return fp32
