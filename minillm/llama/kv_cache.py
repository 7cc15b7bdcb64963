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

from ..config import EngineConfig, ModelConfig
from ..kernels import cdiv

DEFAULT_KV_CAP = 256 * 2**20  # bytes for the KV pool when kv_cache_bytes is not given


class KVCache:
    """dtype=torch.int8 stores K and V as int8 with a float32 scale per (token, KV head): absmax / 127
    over the head's D values, as vLLM's and TensorRT-LLM's int8 KV caches quantize per token and head.
    Attention dequantizes what it gathers. Bytes per token and head: D + 4 instead of 4D."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KV cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, num_blocks, block_size, Hkv, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, num_blocks, block_size, Hkv, D)
        self.quantized = dtype == torch.int8
        if self.quantized:
            self.k_scale = torch.zeros(shape[:-1], device=device)  # (L, num_blocks, block_size, Hkv) float32
            self.v_scale = torch.zeros(shape[:-1], device=device)  # (L, num_blocks, block_size, Hkv) float32

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype=torch.float32) -> int:
        """K and V of every layer for one token, scales included."""
        if dtype == torch.int8:
            return 2 * cfg.n_layers * cfg.n_kv_heads * (cfg.head_dim + 4)
        return cfg.kv_bytes_per_token(torch.finfo(dtype).bits // 8)

    @staticmethod
    def bytes_for(cfg: ModelConfig, num_blocks: int, block_size: int, bytes_per_elem: int = 4) -> int:
        return num_blocks * block_size * cfg.kv_bytes_per_token(bytes_per_elem)

    @classmethod
    def from_bytes(cls, cfg: ModelConfig, kv_cache_bytes: int, block_size: int, dtype=torch.float32, device="cpu"):
        """As many blocks as fit in kv_cache_bytes: budgets are bytes, so block-size sweeps compare at equal memory."""
        per_block = block_size * cls.bytes_per_token(cfg, dtype)
        num_blocks = kv_cache_bytes // per_block
        if num_blocks < 1:
            raise ValueError(f"kv_cache_bytes={kv_cache_bytes} holds no block: one block of {block_size} tokens "
                             f"needs {per_block} bytes")
        return cls(cfg, num_blocks, block_size, dtype, device)

    @classmethod
    def for_engine(cls, cfg: ModelConfig, config: EngineConfig, dtype=torch.float32, device="cpu") -> "KVCache":
        """The engine's pool: kv_cache_bytes, or by default room for max_num_seqs full-length sequences capped at
        DEFAULT_KV_CAP (preemption handles the rest), never less than one full-length sequence."""
        return cls.from_bytes(cfg, cls.engine_bytes(cfg, config, dtype), config.block_size, dtype, device)

    @classmethod
    def engine_bytes(cls, cfg: ModelConfig, config: EngineConfig, dtype=torch.float32) -> int:
        """for_engine's budget in bytes, checked (minillm.parallel sizes its per-rank pools by the same blocks)."""
        bs, per_token = config.block_size, cls.bytes_per_token(cfg, dtype)   # scales included for int8
        need = cdiv(config.max_model_len, bs) * bs * per_token
        kv_bytes = config.kv_cache_bytes
        if kv_bytes is None:
            kv_bytes = max(need, min(config.max_num_seqs * need, DEFAULT_KV_CAP))
        if kv_bytes < need:
            raise ValueError(f"the KV cache gets {kv_bytes:,} bytes but one sequence of max_model_len="
                             f"{config.max_model_len} needs {need:,} ({per_token:,} bytes per token): raise "
                             f"kv_cache_bytes or lower max_model_len")
        return kv_bytes

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> list:
        """Every pool tensor, (L, num_blocks, ...) each: K, V, and their scales when quantized."""
        return [self.k, self.v] + ([self.k_scale, self.v_scale] if self.quantized else [])

    def layer(self, layer: int) -> tuple:
        """What attention reads for one layer: (k_pool, v_pool, k_scale, v_scale); scales None in float."""
        if self.quantized:
            return self.k[layer], self.v[layer], self.k_scale[layer], self.v_scale[layer]
        return self.k[layer], self.v[layer], None, None

    def update(self, layer: int, slot_mapping, k, v):
        """Write new K/V at their slots. slot_mapping: (B, T) int64, -1 for padding; k, v: (B, T, Hkv, D)."""
        slots = slot_mapping.reshape(-1)                      # (B*T,)
        keep = slots >= 0
        k, v = k.reshape(-1, *k.shape[-2:]), v.reshape(-1, *v.shape[-2:])   # (B*T, Hkv, D)
        if not bool(keep.all()):
            slots, k, v = slots[keep], k[keep], v[keep]
        for pool, scale_pool, new in ((self.k, "k_scale", k), (self.v, "v_scale", v)):
            flat = pool[layer].view(-1, *pool.shape[-2:])     # (num_blocks*block_size, Hkv, D), a view
            if self.quantized:
                scale = new.abs().amax(-1).float() / 127.0                         # (N, Hkv)
                q = torch.round(new.float() / scale.clamp_min(1e-30)[..., None])    # (N, Hkv, D) in [-127, 127]
                flat[slots] = q.to(torch.int8)
                getattr(self, scale_pool)[layer].view(-1, pool.shape[-2])[slots] = scale
            else:
                flat[slots] = new.to(flat.dtype)

    def copy_blocks(self, pairs):
        """Copy whole blocks src -> dst in every layer (copy-on-write). pairs: [(src, dst)]."""
        if pairs:
            src = torch.tensor([s for s, _ in pairs])              # (P,)
            dst = torch.tensor([d for _, d in pairs])              # (P,)
            for t in self.tensors():
                t[:, dst] = t[:, src]

    def move_slots(self, src, dst):
        """Copy single token slots src -> dst in every layer (Medusa: the accepted path of a candidate tree
        is compacted into consecutive slots). src, dst: lists of slot ids (block * block_size + offset)."""
        if src:
            s, d = torch.tensor(src), torch.tensor(dst)            # (P,)
            for t in self.tensors():
                flat = t.view(t.shape[0], -1, *t.shape[3:])        # (L, num_blocks*block_size, ...), a view
                flat[:, d] = flat[:, s]


class SwapSpace:
    """A second pool of the same layout standing for host memory (vLLM's CPU swap space)."""

    def __init__(self, kv: KVCache, num_blocks: int):
        # (L, num_swap_blocks, ...) for each of the pool's tensors: K, V (and their scales, int8)
        self.pools = [torch.zeros((t.shape[0], num_blocks, *t.shape[2:]), dtype=t.dtype) for t in kv.tensors()]
        self.num_blocks = num_blocks

    def swap_out(self, kv: KVCache, pairs):
        """Device blocks -> swap blocks. pairs: [(device block, swap block)]."""
        for b, s in pairs:
            for mine, theirs in zip(self.pools, kv.tensors()):
                mine[:, s] = theirs[:, b]

    def swap_in(self, kv: KVCache, pairs):
        """Swap blocks -> device blocks. pairs: [(swap block, device block)]."""
        for s, b in pairs:
            for mine, theirs in zip(self.pools, kv.tensors()):
                theirs[:, b] = mine[:, s]
