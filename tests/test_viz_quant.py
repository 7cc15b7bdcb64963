"""minillm.viz.quant: each plot draws small data under Agg and returns a Figure with what it should."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import minillm.viz as viz  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from minillm.viz.quant import outlier_channels  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_outlier_channels_are_those_over_6x_the_median():
    a = np.ones(20)
    a[[3, 11]] = [7.0, 50.0]
    a[5] = 5.9
    assert outlier_channels(a).tolist() == [3, 11]


def test_weight_activation_hist_marks_the_outlier_channels():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g)
    twin = x.clone()
    twin[:, [2, 9]] *= 60
    fig = viz.plot_weight_activation_hist(torch.randn(16, 32, generator=g), {"shipped": x, "outliers": twin},
                                          title="w1")
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    ax_w, ax_a, ax_c = fig.axes
    assert ax_w.get_yscale() == "log" and ax_a.get_yscale() == "log"
    assert len(ax_w.patches) == 80 and len(ax_a.patches) == 2 * 80           # one bar per bin, per series
    labels = [t.get_text() for t in ax_c.get_legend().get_texts()]
    assert any("outliers (outliers): channels 2, 9" in t for t in labels)
    assert not any("outliers (shipped)" in t for t in labels)              # a Gaussian has none
    assert fig._suptitle.get_text() == "w1"


def test_weight_activation_hist_takes_one_array():
    fig = viz.plot_weight_activation_hist(np.linspace(-1, 1, 100), np.random.default_rng(0).normal(size=(8, 10)))
    assert len(fig.axes) == 3 and len(fig.axes[2].lines) >= 1


def test_channel_error_heatmap_one_panel_per_scheme_on_one_scale():
    e8 = np.full((8, 16), 0.001)
    e4 = np.full((8, 16), 0.01)
    fig = viz.plot_channel_error_heatmap({"int8": e8, "int4 g32": e4}, title="w1")
    images = [im for ax in fig.axes for im in ax.images]
    assert len(images) == 2 and all(im.get_clim() == (0.0, 0.01) for im in images)
    assert "int8" in fig.axes[0].get_title() and "int4 g32" in fig.axes[1].get_title()
    assert any(ax.get_ylabel() == "|w - dequantized w|" for ax in fig.axes)       # the colorbar
    assert len(viz.plot_channel_error_heatmap(e8).axes[0].images) == 1
    with pytest.raises(ValueError):
        viz.plot_channel_error_heatmap(np.zeros(5))


def test_pareto_one_labelled_point_per_scheme():
    rows = {"fp32": {"weight_bytes": 4 << 20, "perplexity": 10.0},
            "int8": {"weight_bytes": 1 << 20, "perplexity": 10.01, "delta_ppl": 0.001},
            "int4 g32": {"weight_bytes": 1 << 19, "perplexity": 10.2}}
    fig = viz.plot_pareto(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == list(rows)
    assert len(ax.collections) == 3
    xy = np.array([c.get_offsets()[0] for c in ax.collections])
    np.testing.assert_allclose(xy[:, 0], [4.0, 1.0, 0.5])                     # MiB
    np.testing.assert_allclose(xy[:, 1], [0.0, 0.1, 2.0])                     # percent
    with pytest.raises(ValueError):
        viz.plot_pareto({})


def test_speedup_vs_batch_divides_by_fp32_at_each_batch():
    rows = {"fp32": [(1, 100.0), (4, 300.0), (16, 800.0)], "int8": [(1, 150.0), (4, 330.0), (16, 400.0)]}
    fig = viz.plot_speedup_vs_batch(rows)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    lines = {ln.get_label(): ln for ln in ax.lines}
    np.testing.assert_allclose(lines["fp32"].get_ydata(), [1, 1, 1])
    np.testing.assert_allclose(lines["int8"].get_ydata(), [1.5, 1.1, 0.5])
    np.testing.assert_allclose(lines["int8"].get_xdata(), [1, 4, 16])
    with pytest.raises(ValueError):
        viz.plot_speedup_vs_batch({"int8": [(1, 1.0)]})


def test_pareto_labels_never_overprint_when_schemes_share_a_spot():
    # notebook 07's table: five schemes within a few percent of the same bytes and perplexity
    data = [("fp32", 1.000, 0.0), ("int8", 0.397, 0.0), ("int4 g32", 0.300, 1.58), ("awq g32", 0.302, 1.10),
            ("q8_0", 0.409, -0.05), ("w8a8", 0.397, -0.05), ("smoothquant", 0.399, -0.07),
            ("fp32, KV int8", 1.0, 0.0), ("w8a8, outliers", 0.397, 4.01), ("smoothquant, outliers", 0.399, 0.11)]
    rows = {k: {"weight_bytes": int(r * 28 * 2**20), "perplexity": 32.9 * (1 + d / 100), "delta_ppl": d / 100}
            for k, r, d in data}
    fig = viz.plot_pareto(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == list(rows)
    fig.canvas.draw()                                                          # places the annotations
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]           # the text only, not its leader line
    frame = ax.get_window_extent(renderer)
    for i, a in enumerate(boxes):
        assert frame.x0 <= a.x0 and a.x1 <= frame.x1 and frame.y0 <= a.y0 and a.y1 <= frame.y1, ax.texts[i]
        for j in range(i + 1, len(boxes)):
            assert not a.overlaps(boxes[j]), (ax.texts[i].get_text(), ax.texts[j].get_text())


def test_speedup_vs_batch_title_makes_no_claim_unless_given_one():
    rows = {"fp32": [(1, 100.0), (4, 300.0)], "int8": [(1, 90.0), (4, 250.0)]}
    title = viz.plot_speedup_vs_batch(rows).axes[0].get_title()
    assert "pays" not in title and "fp32" in title
    assert viz.plot_speedup_vs_batch(rows, title="int8 was slower").axes[0].get_title() == "int8 was slower"


def test_gemv_regime_draws_bytes_against_the_cache_and_time_per_token():
    from minillm.viz.quant import plot_gemv_regime
    res = {"shape": (4096, 4096), "layers": 5, "llc_bytes": 32 << 20, "threads": 2,
           "rows": {"fp32": {"weight_bytes": 320 << 20, "ms_per_token": 30.0, "gb_s": 11.2, "speedup": 1.0},
                    "int8": {"weight_bytes": 80 << 20, "ms_per_token": 15.0, "gb_s": 5.6, "speedup": 2.0},
                    "int4 g32": {"weight_bytes": 50 << 20, "ms_per_token": 120.0, "gb_s": 0.4, "speedup": 0.25}}}
    fig = plot_gemv_regime(res)
    ax_m, ax_t = fig.axes
    np.testing.assert_allclose([p.get_height() for p in ax_m.patches], [320, 80, 50])          # MiB
    np.testing.assert_allclose([p.get_height() for p in ax_t.patches], [30, 15, 120])          # ms per token
    assert any(abs(ln.get_ydata()[0] - 32) < 1e-9 for ln in ax_m.lines)                        # the cache line
    assert [t.get_text().split("\n")[0] for t in ax_t.texts] == ["1.00x fp32", "2.00x fp32", "0.25x fp32"]
    res["llc_bytes"] = None
    assert "unknown" in plot_gemv_regime(res).axes[0].get_title()
    with pytest.raises(ValueError):
        plot_gemv_regime({**res, "rows": {}})
