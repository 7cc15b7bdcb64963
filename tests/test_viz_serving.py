"""Notebooks 05 and 06's pictures: the serving explorer draws a timeline for every control value (in a browser it
once showed a transparent, empty image after a change while its numbers updated), and the plots added for the
lessons draw what they are given: per-step latency, KV bytes over time, TTFT against rate, the block map's legend."""
import io
from functools import partial

import matplotlib
import matplotlib.pyplot
import numpy as np
import pytest
from minillm.viz import serving
from minillm.viz._figure import COLORS

from minillm.bench.replay import explorer_replay
from minillm.formats.loader import random_model
from minillm.workload import make_workload


def shown(fig) -> np.ndarray:
    """The picture Jupyter shows for fig: IPython's own PNG rendering (what display(fig) sends), decoded (H, W, 4)."""
    from IPython.core.pylabtools import print_figure
    return matplotlib.pyplot.imread(io.BytesIO(print_figure(fig, "png")))


def share_of(rgba, hex_colour) -> float:
    """The share of the picture's pixels within a few levels of this colour (opaque)."""
    want = np.array(matplotlib.colors.to_rgb(hex_colour))
    return float(((np.abs(rgba[..., :3] - want) < 0.03).all(-1) & (rgba[..., 3] > 0.9)).mean())


def timeline_drawn(fig) -> bool:
    """Cells of the prefill and decode colours cover a visible part of the picture (an empty or transparent
    image has none)."""
    rgba = shown(fig)
    return share_of(rgba, COLORS["prefill"]) > 0.005 and share_of(rgba, COLORS["decode"]) > 0.02


@pytest.fixture(scope="module")
def explorer():
    model, tok = random_model("tiny")
    wl = make_workload(3, 512, rate=0, prompt_median=6, output_median=3, max_len=64, seed=0)
    return serving.serving_explorer(partial(explorer_replay, model, tok, wl, 64), max_model_len=64)


def test_the_explorer_draws_a_timeline_for_every_control_value(explorer):
    controls = explorer.children[:-1]
    assert explorer.figure is not None and timeline_drawn(explorer.figure)
    for c in controls:
        assert c.style.description_width == "initial"                 # labels shown whole, not "chunk bu..."
        start = c.value
        values = list(c.options) if hasattr(c, "options") else [c.min, (c.min + c.max) / 2, c.max]
        for v in [v for v in values if v != start] + [start]:
            before = explorer.figure
            c.value = v                                                 # what a click does: the observer redraws
            fig = explorer.figure
            assert fig is not before, f"{c.description}={v!r}: no new drawing"
            assert fig.axes[0].images, f"{c.description}={v!r}: the timeline has no image"
            assert timeline_drawn(fig), f"{c.description}={v!r}: the timeline shows empty"
            assert "tokens/s" in explorer.summary
    assert not matplotlib.pyplot.get_fignums(), "the explorer leaves figures open for pyplot to show elsewhere"


def test_the_explorer_run_names_its_setting():
    model, tok = random_model("tiny")
    wl = make_workload(3, 512, rate=0, prompt_median=6, output_median=3, max_len=64, seed=0)
    fig, line = serving.explorer_run(partial(explorer_replay, model, tok, wl, 64), batching="continuous",
                                     token_budget=32)
    assert "chunk budget 32" in fig.axes[0].get_title() and "preemptions" in line
    matplotlib.pyplot.close(fig)


