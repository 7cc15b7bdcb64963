"""minillm.bench.profiling: invariants of the measurements (never a timing)."""
import pytest
import torch

from minillm.bench import profiling as P
from minillm.bench import roofline as R
from minillm.config import ModelConfig
from minillm.formats.loader import random_model
from minillm.llama.kv_cache import KVCache


@pytest.fixture(scope="module")
def tiny():
    return random_model("tiny")[0]


def test_with_and_without_cache_agree(tiny):
    """The cache is an optimisation only: same greedy tokens, same logits, at every step."""
    n, prompt = 24, [1, 300, 17, 42, 5]
    w = P.time_per_token_with_cache(tiny, n, prompt_ids=prompt, repeats=1, keep_logits=True)
    wo = P.time_per_token_without_cache(tiny, n, prompt_ids=prompt, repeats=1, keep_logits=True)
    agree = P.greedy_agreement(w, wo)  # DESIGN rule 7: tokens compared up to the first near-tie
    assert agree["tokens_equal"] and agree["steps_compared"] >= n // 2, agree
    assert w.logits.shape == wo.logits.shape == (n, tiny.config.vocab_size)
    assert (w.logits - wo.logits).abs().max().item() < 1e-4


def test_decode_timing_shapes(tiny):
    for fn, method in [(P.time_per_token_with_cache, "kv cache"), (P.time_per_token_without_cache, "no cache")]:
        t = fn(tiny, 10, repeats=2)
        assert t.method == method and t.repeats == 2 and t.threads == 1
        assert t.prompt_len == 1 and t.context_lens == list(range(1, 11))
        assert len(t.seconds) == len(t.token_ids) == len(t.cumulative_seconds) == 10
        assert all(s > 0 for s in t.seconds) and t.logits is None
        assert t.cumulative_seconds == sorted(t.cumulative_seconds)
        assert t.cumulative_seconds[-1] == pytest.approx(sum(t.seconds))
        assert t.tail_median(4) > 0 and t.head_median(4) > 0


def test_decode_runs_up_to_the_context_limit():
    model = random_model("tiny", max_seq_len=16)[0]
    t = P.time_per_token_with_cache(model, 16, repeats=1)  # BOS + 15 new tokens fill positions 0..15
    assert t.context_lens[-1] == 16
    with pytest.raises(ValueError, match="max_seq_len is 16"):
        P.time_per_token_without_cache(model, 17, repeats=1)
    with pytest.raises(ValueError, match="n_tokens"):
        P.time_per_token_with_cache(model, 0)
    with pytest.raises(ValueError, match="repeats"):
        P.time_per_token_with_cache(model, 2, repeats=0)


def test_threads_are_restored(tiny):
    before = torch.get_num_threads()
    P.time_per_token_with_cache(tiny, 3, repeats=1, threads=1)
    P.prefill_vs_decode(tiny, 4, repeats=1, threads=1)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"):
        P.time_per_token_with_cache(tiny, 3, threads=0)


def test_prefill_vs_decode(tiny):
    r = P.prefill_vs_decode(tiny, 8, repeats=1)
    assert r.n_tokens == 8 and r.prefill_seconds > 0 and r.decode_seconds > 0
    assert r.prefill_tokens_per_s == pytest.approx(8 / r.prefill_seconds)
    with pytest.raises(ValueError, match="n_tokens"):
        P.prefill_vs_decode(tiny, tiny.config.max_seq_len + 1)


@pytest.mark.parametrize("name", ["tiny", "shakespeare", "shakespeare-draft", "stories15M"])
def test_measured_bytes_equal_formula(name):
    cfg = ModelConfig.from_name(name)
    for n in (1, 7, 64):
        for dtype, elem in [(torch.float32, 4), (torch.float16, 2), (torch.bfloat16, 2)]:
            r = P.kv_cache_bytes(cfg, n, dtype)
            assert r.bytes_per_elem == elem
            assert r.measured == r.formula == 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * elem * n
            assert r.per_token == cfg.kv_bytes_per_token(elem)


def test_kv_bytes_by_preset_defaults_to_full_context():
    rows = P.kv_bytes_by_preset(["tiny", "shakespeare"])
    assert [r.label for r in rows] == ["tiny", "shakespeare"]
    assert [r.n_tokens for r in rows] == [256, 1024]
    assert rows[1].measured == 8 * 2**20   # 2 x 8 layers x 2 KV heads x 64 x 4 bytes x 1024 tokens
    assert all(r.measured == r.formula for r in rows)


