"""minillm.bench.spec_memory (notebook 08): what speculative decoding holds in memory, counted from a built
engine's own tensors; and its plot. Byte counts only: nothing here is timed."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from minillm.viz.spec import plot_spec_memory  # noqa: E402

from minillm import LLM  # noqa: E402
from minillm.bench.spec_memory import module_bytes, spec_memory  # noqa: E402
from minillm.llama.kv_cache import KVCache  # noqa: E402
from minillm.spec_decode.medusa_tree import DEFAULT_CHOICES  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_plain_engine_holds_only_the_target():
    eng = LLM("shakespeare", max_num_seqs=2).engine
    m = spec_memory(eng)
    assert m["method"] is None and m["slots_per_seq"] == 0 and m["gamma"] == 0
    assert m["parts"] == {"target weights": module_bytes(eng.model), "target KV pool": eng.kv.nbytes}
    assert m["target_kv_bytes_per_token"] == KVCache.bytes_per_token(eng.model.config)
    assert m["parts"]["target weights"] == 4 * eng.model.config.num_params()   # float32; the tied classifier once


def test_draft_model_adds_its_weights_its_pool_and_gamma_slots_per_sequence():
    gamma, seqs = 3, 2
    eng = LLM("shakespeare", max_num_seqs=seqs, speculative={"method": "draft", "gamma": gamma}).engine
    m = spec_memory(eng)
    per_token = KVCache.bytes_per_token(eng.model.config)
    draft_kv = eng.proposer.kv
    assert m["method"] == "draft" and m["slots_per_seq"] == gamma and m["max_num_seqs"] == seqs
    assert m["parts"]["draft KV pool"] == draft_kv.nbytes
    draft_cfg_bytes = draft_kv.nbytes // (draft_kv.num_blocks * draft_kv.block_size)
    assert draft_cfg_bytes < per_token                                          # the draft's tokens are smaller
    assert m["parts"]["draft weights"] == module_bytes(eng.proposer.runner.model) > 0
    assert m["parts"]["draft weights"] < m["parts"]["target weights"]
    assert m["parts"]["lookahead slots, 1 sequence"] == gamma * per_token
    assert m["parts"][f"lookahead slots, {seqs} sequences"] == gamma * per_token * seqs
    assert "Medusa heads" not in m["parts"]


def test_ngram_adds_only_lookahead_slots():
    m = spec_memory(LLM("shakespeare", max_num_seqs=1, speculative={"method": "ngram", "gamma": 5}).engine)
    assert set(m["parts"]) == {"target weights", "target KV pool", "lookahead slots, 1 sequence",
                               "lookahead slots, 1 sequences"}
    assert m["parts"]["lookahead slots, 1 sequence"] == 5 * m["target_kv_bytes_per_token"]


@pytest.mark.parametrize("gamma", [1, 3])
def test_medusa_takes_a_slot_per_tree_node_and_counts_its_heads(gamma):
    eng = LLM("shakespeare", max_num_seqs=1, speculative={"method": "medusa", "gamma": gamma}).engine
    m = spec_memory(eng)
    nodes = sum(1 for c in DEFAULT_CHOICES if len(c) <= gamma)               # the tree cut to depth gamma
    assert m["slots_per_seq"] == nodes == {1: 6, 3: 14}[gamma]
    assert m["parts"]["lookahead slots, 1 sequence"] == nodes * m["target_kv_bytes_per_token"]
    h = eng.proposer.heads
    assert m["parts"]["Medusa heads"] == 4 * h.num_heads * (h.dim * h.dim + h.dim)   # K (C^2 + C) floats


def test_plot_spec_memory_one_log_bar_per_part_baseline_grey():
    parts = {"target weights": 30 << 20, "target KV pool": 256 << 20, "draft KV pool": 16 << 20,
             "lookahead: 1 sequence": 32 << 10}
    fig = plot_spec_memory(parts)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    widths = [p.get_width() for p in ax.patches]
    np.testing.assert_allclose(widths, list(parts.values()))
    ticks = sorted(zip(ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()]), reverse=True)
    assert [name for _, name in ticks] == list(parts)                          # the first part on top
    colors = [matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches]
    assert colors[0] == colors[1] == "#bbbbbb" and colors[2] != "#bbbbbb"
    assert [t.get_text() for t in ax.texts] == ["30.0 MiB", "256.0 MiB", "16.0 MiB", "32.0 KiB"]
    with pytest.raises(ValueError):
        plot_spec_memory({})
    with pytest.raises(ValueError):
        plot_spec_memory({"nothing": 0})
