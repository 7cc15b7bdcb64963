"""The Llama transformer, from scratch: RMSNorm, RoPE (llama2.c pair layout), GQA attention, SwiGLU.

One forward serves training and inference:
    logits = model(tokens (B, T), positions (B, T), kv, attn)   # -> (B, T, V)
Without a KV cache it is plain causal self-attention over the T tokens (training, perplexity).
With one, each layer writes its new K/V into the paged pool at attn.slot_mapping and reads the whole
context back through attn.block_tables (minillm.llama.attention). Numerics follow llama2.c's run.c: float32,
RMSNorm eps 1e-5, RoPE on pairs (2j, 2j+1), attention scaled by 1/sqrt(D), w2(silu(w1 x) * w3 x).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ModelConfig
from .attention import AttentionMetadata, paged_attention
from .kv_cache import KVCache

ROPE_ROWS = 2048  # RoPE table rows built up front (more on demand, up to max_seq_len)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019), as run.c's rmsnorm."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # x: (..., C)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Bias(nn.Module):
    """x + bias over the last dimension (Qwen2's q, k and v projections)."""

    def __init__(self, n: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x):  # (..., n)
        return x + self.bias


def rope_frequencies(head_dim: int, theta: float = 10000.0, scaling: Optional[dict] = None) -> np.ndarray:
    """freq_j (D/2,) float32, run.c's 1.0f / powf(theta, 2j / (float)D), then a model family's rescaling:
    - {"rope_type": "linear", "factor": s}: every frequency / s (position interpolation, Chen et al. 2023);
    - {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
      (Llama 3.1+): wavelengths longer than original / low_freq_factor are divided by factor, those shorter than
      original / high_freq_factor kept, the band between blended linearly in original / wavelength (transformers'
      _compute_llama3_parameters, computed here in float64 and rounded once)."""
    e = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)                # (D/2,) float32 division
    freq = np.float32(1.0) / np.power(np.float64(theta), e.astype(np.float64)).astype(np.float32)  # (D/2,)
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return freq
    factor = float(scaling["factor"])
    if kind == "linear":
        return (freq.astype(np.float64) / factor).astype(np.float32)
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    f = freq.astype(np.float64)
    wavelen = 2 * math.pi / f                                                             # (D/2,)
    smooth = (old / wavelen - low) / (high - low)                                         # 0 at old/low, 1 at old/high
    scaled = np.where(wavelen > old / low, f / factor, f)
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    scaled = np.where(medium, (1 - smooth) * f / factor + smooth * f, scaled)
    return scaled.astype(np.float32)


def rope_tables(head_dim: int, max_seq_len: int, theta: float = 10000.0, scaling: Optional[dict] = None):
    """cos, sin: (max_seq_len, D/2) in float64, of the angles run.c computes in float32:
    freq = 1.0f / powf(theta, (2j) / (float)D) (rescaled as rope_frequencies says) and angle = pos * freq, both
    rounded to float32. The float32 angle is what matters at long contexts (pos * freq carries ~1e-7 relative
    error, so ~1e-4 rad at position 1000); cos/sin of it are then exact, and rounding them to float32 gives
    what glibc's cosf/sinf return."""
    freq = rope_frequencies(head_dim, theta, scaling)                                     # (D/2,) float32
    angle = np.arange(max_seq_len, dtype=np.float32)[:, None] * freq[None, :]             # (S, D/2) float32 product
    angle = torch.from_numpy(angle.astype(np.float64))                                   # (S, D/2)
    return torch.cos(angle), torch.sin(angle)


def apply_rope(x, cos, sin):
    """Rotate each pair (x[2j], x[2j+1]) of every head by angle pos * freq_j (Su et al. 2021, RoFormer).
    x: (B, T, H, D); cos, sin: (B, T, D/2) already gathered at the tokens' positions."""
    x0, x1 = x[..., 0::2], x[..., 1::2]                  # (B, T, H, D/2) each
    c, s = cos[:, :, None, :], sin[:, :, None, :]        # (B, T, 1, D/2)
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)  # (B, T, H, D/2, 2)
    return out.flatten(-2)                               # (B, T, H, D), pairs back in place


def rotate_keys(cos_table, sin_table, k):
    """kv_eviction stores keys before RoPE (minillm.kv_eviction): the gathered keys k (B, S, Hkv, D) rotated at
    their cache index 0 .. S - 1. cos_table, sin_table: (S', D/2) with S' >= S."""
    B, S = k.shape[:2]
    cos, sin = (t[:S].to(k.dtype).expand(B, S, -1) for t in (cos_table, sin_table))   # (B, S, D/2)
    return apply_rope(k, cos, sin)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.q_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_dim, bias=False)
        self.wo = nn.Linear(cfg.q_dim, cfg.dim, bias=False)
        # Qwen2: biases on q, k, v, kept beside the linears (so every weight type, LoRA and quantization alike,
        # serves them unchanged); Identity elsewhere
        self.q_bias, self.k_bias, self.v_bias = (Bias(n) if cfg.qkv_bias else nn.Identity()
                                                 for n in (cfg.q_dim, cfg.kv_dim, cfg.kv_dim))
        # Qwen3: each head of q and k RMS-normed before RoPE (Identity elsewhere: no weights, nothing computed)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.dropout = cfg.dropout

    def forward(self, x, cos, sin, kv: Optional[KVCache], attn: Optional[AttentionMetadata]):
        B, T, _ = x.shape
        q = self.q_norm(self.q_bias(self.wq(x)).view(B, T, self.n_heads, self.head_dim))      # (B, T, H, D)
        k = self.k_norm(self.k_bias(self.wk(x)).view(B, T, self.n_kv_heads, self.head_dim))   # (B, T, Hkv, D)
        v = self.v_bias(self.wv(x)).view(B, T, self.n_kv_heads, self.head_dim)                # (B, T, Hkv, D)
        q = apply_rope(q, cos, sin)
        if attn is None or not attn.rope_on_read:     # kv_eviction stores keys before RoPE (minillm.kv_eviction)
            k = apply_rope(k, cos, sin)
        if kv is None:
            y = causal_attention(q, k, v, self.dropout if self.training else 0.0)  # (B, T, H, D)
        else:
            kv.update(self.layer_id, attn.slot_mapping, k, v)
            k_pool, v_pool, k_scale, v_scale = kv.layer(self.layer_id)
            y = paged_attention(q, k_pool, v_pool, attn, k_scale, v_scale)  # (B, T, H, D)
        return self.wo(y.reshape(B, T, self.n_heads * self.head_dim))  # (B, T, C)


