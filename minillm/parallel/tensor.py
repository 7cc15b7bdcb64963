"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): every layer split across p ranks, one rank's share here.

    attention  wq, wk, wv column-parallel by heads: rank r has query heads [r H/p, (r+1) H/p) and the KV heads they
               read (H/p query heads share one KV head when p > Hkv: that head is replicated, as vLLM does);
               wo row-parallel: rank r multiplies its heads' outputs by its columns of wo -> a partial sum (B, T, C)
               -> all_reduce (one per layer)
    MLP        w1, w3 column-parallel (rank r: hidden units [r F/p, (r+1) F/p)); w2 row-parallel -> all_reduce
    embedding  replicated (a lookup: nothing to save by splitting it at this size, and no collective)
    norms      replicated (each rank normalises the full residual it holds after the all-reduce)
    classifier split by vocabulary: rank r has logits [r V/p, (r+1) V/p) -> all_gather -> (N, V) on every rank

So a layer costs exactly two all-reduces of the (B, T, C) activations, and the residual stream is whole on every
rank between them. Each rank's paged KV pool holds its KV heads only: the same blocks, the same block tables, the
same slots as one rank's pool, 1/p of the bytes (more with replicated heads).
Numerics: a row-parallel matmul sums its inner dimension in p pieces and then across ranks, a different order from
one rank's; in float64 that moves logits by ~1e-15, in float32 by ~1e-6 (DESIGN.md rule 7).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ..llama.attention import paged_attention
from ..llama.kv_cache import KVCache
from ..llama.transformer import RMSNorm, apply_rope, causal_attention
from .rope import RopeTables


def check_tensor_parallel(cfg, p: int):
    """ValueError naming the value unless p ranks can split this model's heads, MLP and vocabulary evenly."""
    if p > 1 and cfg.family != "llama":
        raise ValueError(f"tensor_parallel_size={p} splits Llama blocks; this model is {cfg.family!r} (its q, k, v "
                         f"biases or q/k norms are not sharded): use tensor_parallel_size=1")
    for what, n in (("query heads n_heads", cfg.n_heads), ("vocabulary vocab_size", cfg.vocab_size),
                    ("MLP width hidden_dim", cfg.hidden_dim)):
        if n % p:
            raise ValueError(f"tensor_parallel_size={p} does not divide the model's {what}={n}: each rank takes an "
                             f"equal share (choose a divisor of {n})")
    hkv = cfg.n_kv_heads
    if (p > hkv and p % hkv) or (p < hkv and hkv % p):
        raise ValueError(f"tensor_parallel_size={p} and the model's n_kv_heads={hkv}: one must divide the other "
                         f"(fewer KV heads than ranks: each KV head is replicated on p / Hkv ranks)")


def head_ranges(cfg, p: int, r: int) -> tuple:
    """Rank r's query heads [q_lo, q_hi) and the KV heads they read [kv_lo, kv_hi)."""
    per, rep = cfg.n_heads // p, cfg.n_heads // cfg.n_kv_heads      # query heads per rank, per KV head
    q_lo, q_hi = r * per, (r + 1) * per
    return q_lo, q_hi, q_lo // rep, (q_hi - 1) // rep + 1


def split_weights(model, p: int, r: int) -> dict:
    """Rank r's share of every weight of a Transformer, as fresh contiguous tensors (they travel to the rank)."""
    cfg = model.config
    D, F_, V = cfg.head_dim, cfg.hidden_dim // p, cfg.vocab_size // p
    q_lo, q_hi, kv_lo, kv_hi = head_ranges(cfg, p, r)
    take = lambda w, lo, hi, dim=0: w.detach().narrow(dim, lo, hi - lo).contiguous().clone()   # noqa: E731
    layers = []
    for blk in model.layers:
        a, f = blk.attention, blk.feed_forward
        layers.append({
            "attention_norm": blk.attention_norm.weight.detach().clone(),
            "wq": take(a.wq.weight, q_lo * D, q_hi * D),                   # (H/p D, C) column-parallel
            "wk": take(a.wk.weight, kv_lo * D, kv_hi * D),                 # (Hkv_r D, C)
            "wv": take(a.wv.weight, kv_lo * D, kv_hi * D),                 # (Hkv_r D, C)
            "wo": take(a.wo.weight, q_lo * D, q_hi * D, dim=1),            # (C, H/p D) row-parallel
            "ffn_norm": blk.ffn_norm.weight.detach().clone(),
            "w1": take(f.w1.weight, r * F_, (r + 1) * F_),                 # (F/p, C) column-parallel
            "w3": take(f.w3.weight, r * F_, (r + 1) * F_),                 # (F/p, C)
            "w2": take(f.w2.weight, r * F_, (r + 1) * F_, dim=1),          # (C, F/p) row-parallel
        })
    return {"embedding": model.tok_embeddings.weight.detach().clone(),     # (V, C) replicated
            "norm": model.norm.weight.detach().clone(),
            "output": take(model.output.weight, r * V, (r + 1) * V),       # (V/p, C) vocabulary-parallel
            "layers": layers}


