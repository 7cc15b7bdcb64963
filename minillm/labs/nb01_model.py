"""Checkers for notebook 01_model_from_scratch."""
from __future__ import annotations

import contextlib
import math

import torch

from .common import _close, checker


@checker
def check_rmsnorm(fn):
    """fn(x (..., C), weight (C,), eps) -> (..., C)"""
    from ..llama.transformer import RMSNorm
    g = torch.Generator().manual_seed(2)
    for shape in [(3, 8), (2, 5, 17), (1, 1, 64)]:
        x, w = torch.randn(shape, generator=g), torch.randn(shape[-1], generator=g)
        ref = RMSNorm(shape[-1], 1e-5)
        ref.weight.data = w
        rms = x.pow(2).mean(-1, keepdim=True)
        _close(f"shape {shape}", fn(x.clone(), w, 1e-5), ref(x).detach(), mistakes={
            "you subtracted the mean: that is LayerNorm; RMSNorm divides by the root mean square only":
                torch.nn.functional.layer_norm(x, (shape[-1],), eps=1e-5) * w,
            "the weight is missing: multiply the normalised x by weight": x * torch.rsqrt(rms + 1e-5),
            "divided by the mean square, not its square root": x / (rms + 1e-5) * w})
    return "matches minillm.llama.transformer.RMSNorm on 3 shapes"


def _rope_rotate_half(x, pos, theta):
    """RoPE as Hugging Face's Llama writes it: the first half of the head dims paired with the second half."""
    D = x.shape[-1]
    angle = pos[..., None].double() * theta ** (-torch.arange(0, D, 2).double() / D)    # (B, T, D/2)
    cos, sin = torch.cat([angle.cos()] * 2, -1)[:, :, None], torch.cat([angle.sin()] * 2, -1)[:, :, None]
    x = x.double()
    return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin


@checker
def check_rope(fn):
    """fn(x (B, T, H, D), positions (B, T), theta) -> (B, T, H, D), pairs (2j, 2j+1) rotated"""
    from ..llama.transformer import apply_rope, rope_tables
    g = torch.Generator().manual_seed(3)
    for B, T, H, D in [(1, 5, 2, 8), (2, 3, 3, 16)]:
        x = torch.randn(B, T, H, D, generator=g)
        pos = torch.randint(0, 100, (B, T), generator=g)
        cos, sin = rope_tables(D, 128, 10000.0)
        _close(f"shape {(B, T, H, D)}", fn(x.clone(), pos, 10000.0), apply_rope(x, cos[pos], sin[pos]), atol=1e-4,
               mistakes={"this is Hugging Face's rotate_half layout (pairs j and j + D/2); llama2.c and minillm rotate "
                         "the adjacent pairs (2j, 2j+1)": _rope_rotate_half(x, pos, 10000.0)})
    return "matches minillm.llama.transformer.apply_rope (llama2.c pair layout) at random positions"


# ---------------------------------------------------------------------------- core: causal grouped-query attention
@contextlib.contextmanager
def attention_swapped(fn):
    """Within the block, the torch model's cache-free attention is fn(q, k, v): Attention.forward looks up
    transformer.causal_attention at every call, so replacing that name plugs fn into every layer of every
    model. The engine's own comes back afterwards, whatever happened (an exception, the time limit)."""
    from ..llama import transformer
    original = transformer.causal_attention
    transformer.causal_attention = lambda q, k, v, dropout=0.0: fn(q, k, v)
    try:
        yield
    finally:
        transformer.causal_attention = original


def _attention(q, k, v, causal=True, interleave=True, scale=True, softmax_dim=-1):
    """Plain causal attention with one switch per common mistake (all on: the right answer).
    q: (B, T, H, D); k, v: (B, T, Hkv, D) -> (B, T, H, D)"""
    T, rep = q.shape[1], q.shape[2] // k.shape[2]
    if interleave:                                            # query head h reads KV head h // rep
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)   # (B, T, H, D)
    else:                                                     # the mistake: KV head h % Hkv
        k, v = k.repeat(1, 1, rep, 1), v.repeat(1, 1, rep, 1)                     # (B, T, H, D)
    s = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)             # (B, H, T, T)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, softmax_dim) @ v.transpose(1, 2)).transpose(1, 2)   # (B, T, H, D)