def test_block_map_gives_shared_blocks_their_own_colour_and_a_legend():
    from minillm.core.trace import BlockSnapshot
    snap = BlockSnapshot(num_blocks=6, block_size=4, owners=[[0, 1, 2, 3], [0], [1], [2], [3], []],
                         filled=[4, 1, 1, 1, 1, 0], cached=[True, False, False, False, False, False])
    fig = serving.plot_block_map(snap)
    ax = fig.axes[0]
    cells = [p for p in ax.patches if p.get_height() < -0.5]           # the block cells (drawn downwards)
    colours = [tuple(p.get_facecolor()[:3]) for p in cells]
    assert colours[0] not in colours[1:5], "a shared block has the colour of a sequence's own block"
    assert len(set(colours[1:5])) == 4, "each sequence's own block gets its own colour"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:4] == [f"sequence {i}" for i in range(4)] and "prefix-cached" in labels and "free" in labels
    assert any(t.startswith("shared by 4") for t in labels)
    matplotlib.pyplot.close(fig)


def steps_of(kinds_seconds, decode_rows=2):
    from minillm.core.trace import StepRecord
    out, t = [], 0.0
    for kind, sec in kinds_seconds:
        dec = 0 if kind == "prefill" else decode_rows
        out.append(StepRecord(len(out), kind, [0, 1], 100 if kind != "decode" else 0, dec, 2, 0, 4096, 2048, t, sec))
        t += sec
    return out


def test_longest_token_gap_spans_a_prefill_that_stalls_the_decodes():
    steps = steps_of([("decode", 0.01), ("decode", 0.01), ("prefill", 0.05), ("decode", 0.01)])
    gap, a, b = serving.longest_token_gap(steps)
    assert gap == pytest.approx(0.06) and a == pytest.approx(0.02) and b == pytest.approx(0.08)
    assert serving.longest_token_gap(steps[:1]) == (0.0, 0.0, 0.0)


def test_step_latency_kv_and_rate_plots_draw_what_they_are_given():
    plain = steps_of([("decode", 0.01), ("prefill", 0.05), ("decode", 0.01)])
    mixed = steps_of([("decode", 0.01), ("mixed", 0.02), ("mixed", 0.02), ("decode", 0.01)])
    fig = serving.plot_step_latency({"plain": plain, "chunked": mixed}, arrival=0.01)
    assert [len(ax.patches) for ax in fig.axes[:2]] == [3, 4]
    assert "60.0 ms" in " ".join(t.get_text() for t in fig.axes[0].texts)
    fig = serving.plot_kv_over_time({"a": plain, "b": mixed}, pool_bytes=8192)
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == "a: peak 0.00 MiB"
    fig = serving.plot_ttft_vs_rate([1, 10], {"on": {"p50": [0.01, 0.02], "p99": [0.02, 0.05]}, "off": {"p50": [1, 2]}})
    assert [len(line.get_xdata()) for line in fig.axes[0].lines] == [2, 2, 2]
    fig = serving.plot_block_size_cost([1, 16], [2.0, 1.0], [0.0, 0.05])
    assert [b.get_height() for b in fig.axes[1].patches] == [0.0, 5.0]
    matplotlib.pyplot.close("all")


def test_the_block_map_explorer_draws_every_step():
    from minillm import LLM, SamplingParams
    model, tok = random_model("tiny")
    llm = LLM(model, tokenizer=tok, block_size=4, max_model_len=64,
              kv_cache_bytes=16 * 4 * model.config.kv_bytes_per_token(4))                # a pool of 16 blocks
    engine = llm.engine
    for text, n in [("To be, or not to be", 4), ("Good morrow", 6)]:
        engine.add_request(text, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    snaps = []
    while engine.has_unfinished_requests():
        engine.step()
        snaps.append(engine.block_snapshot())
    w = serving.block_map_explorer(snaps)
    slider = w.children[0]
    for step in list(range(2, len(snaps) + 1)) + [1]:
        slider.value = step
        rgba = shown(w.figure)
        assert w.figure.axes[0].get_title() == f"after step {step}"
        drawn = sum(share_of(rgba, c) for c in serving._SEQ_COLORS)       # the fill bars of owned blocks
        assert drawn > 0.001 or step == len(snaps), f"step {step}: no owned block drawn"
    assert not matplotlib.pyplot.get_fignums()
