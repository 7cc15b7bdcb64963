"""Every widget draws after every change (issue: an explorer once showed a blank, transparent figure while
its numbers updated). Headless: each control is moved through its values, the callback runs, and the figure
it shows must have visible pixels."""
import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import minillm.viz.widget as widget  # noqa: E402


@pytest.fixture
def shown(monkeypatch):
    figs = []

    import matplotlib.pyplot as plt
    held = plt.get_fignums()
    monkeypatch.setattr(widget, "show_figure", figs.append)
    yield figs
    assert plt.get_fignums() == held, "a widget's figure was registered with pyplot (a redraw could blank it)"


def move_every_control(w, shown, values_of):
    """Set each control of interactive `w` to each of its test values; every change must draw."""
    for control in w.kwargs_widgets:
        for value in values_of(control):
            before = len(shown)
            control.value = value                       # interactive re-runs its callback on a change
            w.update()
            assert len(shown) > before, f"{control.description}={value!r} drew nothing"
            assert widget.is_drawn(shown[-1]), f"{control.description}={value!r} drew a blank figure"


def slider_values(control):
    return [control.min, (control.min + control.max) / 2, control.max]


def test_the_sampling_explorer_draws_at_every_setting(shown):
    from minillm.viz import sampling_explorer
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    w = sampling_explorer(logits, labels=[f"t{i}" if i % 7 else "\n" for i in range(50)])
    assert all(c.style.description_width == "initial" for c in w.kwargs_widgets)   # labels not cut off
    move_every_control(w, shown, slider_values)


def test_a_widget_figure_displays_as_png_without_pyplot():
    """The figure pyplot never holds still renders the way IPython shows it (print_figure to PNG)."""
    from IPython.core.pylabtools import print_figure
    from minillm.viz.sampling import plot_next_token_distribution
    fig = widget.figure_for_widget(plot_next_token_distribution, torch.randn(20), (1.0,))
    png = print_figure(fig, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_a_blank_figure_is_caught():
    import matplotlib.pyplot as plt
    fig = plt.figure()
    fig.patch.set_alpha(0)
    assert not widget.is_drawn(fig)
    plt.close(fig)


def test_the_online_softmax_explorer_draws_at_every_step(shown):
    from minillm.kernels.softmax import online_softmax_steps
    from minillm.viz.flash import online_softmax_explorer
    x = [0.5, 2.0, -1.0, 3.0, 0.0, 1.5]
    w = online_softmax_explorer(x, online_softmax_steps(x), start=2)
    move_every_control(w, shown, lambda c: range(c.min, c.max + 1))


def test_the_quantization_explorer_draws_at_every_setting(shown):
    import numpy as np
    from minillm.viz.quant import quant_error_explorer
    W = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)

    def quantize(bits, group):             # a stand-in: rounding to a grid as coarse as the bits
        step = np.abs(W).max() / (2 ** (bits - 1) - 1)
        return np.round(W / step) * step, W.size * bits // 8
    w = quant_error_explorer(W, quantize, size=16)
    move_every_control(w, shown, lambda c: c.options)