def describe_split(cfg, p: int) -> list:
    """Who holds what, as plain data to draw (notebook 12): per rank and weight, its shape (out, in) and the slice
    of the full weight it holds, {"rank", "weight", "shape", "dim" (0: rows = outputs, 1: columns = inputs,
    None: replicated), "lo", "hi"}."""
    D, F_, V, C = cfg.head_dim, cfg.hidden_dim // p, cfg.vocab_size // p, cfg.dim
    out = []
    for r in range(p):
        q_lo, q_hi, kv_lo, kv_hi = head_ranges(cfg, p, r)
        for name, full, dim, lo, hi in (("embedding", (cfg.vocab_size, C), None, 0, cfg.vocab_size),
                                        ("wq", (cfg.n_heads * D, C), 0, q_lo * D, q_hi * D),
                                        ("wk", (cfg.kv_dim, C), 0, kv_lo * D, kv_hi * D),
                                        ("wv", (cfg.kv_dim, C), 0, kv_lo * D, kv_hi * D),
                                        ("wo", (C, cfg.n_heads * D), 1, q_lo * D, q_hi * D),
                                        ("w1", (cfg.hidden_dim, C), 0, r * F_, (r + 1) * F_),
                                        ("w3", (cfg.hidden_dim, C), 0, r * F_, (r + 1) * F_),
                                        ("w2", (C, cfg.hidden_dim), 1, r * F_, (r + 1) * F_),
                                        ("output", (cfg.vocab_size, C), 0, r * V, (r + 1) * V)):
            shape = full if dim is None else tuple(hi - lo if d == dim else n for d, n in enumerate(full))
            out.append({"rank": r, "weight": name, "shape": shape, "full": full, "dim": dim, "lo": lo, "hi": hi})
    return out


class TensorShard:
    """Rank r's share of the model, and of the KV pool: run() is the forward every rank executes in step."""

    def __init__(self, cfg, p: int, r: int, weights: dict, kv_spec: tuple | None = None):
        self.cfg, self.p, self.r = cfg, p, r
        q_lo, q_hi, kv_lo, kv_hi = head_ranges(cfg, p, r)
        self.heads, self.kv_heads = q_hi - q_lo, kv_hi - kv_lo
        self.w = weights
        dtype = weights["embedding"].dtype
        self.rope = RopeTables(cfg, dtype)
        self.attention_norm, self.ffn_norm = [], []
        for lw in weights["layers"]:                 # the model's own RMSNorm: the same op on the same residual
            self.attention_norm.append(_norm(cfg, lw["attention_norm"]))
            self.ffn_norm.append(_norm(cfg, lw["ffn_norm"]))
        self.norm = _norm(cfg, weights["norm"])
        self.kv = None
        if kv_spec is not None:                      # (num_blocks, block_size, dtype): this rank's KV heads only
            num_blocks, block_size, kv_dtype = kv_spec
            shape = SimpleNamespace(n_layers=cfg.n_layers, n_kv_heads=self.kv_heads, head_dim=cfg.head_dim)
            self.kv = KVCache(shape, num_blocks, block_size, kv_dtype)

    def run(self, comm, tokens, positions, attn=None, rows=None, m: int = 1):
        """tokens, positions (B, T); attn: AttentionMetadata (with this rank's KV pool) or None (no cache);
        rows (N,) flat indices -> logits (N, V), or (B, T, V) without rows; the same on every rank. (m: micro-batches,
        a pipeline's; one here.)"""
        B, T = tokens.shape
        kv = self.kv if attn is not None else None
        span = comm.timeline.span
        with span("compute", "embedding"):
            x = F.embedding(tokens, self.w["embedding"])                        # (B, T, C) replicated
            cos, sin = self.rope(positions)                                     # (B, T, D/2) each
        for i, lw in enumerate(self.w["layers"]):
            with span("compute", f"layer {i} attention"):
                h = self._attention(i, lw, self.attention_norm[i](x), cos, sin, kv, attn)   # (B, T, C) partial
            x = x + comm.all_reduce(h)                                          # (B, T, C) whole again
            with span("compute", f"layer {i} MLP"):
                g = self.ffn_norm[i](x)                                         # (B, T, C)
                h = F.linear(F.silu(F.linear(g, lw["w1"])) * F.linear(g, lw["w3"]), lw["w2"])  # (B, T, C) partial
            x = x + comm.all_reduce(h)                                          # (B, T, C)
        with span("compute", "classifier"):
            if rows is not None:
                x = x.reshape(B * T, -1)[rows]                                  # (N, C)
            local = F.linear(self.norm(x), self.w["output"])                    # (N, V/p) or (B, T, V/p)
        return torch.cat(comm.all_gather(local.contiguous()), dim=-1)           # (N, V) or (B, T, V)

    def _attention(self, i: int, lw: dict, x, cos, sin, kv, attn):
        B, T, _ = x.shape
        D = self.cfg.head_dim
        q = F.linear(x, lw["wq"]).view(B, T, self.heads, D)                     # (B, T, H/p, D)
        k = F.linear(x, lw["wk"]).view(B, T, self.kv_heads, D)                  # (B, T, Hkv_r, D)
        v = F.linear(x, lw["wv"]).view(B, T, self.kv_heads, D)                  # (B, T, Hkv_r, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is None:
            y = causal_attention(q, k, v)                                       # (B, T, H/p, D)
        else:
            kv.update(i, attn.slot_mapping, k, v)
            k_pool, v_pool, k_scale, v_scale = kv.layer(i)
            y = paged_attention(q, k_pool, v_pool, attn, k_scale, v_scale)      # (B, T, H/p, D)
        return F.linear(y.reshape(B, T, self.heads * D), lw["wo"])             # (B, T, C) this rank's partial sum


def _norm(cfg, weight) -> RMSNorm:
    n = RMSNorm(cfg.dim, cfg.norm_eps).to(weight.dtype)
    n.weight.data = weight
    return n
