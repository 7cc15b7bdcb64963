"""Attention over the KV pool, read through block tables.

Per-step metadata travels as an argument (AttentionMetadata), never through a global context:
    slot_mapping (B, T)  where each new token's K/V are written (-1: padding, not written)
    block_tables (B, M)  the blocks each sequence owns, in order (padding entries are never read)
    context_lens (B,)    how many cached tokens each sequence has once this step's are written
A query at position p may look at cached positions j <= p and j < context_len. That one rule covers
prefill (T new tokens), decode (T = 1), chunked prefill and speculative verification.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..kernels import cdiv


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor   # (B, T) int64 (the four: numpy int64 for a backend that takes index_arrays)
    block_tables: torch.Tensor   # (B, M) int64
    context_lens: torch.Tensor   # (B,) int64
    positions: torch.Tensor      # (B, T) int64, the query tokens' positions
    tree_mask: Optional[torch.Tensor] = None  # (B, T, T) bool: Medusa's candidate tree, new token t sees new token u
                                              # iff tree_mask[b, t, u] (ancestors and itself), and every cached one
    # kv_eviction (minillm.kv_eviction): keys are stored before RoPE and rotated at their cache index on read;
    rope_on_read: bool = False
    rope: Optional[Callable] = None           # k (B, S, Hkv, D) -> k rotated at 0..S-1, set by the model's forward
    window: Optional[tuple] = None            # (sinks, window): query p sees key j iff j < sinks or p - j < window
    received: Optional[torch.Tensor] = None   # (B, S) H2O: attention probability each key received, += per layer

    @classmethod
    def build(cls, positions, block_tables, context_lens, block_size: int, valid=None):
        """Derive slots from positions: slot = block_tables[b, p // block_size] * block_size + p % block_size.
        positions: (B, T); block_tables: (B, M); context_lens: (B,); valid: (B, T) bool, False for padding."""
        blk = torch.gather(block_tables, 1, positions // block_size)      # (B, T)
        slots = blk * block_size + positions % block_size                 # (B, T)
        if valid is not None:
            slots = torch.where(valid, slots, torch.full_like(slots, -1))
        return cls(slots, block_tables, context_lens, positions)


def gather_kv(pool, block_tables, n_ctx: int):
    """The first n_ctx cached positions of each sequence, in order.
    pool: (num_blocks, block_size, Hkv, D); block_tables: (B, M) -> (B, n_ctx, Hkv, D)."""
    block_size = pool.shape[1]
    n_blocks = cdiv(n_ctx, block_size)
    if block_tables.shape[0] == 1 and n_blocks == 1:   # one sequence in one block (the contiguous cache): a view
        return pool[int(block_tables[0, 0]), :n_ctx].unsqueeze(0)           # (1, n_ctx, Hkv, D)
    blocks = pool[block_tables[:, :n_blocks]]           # (B, n_blocks, block_size, Hkv, D)
    return blocks.flatten(1, 2)[:, :n_ctx]              # (B, n_ctx, Hkv, D)


def paged_attention(q, k_pool, v_pool, attn: AttentionMetadata, k_scale=None, v_scale=None):
    """softmax(q k^T / sqrt(D) + mask) v over each sequence's cached context.
    q: (B, T, H, D); k_pool, v_pool: (num_blocks, block_size, Hkv, D) -> (B, T, H, D); with an int8 cache,
    k_scale, v_scale: (num_blocks, block_size, Hkv), and the gathered values are dequantized.
    The gathered context goes to torch's fused attention (scaled_dot_product_attention, GQA-aware) as
    strided views, with no copy beyond the gather itself; a plain matmul/softmax version of the same
    formula is the reference in tests/test_attention.py."""
    n_ctx = int(attn.context_lens.max())
    k = gather_kv(k_pool, attn.block_tables, n_ctx).to(q.dtype)  # (B, S, Hkv, D)
    v = gather_kv(v_pool, attn.block_tables, n_ctx).to(q.dtype)  # (B, S, Hkv, D)
    if k_scale is not None:                                       # int8 cache: scale per (token, KV head)
        k = k * gather_kv(k_scale[..., None], attn.block_tables, n_ctx).to(q.dtype)  # (B, S, Hkv, D)
        v = v * gather_kv(v_scale[..., None], attn.block_tables, n_ctx).to(q.dtype)  # (B, S, Hkv, D)
    if attn.rope_on_read:                                         # keys stored before RoPE: rotate at cache index
        k = attn.rope(k)                                          # (B, S, Hkv, D), key j by RoPE at position j
    j = torch.arange(n_ctx, device=q.device)                      # (S,)
    # (B, T, S)
    allowed = (j[None, None, :] <= attn.positions[:, :, None]) & (j[None, None, :] < attn.context_lens[:, None, None])
    if attn.window is not None:                                   # StreamingLLM: the sinks and the recent window
        sinks, window = attn.window
        allowed = allowed & ((j[None, None, :] < sinks) | (attn.positions[:, :, None] - j[None, None, :] < window))
    if attn.tree_mask is not None:                                # the new tokens are a tree, not a chain
        B, T = attn.positions.shape
        rel = j[None, None, :] - attn.positions[:, :1, None]      # (B, 1, S) a key's index among the new tokens
        tree = torch.gather(attn.tree_mask, 2, rel.clamp(0, T - 1).expand(B, T, n_ctx))  # (B, T, S)
        allowed = allowed & ((rel < 0) | tree)
    if attn.received is not None:                                 # H2O reads the probabilities: explicit softmax
        return _attention_probs(q, k, v, allowed, attn)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=allowed[:, None], enable_gqa=True)  # (B, H, T, D)
    # a padded query row that sees no key: zeros
    return torch.nan_to_num(y.transpose(1, 2))                    # (B, T, H, D)


def _attention_probs(q, k, v, allowed, attn: AttentionMetadata):
    """The same attention with the probabilities in hand: attn.received[b, j] += the probability key j got, summed
    over heads and the step's real queries (H2O's accumulated attention score, Zhang et al. 2023).
    q: (B, T, H, D); k, v: (B, S, Hkv, D); allowed: (B, T, S) -> (B, T, H, D)."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)   # (B, S, H, D): head h reads h // rep
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])        # (B, H, T, S)
    p = torch.softmax(s.masked_fill(~allowed[:, None], float("-inf")), dim=-1).nan_to_num()   # (B, H, T, S)
    real = (attn.slot_mapping >= 0).to(p.dtype)                               # (B, T): padding queries add nothing
    attn.received += (p * real[:, None, :, None]).sum((1, 2)).to(attn.received.dtype)       # (B, S)
    return torch.einsum("bhts,bshd->bthd", p, v)                              # (B, T, H, D)
