"""Checkers for notebook 02_kv_cache."""
from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import torch
from torch import nn

from ..bench import profiling
from ..bench.profiling import DecodeTiming
from ..llama.attention import AttentionMetadata, paged_attention
from ..llama.transformer import apply_rope
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
    cases = [([3, 0, 7], [0, 1, 15, 16, 40], 16), ([5], [0, 9], 256), ([2, 9, 4, 1], [0, 1, 2, 3, 4, 5, 6, 7], 2)]
    for table, pos, bs in cases:
        want = AttentionMetadata.build(torch.tensor([pos]), torch.tensor([table]), torch.tensor([max(pos) + 1]),
                                       bs).slot_mapping[0].tolist()
        got = [int(s) for s in fn(table, pos, bs)]
        assert got == want, f"table {table}, block_size {bs}: got {got}, expected {want}"
    return "slot = block_table[p // block_size] * block_size + p % block_size"


# ---------------------------------------------------------------------------- core: one decode step with a cache
class _CachedDecode(nn.Module):
    """Stands in for one layer's Attention module. A prompt (T > 1 tokens), or a forward without a cache, runs
    the engine's own code; one new token runs fn on this layer's block of the engine's KV pool, which with
    block_size = max_seq_len (the contiguous cache) is the sequence's whole cache: slot = position."""

    def __init__(self, attention, fn, cos, sin):
        super().__init__()
        self.inner, self.fn, self.cos, self.sin = attention, fn, cos, sin

    def forward(self, x, cos, sin, kv, attn):          # x: (B, T, C)
        B, T, _ = x.shape
        if kv is None or T > 1:
            return self.inner(x, cos, sin, kv, attn)
        if B != 1:
            raise ValueError(f"the plugged decode step runs one sequence at a time, got a batch of {B}")
        a = self.inner
        q = a.wq(x).view(a.n_heads, a.head_dim)         # (H, D)
        k = a.wk(x).view(a.n_kv_heads, a.head_dim)      # (Hkv, D)
        v = a.wv(x).view(a.n_kv_heads, a.head_dim)      # (Hkv, D)
        k_pool, v_pool, _, _ = kv.layer(a.layer_id)     # (num_blocks, block_size, Hkv, D) each
        block = int(attn.block_tables[0, 0])            # the sequence's one block
        y = self.fn(q, k, v, k_pool[block], v_pool[block], int(attn.positions[0, 0]), self.cos, self.sin)  # (H, D)
        return a.wo(torch.as_tensor(y).reshape(1, 1, a.n_heads * a.head_dim))  # (1, 1, C)


@contextlib.contextmanager
def decode_step_plugged(model, fn):
    """Within the block, every layer of `model` runs fn(q, k, v, k_cache, v_cache, pos, cos, sin) for each single
    new token it is given with a KV cache (decode); prompts still run the engine's code. The model's own
    Attention modules come back afterwards, whatever happens."""
    if model.config.family != "llama":
        raise ValueError(f"decode_step_plugged computes a Llama 2 block's q, k, v; this model is "
                         f"{model.config.family!r} (biases or q/k norms the student's step would leave out)")
    S = model.config.max_seq_len
    model.ensure_rope(S)
    dtype = model.tok_embeddings.weight.dtype
    cos, sin = model.rope_cos[:S].to(dtype), model.rope_sin[:S].to(dtype)   # (S, D/2) each
    originals = [block.attention for block in model.layers]
    try:
        for block in model.layers:
            block.attention = _CachedDecode(block.attention, fn, cos, sin)
        yield model
    finally:
        for block, attention in zip(model.layers, originals):
            block.attention = attention


def time_per_token_with(fn, model, n_tokens: int, prompt_ids=None, repeats: int = 1) -> DecodeTiming:
    """profiling.time_per_token_with_cache (the engine's greedy loop over the contiguous cache) with fn doing every
    decode step's cache write and attention, in every layer; keeps the logits (greedy_agreement compares them)."""
    with decode_step_plugged(model, fn):
        timing = profiling.time_per_token_with_cache(model, n_tokens, prompt_ids, repeats, keep_logits=True)
    return replace(timing, method="your cache")