ATTENTION_MISTAKES = [
    (dict(causal=False), "no causal mask: token t also sees the tokens after it (only the last token's output is "
                         "right); fill the scores where key position > query position with -inf before the softmax"),
    (dict(interleave=False), "KV heads grouped with repeat: query head h must read KV head h // (H / Hkv) "
                             "(repeat_interleave: 0, 0, 1, 1), not h % Hkv (repeat: 0, 1, 0, 1)"),
    (dict(scale=False), "missing scale: divide the scores q.k by sqrt(D) (the head dim) before the softmax"),
    (dict(softmax_dim=-2), "softmax over the wrong axis: each query's weights over the keys must sum to 1 "
                           "(softmax over the last axis of the (T queries, T keys) scores)"),
]


def _name_attention_mistake(fn, B, T, H, Hkv, D, g) -> str:
    """Which common mistake fn's output matches, on fresh inputs of the failing case's shape."""
    q, k, v = (torch.randn(B, T, h, D, generator=g) * 2 for h in (H, Hkv, Hkv))   # (B, T, H or Hkv, D)
    got = torch.as_tensor(fn(q.clone(), k.clone(), v.clone()))
    for flags, message in ATTENTION_MISTAKES:
        wrong = _attention(q, k, v, **flags)
        if got.shape == wrong.shape and torch.allclose(got, wrong, atol=1e-4, rtol=1e-4) \
                and not torch.allclose(wrong, _attention(q, k, v), atol=1e-4, rtol=1e-4):
            return message
    return "not one of the common mistakes: compare your scores, mask and weights with section 5's cell"


@checker(kind="core", signature="q, k, v")
def check_attend(fn):
    """fn(q (B, T, H, D), k, v (B, T, Hkv, D)) -> (B, T, H, D): causal attention, softmax(q.k / sqrt(D)), query head
    h reading KV head h // (H / Hkv). Plugged into the torch Llama model in place of its own attention, the
    model's logits must not change."""
    from ..config import ModelConfig
    from ..llama.transformer import Transformer
    g = torch.Generator().manual_seed(14)
    # B, T, H, Hkv: GQA, MHA, MQA; odd lengths; D = 8
    cases = [(2, 7, 4, 2), (1, 5, 4, 4), (1, 9, 4, 1)]
    for B, T, H, Hkv in cases:
        case = f"B={B} T={T} H={H} Hkv={Hkv} D=8"
        q, k, v = (torch.randn(B, T, h, 8, generator=g) for h in (H, Hkv, Hkv))   # (B, T, H or Hkv, D)
        got = fn(q.clone(), k.clone(), v.clone())
        assert isinstance(got, torch.Tensor), f"{case}: returned {type(got).__name__}, expected a tensor"
        assert got.shape == q.shape and got.dtype == q.dtype, \
            f"{case}: returned {tuple(got.shape)} {got.dtype}, expected {tuple(q.shape)} {q.dtype} (the shape of q)"
        assert torch.isfinite(got).all(), f"{case}: the output holds NaN or inf (a row with every key masked?)"

        # the model: 2 layers, weights large enough that the scores are far from uniform
        cfg = ModelConfig(dim=H * 8, hidden_dim=48, n_layers=2, n_heads=H, n_kv_heads=Hkv, vocab_size=96,
                          max_seq_len=16)
        model = Transformer(cfg).init_weights(seed=T, std=0.3).eval()
        tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=g)     # (B, T)
        with torch.no_grad():
            want = model(tokens)                                           # (B, T, V) the engine's attention
            with attention_swapped(fn):
                mine = model(tokens)                                       # (B, T, V) yours, in every layer
        bad = ((mine - want).abs() > 1e-4 + 1e-4 * want.abs()).any(-1).any(0)   # (T,) positions that differ
        if bad.any():
            same = (~bad).nonzero().flatten().tolist()
            raise AssertionError(
                f"{case}: the model's logits with your attention differ from its own at positions "
                f"{bad.nonzero().flatten().tolist()} of 0..{T - 1} (same at {same or 'none'}): "
                f"{_name_attention_mistake(fn, B, T, H, Hkv, 8, g)}")
    return ("the model's logits with your attention in every layer == with its own (to 1e-4): GQA (H=4, Hkv=2), "
            "MHA (Hkv=4) and MQA (Hkv=1), T = 7, 5, 9")
