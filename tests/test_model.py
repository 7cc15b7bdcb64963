"""The model against an independent reference: a plain numpy port of run.c's forward, in float64."""
import numpy as np
import pytest
import torch
from close import assert_close

from minillm.config import ModelConfig
from minillm.llama.attention import AttentionMetadata
from minillm.llama.kv_cache import KVCache
from minillm.llama.transformer import Transformer


def runc_forward(w: dict, cfg: ModelConfig, tokens: list[int]) -> np.ndarray:
    """run.c's forward(), token by token, with its own K/V arrays. w: numpy float64 weights -> (T, V)."""
    C, D, H, Hkv = cfg.dim, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    L, S = cfg.n_layers, len(tokens)
    key_cache = np.zeros((L, S, Hkv * D))
    value_cache = np.zeros((L, S, Hkv * D))

    def rmsnorm(x, weight):
        return weight * (x / np.sqrt(np.mean(x * x) + 1e-5))

    out = []
    for pos, tok in enumerate(tokens):
        x = w["tok_embeddings.weight"][tok].copy()
        for li in range(L):
            p = f"layers.{li}."
            xb = rmsnorm(x, w[p + "attention_norm.weight"])
            q = w[p + "attention.wq.weight"] @ xb
            k = w[p + "attention.wk.weight"] @ xb
            v = w[p + "attention.wv.weight"] @ xb
            for i in range(0, C, 2):  # RoPE exactly as run.c: pairs (i, i+1), freq from i % head_size
                e = np.float32(i % D) / np.float32(D)                # run.c's angle, in float32
                freq = np.float32(1.0) / np.float32(10000.0 ** float(e))
                val = float(np.float32(pos) * freq)
                c, s = np.cos(val), np.sin(val)
                for vec in ([q, k] if i < Hkv * D else [q]):
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * c - v1 * s, v0 * s + v1 * c
            key_cache[li, pos], value_cache[li, pos] = k, v
            att_out = np.zeros(C)
            for h in range(H):
                kvh = h // (H // Hkv)
                qh = q[h * D:(h + 1) * D]
                scores = np.array([qh @ key_cache[li, t, kvh * D:(kvh + 1) * D] for t in range(pos + 1)]) / np.sqrt(D)
                e = np.exp(scores - scores.max())
                a = e / e.sum()
                att_out[h * D:(h + 1) * D] = sum(a[t] * value_cache[li, t, kvh * D:(kvh + 1) * D]
                                                 for t in range(pos + 1))
            x = x + w[p + "attention.wo.weight"] @ att_out
            xb = rmsnorm(x, w[p + "ffn_norm.weight"])
            h1, h3 = w[p + "feed_forward.w1.weight"] @ xb, w[p + "feed_forward.w3.weight"] @ xb
            x = x + w[p + "feed_forward.w2.weight"] @ (h1 / (1 + np.exp(-h1)) * h3)
        out.append(w["output.weight"] @ rmsnorm(x, w["norm.weight"]))
    return np.stack(out)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_model_matches_runc_reference(kv_heads, shared):
    cfg = ModelConfig(dim=32, hidden_dim=80, n_layers=2, n_heads=4, n_kv_heads=kv_heads, vocab_size=50,
                      max_seq_len=32, shared_classifier=shared)
    model = Transformer(cfg).init_weights(seed=kv_heads, std=0.3).double().eval()
    tokens = torch.randint(0, 50, (1, 13), generator=torch.Generator().manual_seed(0))
    w = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    want = runc_forward(w, cfg, tokens[0].tolist())                          # (T, V)
    got = model(tokens)[0].detach()                                          # (T, V)
    assert_close(got, torch.from_numpy(want), name="logits vs run.c reference (float64)")
    # a missing RoPE or GQA mistake shows at positions > 0: make sure those positions carry signal
    assert np.abs(want[1:] - want[0]).max() > 1e-2


