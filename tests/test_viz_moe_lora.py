"""minillm.viz.moe_lora (notebook 15): the routing heatmap draws one cell per (layer, token) with the chosen experts
and counts them per expert; the per-step bars stack each step's assignments; the adapter costs compare one base +
n adapters with n merged copies."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def fake_route(L=3, T=5, E=4, k=2, seed=0):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(E), size=(L, T))                                # (L, T, E)
    experts = np.argsort(-probs, -1)[..., :k]                                      # (L, T, k)
    return {"pieces": ["", "To", " be", ",", " or"][:T], "experts": experts.tolist(), "probs": probs.tolist()}


def test_routing_heatmap_has_a_cell_per_layer_and_token_and_counts_per_expert():
    from minillm.viz import plot_expert_routing
    route = fake_route()
    fig = plot_expert_routing(route)
    ax, bx = fig.axes
    cells = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(cells) == 3 * 5
    labels = [t.get_text() for t in ax.texts]
    assert labels[0] == "".join(str(e) for e in route["experts"][0][0])             # layer 0, token 0: both experts
    widths = np.array([p.get_width() for p in bx.patches]).reshape(4, 3)           # (E, L) stacked bars
    assert (widths.sum(0) == 2 * 5).all()                                          # k assignments per token
    want = np.array([np.bincount(np.asarray(layer).ravel(), minlength=4) for layer in route["experts"]])
    assert (widths.T == want).all()


def test_tokens_per_expert_stacks_each_step():
    from minillm.viz import plot_tokens_per_expert
    steps = [{"kind": "prefill", "load": [[10, 6, 2, 2], [5, 5, 5, 5]]},
             {"kind": "decode", "load": [[1, 1, 0, 2], [0, 2, 1, 1]]}]
    fig = plot_tokens_per_expert(steps, layer=0)
    heights = np.array([p.get_height() for p in fig.axes[0].patches]).reshape(4, 2)  # (E, S)
    assert (heights.T == np.array([[10, 6, 2, 2], [1, 1, 0, 2]])).all()
    fig = plot_tokens_per_expert(steps)                                            # mean over layers
    heights = np.array([p.get_height() for p in fig.axes[0].patches]).reshape(4, 2)
    assert np.allclose(heights[:, 0], [7.5, 5.5, 3.5, 3.5])


def test_adapter_costs_grow_by_an_adapter_not_a_model():
    from minillm.viz import draw_moe_and_lora, plot_adapter_costs
    M = 2**20
    fig = plot_adapter_costs(28 * M, M, 4, {"merged": 300.0, "lora x1": 250.0, "lora mixed": 220.0})
    ax, bx = fig.axes
    lora, merged = (line.get_ydata() for line in ax.lines)
    assert np.allclose(lora, [29, 30, 31, 32]) and np.allclose(merged, [28, 56, 84, 112])
    assert [p.get_height() for p in bx.patches] == [300.0, 250.0, 220.0]
    assert len(draw_moe_and_lora().axes) == 2
