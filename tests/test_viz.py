"""minillm.viz: every plot function draws small data under Agg and returns a Figure with what it should."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import minillm.viz as viz  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from minillm.bench import profiling as P  # noqa: E402
from minillm.config import ModelConfig  # noqa: E402
from minillm.core.trace import StepRecord  # noqa: E402
from minillm.llama.transformer import rope_tables  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def timing(method, n, repeats=3):
    secs = [1e-3 * (1 + i) for i in range(n)]
    return P.DecodeTiming(method, 1, list(range(1, n + 1)), secs, list(range(n)), None, repeats)


def step(i, kind, n):
    return StepRecord(i, kind, [0], n if kind == "prefill" else 0, n if kind == "decode" else 0,
                      1, 3, 100, 50, 0.0, 1e-3 * (i + 1))


def bars(ax):
    return [p for c in ax.containers for p in c]


def test_engine_path_is_a_diagram():
    fig = viz.draw_engine_path()
    assert isinstance(fig, Figure)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "RequestOutput" in texts and "sampler" in texts


def test_plot_trace():
    fig = viz.plot_trace([step(0, "prefill", 7), step(1, "decode", 2), step(2, "decode", 2)])
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert [len(bars(ax)) for ax in fig.axes] == [3, 3]
    assert [b.get_height() for b in bars(fig.axes[1])] == [7, 2, 2]
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["prefill", "decode"]
    with pytest.raises(ValueError, match="no steps"):
        viz.plot_trace([])


def test_next_token_distribution():
    logits = torch.randn(30)
    fig = viz.plot_next_token_distribution(logits, temperatures=(0.5, 1.0, 2.0), k=5)
    assert len(bars(fig.axes[0])) == 15
    labels = [f"t{i}" for i in range(30)]
    fig = viz.plot_next_token_distribution(logits, temperatures=(1.0,), top_p=0.5, k=40, labels=labels)
    assert len(bars(fig.axes[0])) == 30          # k is capped at the vocabulary
    assert abs(sum(b.get_height() for b in bars(fig.axes[0])) - 1.0) < 1e-5


def test_sampling_explorer_is_a_widget():
    import ipywidgets
    w = viz.sampling_explorer(torch.randn(20), k=5)
    assert isinstance(w, ipywidgets.interactive)
    assert {c.description for c in w.children[:2]} == {"temperature", "top_p"}


def test_llama_block_diagram():
    cfg = ModelConfig.from_name("tiny")
    steps = viz.llama_steps(cfg, T=5)
    assert steps[0] == ("tokens", "(1, 5)") and steps[-1][1] == "logits (1, 5, 512)"
    fig = viz.draw_llama_block(cfg)
    assert isinstance(fig, Figure)
    assert sum("(1, 5, 64)" in t.get_text() for t in fig.axes[0].texts) >= 3


def test_plot_attention():
    probs = torch.softmax(torch.randn(4, 4).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf")), -1)
    fig = viz.plot_attention(probs, labels=list("abcd"))
    ax = fig.axes[0]
    assert len(ax.images) == 1 and [t.get_text() for t in ax.get_xticklabels()] == list("abcd")
    shown = ax.images[0].get_array()
    assert shown.mask[0, 1] and not shown.mask[1, 0]   # the future is blank, the past is drawn


def test_plot_rope():
    cos, sin = rope_tables(16, 32)
    fig = viz.plot_rope(cos, sin, pairs=[0, 3, 7], n_positions=20, arrows=5)
    left, right = fig.axes
    assert len(right.lines) == 3 and all(len(line.get_xdata()) == 20 for line in right.lines)
    assert len([t for t in left.texts if t.get_text().startswith("pos")]) == 5


def test_recompute_grid():
    fig = viz.draw_recompute_grid(5)
    assert len(fig.axes) == 2 and all(len(ax.patches) == 25 for ax in fig.axes)
    assert "15 token computations" in fig.axes[0].get_title() and "5 token computations" in fig.axes[1].get_title()


def test_plot_kv_bytes():
    rows = P.mha_vs_gqa("tiny", 8)
    fig = viz.plot_kv_bytes(rows)
    assert len(bars(fig.axes[0])) == 2 * len(rows)


def test_plot_kv_bytes_vs_length():
    fig = viz.plot_kv_bytes_vs_length([1, 2, 4], {"a": [1, 2, 4], "b": [2, 4, 8]})
    assert len(fig.axes[0].lines) == 2


def test_draw_kv_pool():
    fig = viz.draw_kv_pool({"A": [2, 0], "B": [1]}, {"A": 5, "B": 3}, num_blocks=4, block_size=4)
    ax = fig.axes[0]
    assert len(ax.patches) == 16
    assert sorted(int(t.get_text()) for t in ax.texts) == list(range(16))   # every slot is numbered


def test_plot_decode_timing():
    fig = viz.plot_decode_timing(timing("no cache", 12), timing("kv cache", 12, repeats=1))
    left, right = fig.axes
    assert len(left.lines) == 2 and len(right.lines) == 2
    assert [line.get_label() for line in left.lines] == ["no cache (median of 3)", "kv cache"]
    assert right.lines[0].get_ydata()[-1] == pytest.approx(sum(1e-3 * (1 + i) for i in range(12)))
    with pytest.raises(ValueError):
        viz.plot_decode_timing()


def test_plot_prefill_vs_decode():
    fig = viz.plot_prefill_vs_decode(P.PrefillDecode(16, 0.001, 0.05))
    heights = [b.get_height() for b in bars(fig.axes[0])]
    assert heights == pytest.approx([16000, 320])


def test_viz_is_not_imported_by_the_engine():
    import subprocess
    import sys
    code = ("import sys, minillm, minillm.bench.profiling, minillm.engine.llm; "
            "print('matplotlib' in sys.modules, 'minillm.viz' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_plot_forward_breakdown():
    params = dict(zip(P.PARTS, [100, 2, 50, 60, 0]))
    seconds = dict(zip(P.PARTS, [1e-4, 1e-4, 2e-3, 2e-3, 1e-3]))
    r = P.ForwardBreakdown(8, params, seconds, 5e-3, True)
    fig = viz.plot_forward_breakdown(r)
    left, right = fig.axes
    assert len(bars(left)) == len(bars(right)) == 5
    assert any("tied" in t.get_text() for t in left.texts)


def test_training_plots():
    import minillm.viz as viz
    rows = [{"tokens": 1000 * i, "train_loss": 5 - i * 0.1, "val_loss": 5.1 - i * 0.1, "lr": 1e-3} for i in range(1, 6)]
    fig = viz.plot_training_curves({"a": rows, "b": rows[:3]}, baseline=6.0)
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 5 and len(fig.axes[1].lines) == 2
    fig = viz.plot_expected_tokens({"x": 0.5, "y": 0.8})
    assert len(fig.axes[0].lines) == 3
    assert fig.axes[0].lines[0].get_ydata()[0] == 1.5  # alpha 0.5, gamma 1: 1 + 0.5


def test_serving_timeline_and_block_map(tmp_path):
    import minillm.viz as viz

    from minillm import LLM, SamplingParams
    llm = LLM("random:tiny", batching="static", block_size=4, enable_prefix_caching=True, max_num_seqs=2)
    sps = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (2, 6, 3)]
    llm.generate(["To be, or not to be", "Who's there?", "Hamlet"], sps)
    steps = llm.engine.trace.steps
    assert [p for s in steps for p in s.phases].count("prefill") == 3 and sum(len(s.padding_ids) for s in steps) > 0
    fig = viz.plot_timeline(steps)
    assert len(fig.axes) == 2 and fig.axes[0].images[0].get_array().shape == (3, len(steps))
    engine = llm.engine
    engine.add_request("To be, or not to be, that is", SamplingParams(n=2, max_tokens=4, ignore_eos=True))
    engine.step(), engine.step()
    snap = engine.block_snapshot()
    assert any(len(o) == 2 for o in snap.owners) and any(snap.cached)  # shared by the two samples; cached prefixes
    fig = viz.plot_block_map(snap)
    fig.savefig(tmp_path / "map.png")
    assert len(fig.axes[0].patches) >= snap.num_blocks


def test_serving_memory_comparison_and_latency_plots():
    import minillm.viz as viz

    from minillm.bench.serve import RequestMemory
    rows = {"paged": [RequestMemory("a", 5, 8 * 4, 5 * 4), RequestMemory("b", 9, 12 * 4, 9 * 4)],
            "contiguous": [RequestMemory("a", 5, 64 * 4, 5 * 4), RequestMemory("b", 9, 64 * 4, 9 * 4)]}
    fig = viz.plot_memory_bars(rows)
    assert len(fig.axes) == 2 and len(bars(fig.axes[1])) == 4
    assert fig.axes[1].get_title().startswith("contiguous: 89% wasted")          # (59 + 55) / 128
    res = [dict(label=label, throughput=t, ttft_p50=0.01, ttft_p99=0.05, tpot_p50=0.002, tpot_p99=0.004)
           for label, t in [("static", 100.0), ("continuous", 250.0)]]
    fig = viz.plot_serve_comparison(res)
    assert len(fig.axes) == 3 and [b.get_height() for b in bars(fig.axes[0])] == [100.0, 250.0]
    fig = viz.plot_latency_vs_throughput({"continuous": res, "static": res[:1]})
    assert [len(line.get_xdata()) for line in fig.axes[0].lines] == [2, 1]


def test_serving_explorer_is_a_widget():
    from functools import partial

    import minillm.viz as viz

    from minillm.bench.replay import explorer_replay
    from minillm.formats.loader import random_model
    from minillm.workload import make_workload
    model, tok = random_model("tiny")
    wl = make_workload(3, 512, rate=0, prompt_median=6, output_median=3, max_len=64)
    w = viz.serving_explorer(partial(explorer_replay, model, tok, wl, 64), max_model_len=64)
    assert {c.description for c in w.children[:-1]} >= {"block_size", "batching", "chunk budget", "KV (x seq)"}


def test_block_size_sweep_plot():
    import minillm.viz as viz
    fig = viz.plot_block_size_sweep([1, 16, 256], [0.0, 0.03, 0.7], [12, 12, 3], kv_bytes=2**20)
    assert len(fig.axes) == 2 and [b.get_height() for b in bars(fig.axes[1])] == [12, 12, 3]
    assert "1.0 MiB" in fig.axes[1].get_title()


# ----------------------------------------------------------------------------- kernels: access, roofline, fusion

def test_plot_access_diagram_from_a_hand_made_log():
    from minillm.kernels.access_trace import Access, AccessLog
    log = AccessLog((1, 1, 1), (2, 1, 1), shapes={"a": (2, 3), "s": (4,)}, spaces={"a": "global", "s": "shared"})
    b, t0, t1 = (0, 0, 0), (0, 0, 0), (1, 0, 0)
    log.events += [Access(b, t0, "a", 1, "read"), Access(b, t1, "a", 1, "read"), Access(b, t1, "a", 5, "read"),
                   Access(b, t0, "s", 2, "write"), Access(b, t0, "s", 3, "read")]
    fig = viz.plot_access_diagram(log, "a")
    ax = fig.axes[0]
    assert ax.images[0].get_array().tolist() == [[0, 2, 0], [0, 0, 1]]
    assert sorted(t.get_text() for t in ax.texts) == ["0"] * 4 + ["1", "2"]   # every cell shows its count
    assert "a (global, 2x3): 3 reads" in ax.get_title() and not ax.patches
    fig = viz.plot_access_diagram(log, ["a", "s"], thread=(0, 1))
    a_ax, s_ax = fig.axes[:2]
    assert ([p.get_edgecolor()[:3] for p in a_ax.patches]
            == [matplotlib.colors.to_rgb(viz.kernels.SPACE_COLORS["global"])] * 2)
    assert not s_ax.patches                                                   # thread 1 never touched s
    fig = viz.plot_access_diagram(log, "s", thread=(0, 0))
    assert len(fig.axes[0].patches) == 2 and fig.axes[0].images[0].get_array().shape == (1, 4)
    assert {p.get_linestyle() for p in fig.axes[0].patches} == {"-", "--"}   # a read and a write
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["read, shared memory", "written, shared memory"]


def test_plot_roofline():
    pts = [{"kind": "decode", "M": m, "intensity": m / 2, "flop_s": 1e9 * m} for m in (1, 8)]
    pts += [{"kind": "prefill", "M": 512, "intensity": 100.0, "flop_s": 5e10}]
    fig = viz.plot_roofline({"peak_flop_s": 1e11, "bandwidth": 1e10, "points": pts, "device": "cpu"})
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert len(ax.collections) == 2                                           # decode and prefill scatters
    roof = ax.lines[0].get_ydata()
    assert roof.max() == pytest.approx(1e11) and roof[0] == pytest.approx(1e10 * ax.lines[0].get_xdata()[0])
    labels = [t.get_text() for t in ax.texts]
    assert "decode M=1" in labels and "prefill M=512" in labels and "ridge 10 flop/B" in labels


def test_plot_fusion():
    rows = [{"name": "rmsnorm", "unfused_bytes": 3 * 2**20, "fused_bytes": 2**20, "unfused_seconds": 3e-4,
             "fused_seconds": 1e-4},
            {"name": "swiglu", "unfused_bytes": 5 * 2**20, "fused_bytes": 3 * 2**20, "unfused_seconds": 2e-4,
             "fused_seconds": 1.5e-4}]
    fig = viz.plot_fusion(rows)
    left, right = fig.axes
    assert [b.get_height() for b in bars(left)] == [3, 5, 1, 3]               # MiB: unfused pair, then fused pair
    assert [round(b.get_height()) for b in bars(right)] == [300, 200, 100, 150]   # microseconds
    assert any("3.0x less" in t.get_text() for t in left.texts)
    assert [t.get_text() for t in left.get_xticklabels()] == ["rmsnorm", "swiglu"]
    with pytest.raises(ValueError, match="at least one row"):
        viz.plot_fusion([])
