"""Quantized linear layers and an int8 KV cache on the CPU (numba), for the numba backend's forward:
y (M, N) = x (M, K) @ W^T with W stored in DESIGN.md's layouts, and decode attention over an int8 pool.
One file per weight type; this module gathers their public names, so `from minillm.kernels.quant_rows import
int8_linear_cpu` (and every other existing import) keeps working.

    int8   w_q (N, K) int8, scales (N,) fp32                  y[m, n] = scale[n] * sum_k w_q[n, k] x[m, k]
           (quant_rows_int8.py)
    int4   w_packed (N, K/2) uint8, scales (N, K/G) fp32       W[n, k] = scale[n, k // G] * (nibble - 8); byte j
           holds k = 2j in its low nibble and k = 2j + 1 in its high one (quant_rows_int4.py)
    q8_0   w_q (N, K) int8, w_s (N, K/G) fp32, and x quantized the same way per group (runq.c): per group an
           exact integer dot product, then y += ((float) ival * w_s) * x_s, groups in order, in float32
           (quant_rows_q80.py)
    W8A8   w_q (N, K) int8, w_scale (N,), x quantized per token (absmax / 127, round half to even), optionally
           divided by `smooth` first (SmoothQuant): y = (float) (x_q . w_q) * x_scale * w_scale
           (quant_rows_w8a8.py)
    int8 KV  k_pool, v_pool (NB, BS, Hkv, D) int8, k_scale, v_scale (NB, BS, Hkv) fp32 (minillm.llama.kv_cache)
           (quant_rows_kv_int8.py)

What they share (quant_rows_tiles.py): a tile of NR weight rows dequantized once into a float32 buffer and used
by every row of x, the exact int32 dot products, and the argument checks. Batch invariance: every y[m, n] is
computed by the same compiled loops in one fixed order whatever M is, so a sequence's logits do not depend on
what shares its batch, bit for bit (tests/test_quant_rows.py checks it with np.array_equal). q8_0 and W8A8 are
exact integer sums followed by float32 operations in runq.c's / torch's order, compiled without fastmath, so
they equal the torch reference layers (minillm.llama.linears) bit for bit.
"""
from __future__ import annotations

from .quant_rows_int4 import int4_linear_cpu, int4_linear_rows
from .quant_rows_int8 import int8_linear_cpu, int8_linear_rows
from .quant_rows_kv_int8 import (
    check_paged_int8kv,
    kv_int8_write_cpu,
    kv_int8_write_rows,
    paged_attention_int8kv_cpu,
    paged_attention_rows_int8kv,
    paged_attention_tree_rows_int8kv,
)
from .quant_rows_q80 import q8_0_linear_cpu, q8_0_linear_rows, q8_0_quantize_cpu, q8_0_quantize_rows
from .quant_rows_tiles import KC, NR
from .quant_rows_w8a8 import W8A8_MAX_K, w8a8_linear_cpu, w8a8_linear_rows, w8a8_quantize_rows

__all__ = [
    "KC", "NR", "W8A8_MAX_K",
    "int8_linear_rows", "int8_linear_cpu",
    "int4_linear_rows", "int4_linear_cpu",
    "q8_0_quantize_rows", "q8_0_linear_rows", "q8_0_quantize_cpu", "q8_0_linear_cpu",
    "w8a8_quantize_rows", "w8a8_linear_rows", "w8a8_linear_cpu",
    "kv_int8_write_rows", "kv_int8_write_cpu", "check_paged_int8kv",
    "paged_attention_tree_rows_int8kv", "paged_attention_rows_int8kv", "paged_attention_int8kv_cpu",
]
