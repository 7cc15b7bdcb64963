"""minillm.viz.training: the memory bars (notebook 09) and the expected-tokens curves on axes that separate them."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_memory_budget_stacks_each_part_once_per_bar():
    from minillm.viz.training import plot_memory_budget
    M = 2**20
    fig = plot_memory_budget({"train": {"weights": 4 * M, "gradients": 4 * M, "Adam m": 4 * M, "Adam v": 4 * M},
                              "infer": {"weights": 4 * M, "KV cache": 2 * M}}, n_params=M)
    ax = fig.axes[0]
    assert len(ax.patches) == 6
    tops = sorted({round(p.get_y() + p.get_height(), 6) for p in ax.patches})
    assert tops[-1] == 16 and 6 in tops                                   # stacked, in MiB
    assert len(ax.get_legend().get_texts()) == 5                          # one legend entry per part
    assert ax.child_axes and "per parameter" in ax.child_axes[0].get_ylabel()   # the bytes-per-parameter axis


def test_expected_tokens_fits_the_curves_not_the_ceiling():
    from minillm.viz.training import plot_expected_tokens
    fig = plot_expected_tokens({"a": 0.54, "b": 0.49, "c": 0.45, "d": 0.44})
    left, right = fig.axes
    assert len(left.lines) == 5 and len(right.lines) == 4
    assert left.get_ylim()[1] < 4                                         # not stretched to gamma + 1 = 9
    assert np.allclose(right.lines[0].get_ydata()[0], (1 + 0.54) / 2)    # E / (gamma + 1) at gamma 1
