"""The KV cache: one pool of fixed-size blocks per layer, in DESIGN.md's layout.

    k[layer], v[layer]: (num_blocks, block_size, Hkv, D)

A token's K/V live at a *slot*: slot = block * block_size + offset. A sequence owns a list of blocks
(its block table); attention reads them back in order. The classic contiguous cache (one max-length
buffer per sequence, as in gpt-fast's `KVCache.update(input_pos, k, v)`) is exactly this pool with
block_size = max_model_len: every sequence gets one block. vLLM's PagedAttention (Kwon et al. 2023)
is the same pool with small blocks. Which blocks a sequence owns is the block manager's business.
"""
from __future__ import annotations

import torch

from .config import ModelConfig


class KVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KV cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, num_blocks, block_size, Hkv, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, num_blocks, block_size, Hkv, D)

    @staticmethod
    def bytes_for(cfg: ModelConfig, num_blocks: int, block_size: int, bytes_per_elem: int = 4) -> int:
        return num_blocks * block_size * cfg.kv_bytes_per_token(bytes_per_elem)

    @classmethod
    def from_bytes(cls, cfg: ModelConfig, kv_cache_bytes: int, block_size: int, dtype=torch.float32, device="cpu"):
        """As many blocks as fit in kv_cache_bytes: budgets are bytes, so block-size sweeps compare at equal memory."""
        per_block = cls.bytes_for(cfg, 1, block_size, torch.finfo(dtype).bits // 8)
        num_blocks = kv_cache_bytes // per_block
        if num_blocks < 1:
            raise ValueError(f"kv_cache_bytes={kv_cache_bytes} holds no block: one block of {block_size} tokens "
                             f"needs {per_block} bytes")
        return cls(cfg, num_blocks, block_size, dtype, device)

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def update(self, layer: int, slot_mapping, k, v):
        """Write new K/V at their slots. slot_mapping: (B, T) int64, -1 for padding; k, v: (B, T, Hkv, D)."""
        slots = slot_mapping.reshape(-1)                      # (B*T,)
        keep = slots >= 0
        k_flat = self.k[layer].view(-1, *self.k.shape[-2:])   # (num_blocks*block_size, Hkv, D), a view
        v_flat = self.v[layer].view(-1, *self.v.shape[-2:])   # (num_blocks*block_size, Hkv, D), a view
        if bool(keep.all()):
            k_flat[slots] = k.reshape(-1, *k.shape[-2:]).to(k_flat.dtype)
            v_flat[slots] = v.reshape(-1, *v.shape[-2:]).to(v_flat.dtype)
        else:
            k_flat[slots[keep]] = k.reshape(-1, *k.shape[-2:])[keep].to(k_flat.dtype)
            v_flat[slots[keep]] = v.reshape(-1, *v.shape[-2:])[keep].to(v_flat.dtype)

    def copy_blocks(self, pairs):
        """Copy whole blocks src -> dst in every layer (copy-on-write). pairs: [(src, dst)]."""
        if pairs:
            src = torch.tensor([s for s, _ in pairs])              # (P,)
            dst = torch.tensor([d for _, d in pairs])              # (P,)
            self.k[:, dst] = self.k[:, src]
            self.v[:, dst] = self.v[:, src]


class SwapSpace:
    """A second pool of the same layout standing for host memory (vLLM's CPU swap space)."""

    def __init__(self, kv: KVCache, num_blocks: int):
        shape = (kv.k.shape[0], num_blocks, *kv.k.shape[2:])
        self.k = torch.zeros(shape, dtype=kv.k.dtype)             # (L, num_swap_blocks, block_size, Hkv, D)
        self.v = torch.zeros(shape, dtype=kv.v.dtype)             # (L, num_swap_blocks, block_size, Hkv, D)
        self.num_blocks = num_blocks

    def swap_out(self, kv: KVCache, pairs):
        """Device blocks -> swap blocks. pairs: [(device block, swap block)]."""
        for b, s in pairs:
            self.k[:, s], self.v[:, s] = kv.k[:, b], kv.v[:, b]

    def swap_in(self, kv: KVCache, pairs):
        """Swap blocks -> device blocks. pairs: [(swap block, device block)]."""
        for s, b in pairs:
            kv.k[:, b], kv.v[:, b] = self.k[:, s], self.v[:, s]
