"""MoE measurements (minillm.bench.moe) and fine-tuning (minillm.training.moe): compute vs parameters, expert-parallel
traffic by count and by formula, tokens per expert per engine step, routing on a text, the training loop's frozen
weights and the CLI's presets; `bench moe --quick` as a smoke test."""
import copy
import json

import numpy as np
import pytest
import torch

import minillm
from minillm.bench.moe import (
    compute_vs_params,
    expected_remote_ranks,
    expert_parallel_traffic,
    load_per_step,
    routing_on_text,
)
from minillm.config import ModelConfig
from minillm.formats.llama2c import save_bin
from minillm.formats.loader import random_model
from minillm.moe.experts import MoEConfig, moe_layers, upcycle
from minillm.training.moe import MOE_PRESETS, finetune, main, prune_ffn
from minillm.training.train import TrainConfig


@pytest.fixture(scope="module")
def tiny_moe():
    dense, tok = random_model("tiny", seed=7)
    return dense, upcycle(copy.deepcopy(dense), MoEConfig(4, 2, 48)).eval(), tok


def test_compute_vs_params_for_the_shipped_shape():
    cfg = ModelConfig.from_name("shakespeare")
    c = compute_vs_params(cfg, MoEConfig(4, 2, 192))
    ffn = 8 * 3 * 256 * 192
    assert c["ffn_params_total"] == 4 * ffn and c["ffn_params_active"] == 2 * ffn and c["router_params"] == 8 * 256 * 4
    assert c["params_total"] == cfg.num_params() + 8 * 256 * 4          # every expert = the dense FFN, plus routers
    assert c["params_total"] - c["params_active"] == 2 * ffn
    assert c["flops_per_token_all_experts"] - c["flops_per_token_active"] == 2 * 2 * ffn   # 2 FLOPs per weight


def test_expected_remote_ranks_formula():
    assert expected_remote_ranks(4, 2, 2) == pytest.approx(5 / 6)        # 1 - C(2,2)/C(4,2): both local 1 in 6
    assert expected_remote_ranks(4, 4, 2) == 1.0 and expected_remote_ranks(4, 1, 2) == 0.5
    assert expected_remote_ranks(8, 2, 4) == pytest.approx(3 * (1 - 15 / 28))


def test_expert_parallel_traffic_counts_hand_made_routing():
    # 4 tokens, 1 layer: tokens 0-1 live on rank 0, 2-3 on rank 1; experts 0-1 on rank 0, 2-3 on rank 1
    experts = [[[0, 1], [0, 2], [2, 3], [3, 0]]]
    r = expert_parallel_traffic(experts, n_experts=4, dim=8, ranks=2, bytes_per_elem=2)
    # token 0: both local (0 sends); token 1: expert 2 remote (1); token 2: both local (0); token 3: expert 0 (1)
    assert r["messages_per_token_layer"] == 0.5
    assert r["bytes_per_token"] == 2 * 16 * 0.5                          # dispatch + combine of 16-byte vectors
    assert r["remote_assignment_fraction"] == 2 / 8
    both_remote = expert_parallel_traffic([[[2, 3], [2, 3]]], 4, 8)       # two tokens on rank 0 and rank 1
    assert both_remote["messages_per_token_layer"] == 0.5                 # deduplicated: one message, not two
    assert both_remote["bytes_per_token_naive"] == 2 * 16 * 1.0           # per assignment: token 0 sends twice


def test_expert_parallel_traffic_matches_the_formula_under_uniform_routing():
    """20,000 tokens x 3 layers of uniformly random top-2 choices: the count's standard error is ~0.2% of the
    mean (a Bernoulli(5/6) per token-layer), so 2% is > 5 sigma."""
    g = torch.Generator().manual_seed(0)
    experts = torch.rand(3, 20000, 4, generator=g).argsort(-1)[..., :2]    # (L, N, k): 2 distinct, uniform
    r = expert_parallel_traffic(experts, 4, 256)
    assert r["bytes_per_token"] == pytest.approx(r["bytes_per_token_formula"], rel=0.02)
    assert r["bytes_per_token_formula"] == pytest.approx(2 * 3 * 512 * 5 / 6)


def test_routing_on_text_and_load_per_step(tiny_moe):
    _, moe, tok = tiny_moe
    r = routing_on_text(moe, tok, "To be, or not to be, that is the question", 12)
    T = len(r["pieces"])
    assert np.array(r["experts"]).shape == (2, T, 2) and np.array(r["probs"]).shape == (2, T, 4)
    assert [sum(row) for row in r["load"]] == [2 * T, 2 * T]
    llm = minillm.LLM(moe, tokenizer=tok, max_model_len=64)
    steps = load_per_step(llm, [[1, 5, 6, 7], [1, 9]], minillm.SamplingParams(temperature=0, max_tokens=3,
                                                                              ignore_eos=True))
    decode = [s for s in steps if s["kind"] == "decode"]
    assert decode and all(s["rows"] == s["tokens"] for s in decode)      # decode rows are real tokens
    assert all(sum(layer) == 2 * s["rows"] for s in steps for layer in s["load"])   # k = 2 assignments per row
    assert sum(s["tokens"] for s in steps) == 4 + 2 + 2 * 2               # prompts, then 2 more tokens each


