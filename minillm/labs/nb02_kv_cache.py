"""Checkers for notebook 02_kv_cache."""
from __future__ import annotations

import torch

from .common import checker


@checker
def check_kv_cache_bytes(fn):
    """fn(config: ModelConfig, num_tokens, bytes_per_elem) -> bytes of K and V for num_tokens tokens"""
    from ..config import ModelConfig
    for name, n, b in [("stories15M", 256, 4), ("shakespeare", 1024, 2), ("tiny", 7, 1)]:
        cfg = ModelConfig.from_name(name)
        want = n * cfg.kv_bytes_per_token(b)
        got = fn(cfg, n, b)
        assert got == want, \
            f"{name}, {n} tokens, {b} bytes/elem: got {got}, expected {want} (2 x layers x Hkv x D x ...)"
    return "K and V bytes right for MHA and GQA shapes"


@checker
def check_slot_mapping(fn):
    """fn(block_table: list[int], positions: list[int], block_size) -> list of slots"""
    from ..llama.attention import AttentionMetadata
    cases = [([3, 0, 7], [0, 1, 15, 16, 40], 16), ([5], [0, 9], 256), ([2, 9, 4, 1], [0, 1, 2, 3, 4, 5, 6, 7], 2)]
    for table, pos, bs in cases:
        want = AttentionMetadata.build(torch.tensor([pos]), torch.tensor([table]), torch.tensor([max(pos) + 1]),
                                       bs).slot_mapping[0].tolist()
        got = [int(s) for s in fn(table, pos, bs)]
        assert got == want, f"table {table}, block_size {bs}: got {got}, expected {want}"
    return "slot = block_table[p // block_size] * block_size + p % block_size"
