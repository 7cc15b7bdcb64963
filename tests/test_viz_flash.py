"""minillm.viz.flash: each plot draws small data under Agg and returns a Figure with what it should."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import minillm.viz as viz  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from minillm.kernels.softmax import online_softmax_steps  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_attention_tiles_draws_both_matrices():
    fig = viz.draw_attention_tiles(4, query_tile=2, key_tile=1)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert all(len(ax.patches) >= 16 for ax in fig.axes)           # one patch per tile, at least
    with pytest.raises(ValueError):
        viz.draw_attention_tiles(4, query_tile=1, key_tile=2)        # a key tile past the diagonal


def test_online_softmax_marks_the_rescaling_steps():
    x = [0.5, 2.0, 1.0, 3.0, -1.0]
    steps = online_softmax_steps(x)
    fig = viz.plot_online_softmax(x, steps, 4)
    left, right = fig.axes
    assert len(left.patches) >= len(x)
    dots = right.collections[0].get_offsets()                       # the steps where the max rose: 1 and 3
    assert [int(p[0]) for p in dots] == [1, 3]
    assert "d = d + exp" in right.get_title()                         # step 4 did not raise the max
    with pytest.raises(ValueError):
        viz.plot_online_softmax(x, steps, 5)


def test_attention_memory_is_log_log_with_one_line_per_series():
    T = [64, 128, 256]
    fig = viz.plot_attention_memory(T, {"naive": [4 * t * t for t in T], "flash": [8 * t for t in T]},
                                    {"naive": [4 * t * t for t in T]})
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and len(ax.lines) == 3


def test_split_sweep_draws_time_and_speedup():
    fig = viz.plot_split_sweep([1, 2, 4], {"H = 1": [2e-3, 1e-3, 1.1e-3], "H = 8": [4e-3, 4e-3, 4e-3]}, threads=2)
    left, right = fig.axes
    assert len(left.lines) == 2 and len(right.lines) == 3             # two curves, and the threads line
    assert np.allclose(left.lines[0].get_ydata(), [2.0, 1.0, 1.1])    # drawn in ms
    assert np.allclose(right.lines[0].get_ydata(), [1.0, 2.0, 2 / 1.1])
    assert np.allclose(right.lines[1].get_ydata(), 1.0)


def test_attention_traffic_draws_bytes_beside_time():
    from minillm.viz.flash import plot_attention_traffic
    T = [64, 128, 256]
    fig = plot_attention_traffic(T, {"naive": [4 * t * t for t in T], "flash, tiles of 128": [t * t / 8 for t in T],
                                     "flash, tiles of 16": [t * t for t in T]},
                                 {"naive": [1e-3, 3e-3, 9e-3], "flash": [2e-3, 6e-3, 2e-2]}, threads=2)
    left, right = fig.axes
    assert len(left.lines) == 3 and len(right.lines) == 2
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in (left, right))
    assert np.allclose(right.lines[0].get_ydata(), [1.0, 3.0, 9.0])    # drawn in ms
    assert "2 threads" in right.get_title()
    assert [line.get_color() for line in left.lines[1:]] == [left.lines[1].get_color()] * 2   # both flash lines green
    assert left.lines[0].get_color() != left.lines[1].get_color()