@pytest.mark.parametrize("block_size", [1, 3, 16, 32])
def test_cached_decode_equals_full_forward(block_size):
    """Prefill 5 tokens, then decode one at a time through the pool: same logits as one full forward."""
    cfg = ModelConfig.from_name("tiny", max_seq_len=32)
    model = Transformer(cfg).init_weights(seed=1, std=0.2).double().eval()
    T = 20
    tokens = torch.randint(0, cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(1))
    full = model(tokens)[0]                                                  # (T, V)
    n_blocks = -(-T // block_size)
    kv = KVCache(cfg, num_blocks=n_blocks + 3, block_size=block_size, dtype=torch.float64)
    # scattered blocks
    table = torch.randperm(n_blocks + 3, generator=torch.Generator().manual_seed(2))[:n_blocks][None]  # (1, M)
    got = []
    with torch.no_grad():
        for lo, hi in [(0, 5)] + [(t, t + 1) for t in range(5, T)]:
            pos = torch.arange(lo, hi)[None]                                 # (1, t)
            attn = AttentionMetadata.build(pos, table, torch.tensor([hi]), block_size)
            got.append(model(tokens[:, lo:hi], pos, kv, attn)[0])
    assert_close(torch.cat(got), full, name=f"paged (block_size={block_size}) vs full forward")


def test_batched_padded_prefill_equals_single():
    """Two sequences of different lengths in one right-padded batch == each on its own (float64)."""
    cfg = ModelConfig.from_name("tiny", max_seq_len=64)
    model = Transformer(cfg).init_weights(seed=3, std=0.2).double().eval()
    a = torch.randint(0, cfg.vocab_size, (9,), generator=torch.Generator().manual_seed(3))
    b = torch.randint(0, cfg.vocab_size, (4,), generator=torch.Generator().manual_seed(4))
    kv = KVCache(cfg, num_blocks=8, block_size=8, dtype=torch.float64)
    tokens = torch.zeros(2, 9, dtype=torch.long)
    tokens[0], tokens[1, :4] = a, b
    pos = torch.arange(9).expand(2, 9)
    valid = torch.arange(9)[None] < torch.tensor([[9], [4]])
    attn = AttentionMetadata.build(pos, torch.tensor([[0, 1], [5, 6]]), torch.tensor([9, 4]), 8, valid)
    with torch.no_grad():
        both = model(tokens, pos, kv, attn)
        assert_close(both[0], model(a[None])[0], name="row 0")
        assert_close(both[1, :4], model(b[None])[0], name="row 1")
    assert (attn.slot_mapping[1, 4:] == -1).all()  # padding is never written


def test_training_forward_backward_and_dropout():
    cfg = ModelConfig.from_name("tiny", dropout=0.5)
    model = Transformer(cfg).init_weights(0)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    model.train()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten())
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))  # no dropout in eval
        model.train()
        assert not torch.equal(model(x), model(x))  # dropout in training


def test_position_beyond_context_raises():
    cfg = ModelConfig.from_name("tiny", max_seq_len=8)
    model = Transformer(cfg).eval()
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("kw,match", [(dict(dim=30, n_heads=4), "not divisible by n_heads"),
                                      (dict(n_heads=4, n_kv_heads=3), "not divisible by n_kv_heads"),
                                      (dict(vocab_size=0), "vocab_size")])
def test_bad_config(kw, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_name("tiny", **kw)


def test_presets_and_unknown_name():
    # stories15M.bin is 60,816,028 bytes: 28 header + 2 RoPE tables (256 x 24 floats) + the parameters
    assert ModelConfig.from_name("stories15M").num_params() == (60_816_028 - 28 - 2 * 256 * 24 * 4) // 4
    s = ModelConfig.from_name("shakespeare")
    assert (s.dim, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.max_seq_len) == (256, 8, 4, 2, 64, 1024)
    with pytest.raises(ValueError, match="available: .*stories15M"):
        ModelConfig.from_name("gpt5")


def test_draft_is_under_a_tenth_of_the_target_flops():
    t, d = ModelConfig.from_name("shakespeare"), ModelConfig.from_name("shakespeare-draft")
    for ctx in (0, 256, 1024):
        assert d.flops_per_token(ctx) <= 0.1 * t.flops_per_token(ctx)
    assert d.vocab_size == t.vocab_size