def _rotate(x, cos, sin, p):
    """RoPE at position p. x: (heads, D) -> (heads, D)"""
    return apply_rope(x[None, None], cos[p].view(1, 1, -1), sin[p].view(1, 1, -1))[0, 0]


def _attend(q, keys, values, interleave=True, scale=True):
    """One query token over cached keys, with a switch per common mistake. q: (H, D); keys, values: (n, Hkv, D)
    -> (H, D)"""
    rep = q.shape[0] // keys.shape[1]
    group = (lambda t: t.repeat_interleave(rep, dim=1)) if interleave else (lambda t: t.repeat(1, rep, 1))
    keys, values = group(keys).transpose(0, 1), group(values).transpose(0, 1)   # (H, n, D)
    s = (keys @ q[:, :, None]).squeeze(-1) / (math.sqrt(q.shape[-1]) if scale else 1.0)  # (H, n)
    return (torch.softmax(s, -1)[:, None, :] @ values).squeeze(1)              # (H, D)


def _check_write(case, name, cache, before, want, pos, raw, cos, sin):
    """cache (S, Hkv, D) after the step must be `before` with slot pos holding `want`; else name the mistake."""
    S = cache.shape[0]
    if torch.allclose(cache[pos], want, atol=1e-5):
        moved = [s for s in range(S) if s != pos and not torch.equal(cache[s], before[s])]
        assert not moved, f"{case}: {name} slots {moved} changed too: they hold other tokens (or nothing yet)"
        return
    elsewhere = [s for s in range(S) if s != pos and torch.allclose(cache[s], want, atol=1e-5)]
    assert not elsewhere, (f"{case}: the new token's {name[0].upper()} was written at slot {elsewhere[0]}, not at "
                           f"slot {pos}: off by one? In the contiguous cache a token's slot is its position (the "
                           f"earlier tokens hold slots 0..{pos - 1})")
    if raw is not None:   # K: written where it belongs, but rotated for another position (or not at all)
        for p in (0, pos - 1, pos + 1):
            if 0 <= p < S and p != pos and torch.allclose(cache[pos], _rotate(raw, cos, sin, p), atol=1e-5):
                assert False, (f"{case}: the new token's K is cached with RoPE for position {p}"
                               + (" (that is, not rotated at all)" if p == 0 else "")
                               + ": rotate q and k by cos[pos], sin[pos], the new token's position")
    elif torch.allclose(cache[pos], _rotate(want, cos, sin, pos), atol=1e-5):
        assert False, f"{case}: the new token's V is cached rotated: RoPE turns q and k only, V is cached as it comes"
    assert not torch.equal(cache, before), (f"{case}: {name} is unchanged after the step: write the new token's "
                                            f"{name[0].upper()} into it in place ({name}[pos] = ...); the next steps "
                                            f"read it back")
    assert False, f"{case}: {name}[{pos}] does not hold the new token's {name[0].upper()}" + \
        (" rotated for its position (RoPE at pos)" if raw is not None else "")


DECODE_MISTAKES = [
    ("all", "attends over unwritten slots: only slots 0..pos hold tokens; the slots after pos are junk (zeros in a "
            "fresh cache, stale tokens in a reused one): attend over k_cache[:pos + 1] and v_cache[:pos + 1]"),
    ("self", "leaves out the new token itself: attend over slots 0..pos, pos + 1 keys, after writing slot pos"),
    ("q", "q is not rotated for position pos (k is): rotate both q and k by cos[pos], sin[pos]"),
    ("repeat", "KV heads grouped with repeat: query head h must read KV head h // (H / Hkv) (repeat_interleave)"),
    ("scale", "missing scale: divide the scores q.k by sqrt(D) before the softmax"),
]


@checker(kind="core", signature="q, k, v, k_cache, v_cache, pos, cos, sin",
         allow=("minillm.llama.transformer.apply_rope",))