def causal_attention(q, k, v, dropout: float = 0.0):
    """Dense causal attention over the T tokens themselves (training and cache-free scoring).
    q: (B, T, H, D); k, v: (B, T, Hkv, D) -> (B, T, H, D). Uses torch's fused kernel for speed."""
    n_rep = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(n_rep, dim=2)                # (B, T, H, D): query head h reads KV head h // n_rep
    v = v.repeat_interleave(n_rep, dim=2)                # (B, T, H, D)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True, dropout_p=dropout)  # (B, H, T, D)
    return y.transpose(1, 2)                             # (B, T, H, D)


class FeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # gate
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)  # down
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # up

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg, layer_id)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, kv, attn):
        x = x + self.drop(self.attention(self.attention_norm(x), cos, sin, kv, attn))  # (B, T, C)
        return x + self.drop(self.feed_forward(self.ffn_norm(x)))                     # (B, T, C)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.shared_classifier:
            self.output.weight = self.tok_embeddings.weight  # weight tying, as llama2.c's small models
        # RoPE tables for the positions in use, grown on demand (a header may claim a context of 10^7: its full
        # tables would be gigabytes); a row depends only on its position, so growing never changes a value
        cos, sin = rope_tables(cfg.head_dim, min(cfg.max_seq_len, ROPE_ROWS), cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)  # (S', D/2), float64 until .to(dtype)
        self.register_buffer("rope_sin", sin, persistent=False)  # (S', D/2)

    def ensure_rope(self, n: int):
        """RoPE tables for positions 0 .. n - 1 (n <= max_seq_len), computed as rope_tables does, in the tables'
        dtype. The numba and CUDA backends copy the tables once, for max_model_len positions."""
        have, n = self.rope_cos.shape[0], min(n, self.config.max_seq_len)
        if n > have:
            n = min(max(n, 2 * have), self.config.max_seq_len)
            with torch.inference_mode(False):                    # plain tensors: training may use them later
                cos, sin = rope_tables(self.config.head_dim, n, self.config.rope_theta, self.config.rope_scaling)
                self.rope_cos = cos.to(self.rope_cos.dtype, copy=True).to(self.rope_cos.device)
                self.rope_sin = sin.to(self.rope_sin.dtype, copy=True).to(self.rope_sin.device)

    def init_weights(self, seed: int = 0, std: float = 0.02):
        """GPT-2 style init (llama2.c's model.py): N(0, 0.02), residual projections scaled by 1/sqrt(2L)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    s = std / math.sqrt(2 * self.config.n_layers) if name.endswith(("wo.weight", "w2.weight")) else std
                    p.copy_(torch.randn(p.shape, generator=g) * s)
        return self

    def forward(self, tokens, positions=None, kv: Optional[KVCache] = None, attn: Optional[AttentionMetadata] = None,
                last_index=None, return_hidden: bool = False, rows=None):
        """tokens: (B, T) int64; positions: (B, T) int64, default 0..T-1 -> logits (B, T, V).
        last_index (B,): only the logits at these token indices -> (B, 1, V); the classifier is the
        biggest matmul of a small model, and serving needs one row per sequence.
        rows (N,): flat indices into the B*T tokens: only these rows' logits -> (N, V). This is the serving
        backends' interface (minillm.core.model_runner): torch, numba and CUDA forwards all take it.
        return_hidden: also return the final-normed hidden states h (B, T or 1, C), or (N, C) with rows,
        logits = output(h) (what Medusa heads read)."""
        B, T = tokens.shape
        if positions is None:
            positions = torch.arange(T, device=tokens.device).expand(B, T)  # (B, T)
        if kv is not None and attn is None:
            raise ValueError("a KV cache needs AttentionMetadata (slot_mapping, block_tables, context_lens)")
        limit = self.config.max_seq_len
        if int(positions.max()) >= limit:
            raise ValueError(f"position {int(positions.max())} is beyond the model's context max_seq_len={limit}")
        self.ensure_rope(int(positions.max()) + 1)
        x = self.drop(self.tok_embeddings(tokens))                     # (B, T, C)
        cos = self.rope_cos[positions].to(x.dtype)                     # (B, T, D/2)
        sin = self.rope_sin[positions].to(x.dtype)                     # (B, T, D/2)
        if attn is not None and attn.rope_on_read:                     # keys rotated as attention reads them
            attn.rope = partial(rotate_keys, self.rope_cos, self.rope_sin)
        for layer in self.layers:
            x = layer(x, cos, sin, kv, attn)                           # (B, T, C)
        if rows is not None:
            x = x.reshape(B * T, -1)[rows]                             # (N, C)
        elif last_index is not None:
            x = x[torch.arange(B), last_index][:, None]                # (B, 1, C)
        h = self.norm(x)                                               # (B, T, C)
        return (self.output(h), h) if return_hidden else self.output(h)  # (B, T, V)