def test_mha_vs_gqa_only_kv_heads_change():
    rows = P.mha_vs_gqa("shakespeare", 1024)
    assert [r.n_kv_heads for r in rows] == [4, 2, 1]
    assert [r.label.split()[0] for r in rows] == ["MHA", "GQA", "MQA"]
    assert {(r.n_layers, r.n_heads, r.head_dim) for r in rows} == {(8, 4, 64)}
    assert [r.measured for r in rows] == [16 * 2**20, 8 * 2**20, 4 * 2**20]
    assert [r.n_kv_heads for r in P.mha_vs_gqa("stories15M", 4)] == [6, 3, 2, 1]
    assert len(P.mha_vs_gqa("tiny", 4, kv_heads=[2])) == 1


def test_kv_bytes_vs_length_is_linear():
    cfg = ModelConfig.from_name("tiny")
    got = P.kv_bytes_vs_length(cfg, [1, 2, 10])
    assert got == [KVCache.bytes_for(cfg, 1, n) for n in (1, 2, 10)]


def test_greedy_agreement(tiny):
    a = P.time_per_token_with_cache(tiny, 6, repeats=1, keep_logits=True)
    b = P.time_per_token_without_cache(tiny, 6, repeats=1, keep_logits=True)
    r = P.greedy_agreement(a, b)
    assert r["steps_total"] == 6 and r["steps_compared"] <= 6 and r["tokens_equal"] and r["max_abs_logit_diff"] < 1e-4
    assert P.greedy_agreement(a, b, margin=float("inf"))["steps_compared"] == 0   # every step a "near tie"
    with pytest.raises(ValueError, match="keep_logits"):
        P.greedy_agreement(P.time_per_token_with_cache(tiny, 2, repeats=1), b)


def test_forward_breakdown_counts_every_parameter(tiny):
    r = P.forward_breakdown(tiny, 8, repeats=1)
    assert list(r.params) == list(P.PARTS) == list(r.seconds)
    assert r.tied_classifier and r.params["classifier"] == 0
    assert sum(r.params.values()) == sum(p.numel() for p in tiny.parameters()) == tiny.config.num_params()
    assert all(s > 0 for s in r.seconds.values()) and r.total_seconds > 0
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in tiny.modules())   # hooks removed
    untied = random_model("tiny", shared_classifier=False)[0]
    r = P.forward_breakdown(untied, 4, repeats=1)
    assert not r.tied_classifier and r.params["classifier"] == r.params["embedding"] == 512 * 64


def test_matmul_cost_by_hand():
    c = R.matmul_cost(2, 3, 4)                       # y (2, 4) = x (2, 3) @ W (4, 3)^T
    assert c["flops"] == 2 * 2 * 3 * 4 == 48          # a multiply and an add per weight per row
    assert c["bytes"] == 4 * (2 * 3 + 4 * 3 + 2 * 4) == 104
    assert c["intensity"] == pytest.approx(48 / 104)
    p = R.matmul_point(2, 3, 4, repeats=1)
    assert {k: p[k] for k in c} == c and p["seconds"] > 0
    assert p["flop_s"] == pytest.approx(p["flops"] / p["seconds"])
    with pytest.raises(ValueError, match="M, K, N"):
        R.matmul_point(0, 3, 4)


def test_memory_bandwidth_is_a_rate():
    assert R.memory_bandwidth(2**20, repeats=1) > 0
    with pytest.raises(ValueError, match="repeats"):
        R.memory_bandwidth(2**20, repeats=0)


def test_roofline_intensity_grows_with_m():
    cfg = ModelConfig.from_name("tiny")
    r = R.roofline(cfg, batch_sizes=(1, 4, 16), prefill_tokens=(64,), peak_size=64, repeats=1)
    assert [(p["kind"], p["M"]) for p in r["points"]] == [("decode", 1), ("decode", 4), ("decode", 16), ("prefill", 64)]
    intensity = [p["intensity"] for p in r["points"]]
    assert intensity == sorted(intensity) and intensity[0] < 0.5 < intensity[-1]   # M = 1 re-reads W per row
    one = r["points"][0]                             # the layer's seven matmuls at M = 1, summed
    C, Hd, kv = cfg.dim, cfg.hidden_dim, cfg.kv_dim
    assert one["flops"] == 2 * (2 * C * C + 2 * kv * C + 3 * Hd * C)
    assert one["bytes"] == sum(4 * (K + N * K + N) for _, N, K in R.layer_matmuls(cfg))   # x, W, y of each
    assert r["peak_flop_s"] >= max(p["flop_s"] for p in r["points"])          # nothing sits above the roof
    assert r["ridge_intensity"] == pytest.approx(r["peak_flop_s"] / r["bandwidth"])