def check_cached_attention(fn):
    """fn(q (H, D), k, v (Hkv, D), k_cache, v_cache (S, Hkv, D), pos, cos, sin (S, D/2)) -> (H, D): RoPE at pos,
    K and V written at slot pos in place, attention over slots 0..pos. Then plugged into every layer of the
    engine's greedy decode loop, whose tokens and logits must equal recomputing without a cache."""
    from ..config import ModelConfig
    from ..llama.transformer import Transformer, rope_tables
    g = torch.Generator().manual_seed(2)
    # 1. one step on its own: H, Hkv, D, S, pos; slots after pos hold large junk, so reading them shows
    for H, Hkv, D, S, pos in [(4, 2, 8, 12, 6), (2, 2, 4, 6, 0), (6, 3, 8, 10, 9)]:
        cos, sin = (t.float() for t in rope_tables(D, S))                         # (S, D/2) each
        q, k, v = (torch.randn(h, D, generator=g) for h in (H, Hkv, Hkv))         # (H or Hkv, D)
        k_cache, v_cache = (torch.randn(S, Hkv, D, generator=g) for _ in range(2))  # (S, Hkv, D)
        k_cache[pos:] *= 5
        v_cache[pos:] *= 5
        k0, v0 = k_cache.clone(), v_cache.clone()
        y = fn(q.clone(), k.clone(), v.clone(), k_cache, v_cache, pos, cos, sin)
        case = f"H={H} Hkv={Hkv} D={D} S={S} pos={pos}"
        assert isinstance(y, torch.Tensor) and y.shape == (H, D) and y.dtype == q.dtype, \
            f"{case}: returned {tuple(getattr(y, 'shape', ()))} {getattr(y, 'dtype', type(y).__name__)}, " \
            f"expected ({H}, {D}) {q.dtype}"
        q_rot, k_rot = _rotate(q, cos, sin, pos), _rotate(k, cos, sin, pos)      # (H, D), (Hkv, D)
        _check_write(case, "k_cache", k_cache, k0, k_rot, pos, k, cos, sin)
        _check_write(case, "v_cache", v_cache, v0, v, pos, None, cos, sin)
        # the engine's own read: paged_attention over a pool of one block of S slots
        attn = AttentionMetadata.build(torch.tensor([[pos]]), torch.tensor([[0]]), torch.tensor([pos + 1]), S)
        want = paged_attention(q_rot[None, None], k_cache[None], v_cache[None], attn)[0, 0]   # (H, D)
        if not torch.allclose(y, want, atol=1e-4, rtol=1e-4):
            wrong = {"all": _attend(q_rot, k_cache, v_cache), "q": _attend(q, k_cache[:pos + 1], v_cache[:pos + 1]),
                     "self": _attend(q_rot, k_cache[:pos], v_cache[:pos]) if pos else want,
                     "repeat": _attend(q_rot, k_cache[:pos + 1], v_cache[:pos + 1], interleave=False),
                     "scale": _attend(q_rot, k_cache[:pos + 1], v_cache[:pos + 1], scale=False)}
            named = next((m for key, m in DECODE_MISTAKES if not torch.allclose(wrong[key], want, atol=1e-4)
                          and torch.allclose(y, wrong[key], atol=1e-4, rtol=1e-4)), None)
            raise AssertionError(f"{case}: " + (named or f"output differs from the engine's attention over slots "
                                                f"0..pos by {(y - want).abs().max().item():.3g}"))
    # 2. plugged into the engine's decode loop, every layer, against recompute (no cache)
    for H, Hkv, prompt_len, n in [(4, 2, 5, 7), (2, 2, 1, 6)]:
        cfg = ModelConfig(dim=H * 8, hidden_dim=48, n_layers=2, n_heads=H, n_kv_heads=Hkv, vocab_size=96,
                          max_seq_len=16)
        model = Transformer(cfg).init_weights(seed=prompt_len, std=0.3).eval()
        prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=g).tolist()
        mine = time_per_token_with(fn, model, n, prompt)
        recompute = profiling.time_per_token_without_cache(model, n, prompt, repeats=1, keep_logits=True)
        agree = profiling.greedy_agreement(recompute, mine)
        assert agree["tokens_equal"] and agree["max_abs_logit_diff"] < 1e-4, (
            f"H={H} Hkv={Hkv}, prompt of {prompt_len}: in the engine's decode loop your cache gives tokens "
            f"{mine.token_ids}, recompute {recompute.token_ids} (logits differ by {agree['max_abs_logit_diff']:.3g})")
    return ("writes K/V at slot pos with RoPE at pos, reads slots 0..pos only; in every layer of the engine's greedy "
            "loop it gives recompute's tokens and logits (GQA and MHA, prompts of 5 and 1 tokens)")