def test_finetune_trains_only_the_ffns(tiny_moe, tmp_path):
    dense, moe, _ = tiny_moe
    model = copy.deepcopy(moe)
    for name, p in model.named_parameters():
        p.requires_grad_(".feed_forward." in name)
    params = [p for p in model.parameters() if p.requires_grad]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = np.random.default_rng(0).integers(0, 512, 4000).astype(np.uint16)
    tc = TrainConfig(out_dir=str(tmp_path), batch_size=2, seq_len=16, max_steps=4, eval_every=2, eval_windows=2,
                     warmup_steps=1, dropout=0.0)
    s = finetune(model, params, ids, ids, tc, aux_coef=0.01, log=lambda *_: None, stop_step=3)
    assert s["steps"] == 3 and s["stop_reason"] == "stop_step" and s["tokens"] == 3 * 2 * 16
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".feed_forward." in n for n in changed)
    assert any("router" in n for n in changed)
    assert "val_imbalance" in s and len(s["val_imbalance"]["cv"]) == 2


def test_prune_ffn_keeps_the_most_important_units(tiny_moe):
    dense, _, _ = tiny_moe
    small = prune_ffn(dense, torch.randint(0, 512, (2, 16)), 96)
    assert small.config.hidden_dim == 96 and small.layers[0].feed_forward.w1.weight.shape == (96, 64)
    rows = {tuple(r.tolist()) for r in dense.layers[0].feed_forward.w1.weight}
    assert all(tuple(r.tolist()) in rows for r in small.layers[0].feed_forward.w1.weight)   # a subset, not new


def test_train_cli_runs_the_moe_presets_and_passes_others_on(tmp_path):
    assert set(MOE_PRESETS) == {"shakespeare-moe", "shakespeare-ffn384", "shakespeare-ffn768"}
    (tmp_path / "state.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="already holds a run"):          # train.py's own check: passed on
        main(["--preset", "tiny", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--aux-loss must be >= 0"):
        main(["--preset", "shakespeare-moe", "--init-from", "x.bin", "--out", str(tmp_path), "--aux-loss", "-1"])


def test_bench_moe_quick(tmp_path):
    from minillm.bench.cli import main as bench
    out = tmp_path / "moe.json"
    assert bench(["moe", "--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["decode_tok_s"]) == {"1", "16"} and res["decode_tok_s"]["16"]["moe"] > 0
    assert res["compute"]["active_fraction"] < 1 and res["expert_parallel"]["bytes_per_token"] > 0
    assert set(res["val_loss_live"]) == {"shakespeare", "shakespeare-moe"}


def test_tiny_file_round_trip_through_cli_loader(tiny_moe, tmp_path):
    """minillm.load takes the MoE file by path and returns the same routing as the model it was saved from."""
    from minillm.formats.moe import save_moe
    dense, moe, tok = tiny_moe
    save_bin(dense, tmp_path / "base.bin")
    save_moe(moe, tmp_path / "moe.safetensors", tmp_path / "base.bin")
    net, _ = minillm.load(str(tmp_path / "moe.safetensors"), tokenizer=tok)
    assert len(moe_layers(net)) == 2


def test_card_section_is_written_once_and_replaced(tmp_path):
    from minillm.training.moe_ship import write_card_section
    card = tmp_path / "MODEL_CARD.md"
    card.write_text("# Shipped models\n\nthe rest of the card\n")
    run = {"best_val_loss": 3.9, "init_val_loss": 4.2, "steps": 300, "tokens": 614400, "seconds": 600.0,
           "stop_reason": "max_steps", "aux_loss_coef": 0.01, "trainable_params": 10}
    entry = {"runs": {"moe": run, "ffn384": dict(run, best_val_loss=4.0)}, "moe": MoEConfig(4, 2, 192).to_dict(),
             "train_config": TrainConfig().__dict__, "file_bytes": 9_457_208, "val_loss": 3.85, "aux_loss_coef": 0.01,
             "commands": ["python -m minillm train --preset shakespeare-moe"], "router_init": "fit",
             **compute_vs_params(ModelConfig.from_name("shakespeare"), MoEConfig(4, 2, 192))}
    write_card_section(str(card), entry, 3.72)
    write_card_section(str(card), dict(entry, val_loss=3.80), 3.72)
    text = card.read_text()
    assert text.startswith("# Shipped models\n\nthe rest of the card\n")
    assert text.count("## Mixture of experts") == 1 and "3.8000" in text and "3.8500" not in text
    assert "| dense FFN 384 (equal active) | 10 | 0.01 | 4.2000 | 4.0000 | 300 | 614,400 | 10.0 |" in text
    assert "the MoE is 0.1000 nats lower (3.9000 vs 4.0000)" in text


def test_routing_diagnostics_all_experts_is_the_dense_model_and_routing_is_restored(tiny_moe):
    from minillm.training.moe import routing_diagnostics
    from minillm.training.train import evaluate
    dense, moe, _ = tiny_moe
    x = torch.randint(0, 512, (3, 16), generator=torch.Generator().manual_seed(4))
    y = torch.roll(x, -1, 1)
    d = routing_diagnostics(moe, x, y)
    assert d["all_experts"] == pytest.approx(evaluate(dense, x, y), abs=1e-5)    # float32: E partial sums vs one
    assert d["learned"] == evaluate(moe, x, y) and "route" not in vars(moe_layers(moe)[0])
    assert set(d) == {"learned", "all_experts", "oracle", "random"}
