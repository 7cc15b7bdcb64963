"""An int8 KV cache on the CPU (numba): the write that quantizes new K/V rows into the pool, and decode
attention that reads the pool dequantizing on the fly, in minillm.llama.kv_cache's layout:

    k_pool, v_pool (NB, BS, Hkv, D) int8    k_scale, v_scale (NB, BS, Hkv) fp32 (one scale per row and head)

Why: in long-context decode the KV cache, not the weights, is most of the bytes read per token; int8 halves
them against float16 and quarters them against float32. The attention loops are paged_attention's own
(attention_rows), which convert an int8 operand to float32 inside their vector registers (kernels/vec8.py).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import cdiv, check_array
from .paged_attention import attention_rows
from .quant_rows_tiles import _numpy


@njit(cache=True)
def kv_int8_write_rows(new, slots, pool, scale_pool):
    """KVCache.update's int8 write, for one layer's K or V: new (R, Hkv, D) float32 is quantized per (row,
    head), scale = max |new| / 127 and q = round half to even(new / max(scale, 1e-30)), into pool (NB, BS, Hkv, D)
    int8 and scale_pool (NB, BS, Hkv) float32 at slots (R,) (slot = block * BS + offset; -1: padding, skipped).
    No fastmath: it must write what the torch cache writes, bit for bit."""
    R, Hkv, D = new.shape
    BS = pool.shape[1]
    for r in range(R):
        if slots[r] < 0:
            continue
        blk, off = slots[r] // BS, slots[r] % BS
        for h in range(Hkv):
            v = new[r, h]                                            # (D,) view
            amax = np.float32(0.0)
            for d in range(D):
                amax = max(amax, abs(v[d]))
            scale = amax / np.float32(127.0)
            scale_pool[blk, off, h] = scale
            safe = max(scale, np.float32(1e-30))
            q = pool[blk, off, h]                                    # (D,) view into the pool
            for d in range(D):
                q[d] = np.int8(np.rint(v[d] / safe))


@njit(fastmath=True, cache=True)     # attention_rows holds the parallel loop
def paged_attention_tree_rows_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, starts,
                                     visible, out):
    """paged_attention.paged_attention_tree_rows over an int8 pool (k_pool, v_pool (NB, BS, Hkv, D) int8, k_scale,
    v_scale (NB, BS, Hkv) float32, minillm.llama.kv_cache's layout), dequantized on read (the score is
    (q . k_q) * k_scale / sqrt(D), the value weight exp(s - m) * v_scale: one multiply on a scalar each).
    out (R, H, D) in place; each (row, head) computed alone in a fixed order: a row's result never depends on
    the others."""
    attention_rows(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, starts, visible, out)


@njit(parallel=True, fastmath=True, cache=True)
def paged_attention_rows_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, out):
    """paged_attention.paged_attention_rows over an int8 pool: out (R, H, D) <- row r's query q[r] (H, D)
    attending to its first context_lens[r] cached positions, in place."""
    paged_attention_tree_rows_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, context_lens,
                                     np.zeros((q.shape[0], 0), np.bool_), out)


# ----------------------------------------------------------------------------- numpy in, numpy out (checked)

def check_paged_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens):
    """paged_attention.check_paged for an int8 pool: dtypes, shapes, contiguity, GQA, and that each row reads
    only blocks that exist. Returns the arguments as numpy arrays."""
    q = check_array("q", _numpy(q), np.float32, 3)
    R, H, D = q.shape
    k_pool = check_array("k_pool", _numpy(k_pool), np.int8, 4, (None, None, None, D))
    v_pool = check_array("v_pool", _numpy(v_pool), np.int8, 4, tuple(k_pool.shape))
    k_scale = check_array("k_scale", _numpy(k_scale), np.float32, 3, tuple(k_pool.shape[:3]))
    v_scale = check_array("v_scale", _numpy(v_scale), np.float32, 3, tuple(k_pool.shape[:3]))
    block_tables = check_array("block_tables", _numpy(block_tables), np.int64, 2, (R, None))
    context_lens = check_array("context_lens", _numpy(context_lens), np.int64, 1, (R,))
    NB, BS, Hkv, _ = k_pool.shape
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"k_pool has {Hkv} KV heads: must divide q's H = {H} (GQA)")
    M = block_tables.shape[1]
    for r in range(R):
        n = int(context_lens[r])
        if not 0 <= n <= M * BS:
            raise ValueError(f"context_lens[{r}] = {n} is outside [0, M * block_size] = [0, {M * BS}]")
        used = block_tables[r, :cdiv(n, BS)]                                   # (blocks read,) the entries row r reads
        bad = np.flatnonzero((used < 0) | (used >= NB))
        if bad.size:
            raise ValueError(f"row {r} reads block_tables[{r}, {bad[0]}] = {used[bad[0]]}, outside [0, NB) = [0, {NB})")
    return q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens


def paged_attention_int8kv_cpu(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens):
    """Decode attention over an int8 KV pool, numpy out: q (R, H, D) -> (R, H, D) float32."""
    args = check_paged_int8kv(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens)
    out = np.empty(args[0].shape, np.float32)                                  # (R, H, D)
    paged_attention_rows_int8kv(*args, out)
    return out


def kv_int8_write_cpu(new, slots, pool, scale_pool):
    """kv_int8_write_rows with its arguments checked: new (R, Hkv, D) float32, slots (R,) int64 (-1: skip),
    pool (NB, BS, Hkv, D) int8 and scale_pool (NB, BS, Hkv) float32, written in place."""
    new = check_array("new", _numpy(new), np.float32, 3)
    R, Hkv, D = new.shape
    pool = check_array("pool", _numpy(pool), np.int8, 4, (None, None, Hkv, D))
    scale_pool = check_array("scale_pool", _numpy(scale_pool), np.float32, 3, tuple(pool.shape[:3]))
    slots = check_array("slots", _numpy(slots), np.int64, 1, (R,))
    n_slots = pool.shape[0] * pool.shape[1]
    bad = np.flatnonzero((slots < -1) | (slots >= n_slots))
    if bad.size:
        raise ValueError(f"slots[{bad[0]}] = {slots[bad[0]]} is outside [-1, NB * block_size) = [-1, {n_slots})")
    kv_int8_write_rows(new, slots, pool, scale_pool)
