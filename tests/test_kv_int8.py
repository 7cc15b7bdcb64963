"""kv_cache_dtype="int8": K and V stored as int8 with a float32 scale per (token, KV head). Bytes,
the per-element error bound, perplexity through the quantized pool, and the engine serving on it."""
import os

import numpy as np
import pytest
import torch

from minillm import LLM, SamplingParams, load
from minillm.config import ModelConfig
from minillm.formats.loader import MODELS_DIR
from minillm.llama.attention import AttentionMetadata
from minillm.llama.kv_cache import KVCache


def test_int8_pool_bytes_and_error_bound():
    cfg = ModelConfig.from_name("shakespeare")
    ratio = KVCache.bytes_per_token(cfg, torch.int8) / KVCache.bytes_per_token(cfg, torch.float32)
    assert ratio == (cfg.head_dim + 4) / (4 * cfg.head_dim) and ratio <= 0.3          # 68 / 256 = 0.27
    kv = KVCache(cfg, num_blocks=3, block_size=4, dtype=torch.int8)
    assert kv.nbytes == 3 * 4 * KVCache.bytes_per_token(cfg, torch.int8)             # scales counted
    k, v = torch.randn(1, 5, cfg.n_kv_heads, cfg.head_dim) * 3, torch.randn(1, 5, cfg.n_kv_heads, cfg.head_dim)
    slots = torch.tensor([[0, 1, 2, 3, 9]])
    kv.update(2, slots, k, v)
    for pool, scale, x in ((kv.k, kv.k_scale, k), (kv.v, kv.v_scale, v)):
        q = pool[2].view(-1, cfg.n_kv_heads, cfg.head_dim)[slots[0]].float()         # (5, Hkv, D)
        s = scale[2].view(-1, cfg.n_kv_heads)[slots[0]]                              # (5, Hkv)
        assert torch.allclose(s, x[0].abs().amax(-1) / 127)
        assert bool(((q * s[..., None] - x[0]).abs() <= s[..., None] / 2 + 1e-6).all())  # half a step


@pytest.fixture(scope="module")
def shipped():
    return load("shakespeare")


def pool_loss(model, tok, kv_dtype):
    """Cross-entropy over the packaged held-out slice in 256-token windows, every window prefilled
    through a paged pool of this dtype (so attention reads back what was quantized)."""
    ids = torch.tensor(tok.encode(open(os.path.join(MODELS_DIR, "val_slice.txt")).read()))
    n, T, bs = (len(ids) - 1) // 256, 256, 16
    x, y = ids[:n * T].view(n, T), ids[1:n * T + 1].view(n, T)
    kv = KVCache(model.config, num_blocks=n * T // bs, block_size=bs, dtype=kv_dtype)
    tables = torch.arange(n * T // bs).view(n, T // bs)                               # (n, M)
    positions = torch.arange(T).expand(n, T)                                          # (n, T)
    attn = AttentionMetadata.build(positions, tables, torch.full((n,), T), bs)
    with torch.no_grad():
        logits = model(x, positions, kv, attn)                                        # (n, T, V)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item()


def test_int8_kv_perplexity_within_half_a_percent(shipped):
    """The issue's goal: delta-ppl <= 0.5%. Measured on the shipped model: -0.01% (3.56318 vs 3.56329 nats)."""
    model, tok = shipped
    base, q = pool_loss(model, tok, torch.float32), pool_loss(model, tok, torch.int8)
    assert np.exp(q - base) - 1 <= 0.005, f"int8 KV: perplexity {np.exp(q - base) - 1:+.3%}"


def test_engine_on_an_int8_pool_holds_more_and_mostly_agrees(shipped):
    model, tok = shipped
    budget = 8 * 1024 * KVCache.bytes_per_token(model.config)                        # 8 full fp32 sequences
    fp32 = LLM(model, tokenizer=tok, kv_cache_bytes=budget)
    int8 = LLM(model, tokenizer=tok, kv_cache_bytes=budget, kv_cache_dtype="int8")
    assert int8.engine.kv.num_blocks >= 3.7 * fp32.engine.kv.num_blocks             # 256 / 68 = 3.76x the tokens
    prompts = ["ROMEO.", "To be, or not to be", "HAMLET.", "Enter KING RICHARD"]
    greedy = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    a = [o.token_ids for o in fp32.generate(prompts, greedy)]
    b = [o.token_ids for o in int8.generate(prompts, greedy)]
    same = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), len(p)) for p, q in zip(a, b)]
    # greedy tokens identical up to the first difference, as a fraction of all. Measured: 192 of 192 (every
    # prompt identical for 48 tokens); the bound leaves room for a low-margin step on another machine, while
    # a wrong scale or layout diverges within a few tokens.
    assert sum(same) >= 0.75 * sum(map(len, a)), same


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_on_an_int8_pool_gives_the_same_tokens(shipped, mode):
    """Swap moves the scales with the values; recompute re-quantizes the same K/V."""
    model, tok = shipped
    per_block = 8 * KVCache.bytes_per_token(model.config, torch.int8)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["ROMEO. " * 3, "To be, or not to be", "HAMLET. " * 2, "Enter KING"]
    small = LLM(model, tokenizer=tok, block_size=8, max_model_len=64, kv_cache_bytes=12 * per_block,
                kv_cache_dtype="int8", preemption_mode=mode, swap_bytes=12 * per_block if mode == "swap" else 0)
    outs = small.generate(prompts, greedy)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    roomy = LLM(model, tokenizer=tok, block_size=8, max_model_len=64, kv_cache_dtype="int8")
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy.generate(prompts, greedy)]


def test_int8_kv_on_another_backend_is_refused():
    with pytest.raises(ValueError,
                       match="backend='cuda' does not run kv_cache_dtype='int8' yet; backends that do: torch, numba"):
        LLM("random:tiny", kv_cache_dtype="int8", backend="cuda")
