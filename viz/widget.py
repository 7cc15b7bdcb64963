"""Widgets that always draw: each change makes a fresh figure that pyplot never holds, and shows it.

Found in a browser: JupyterLab handles widget messages on more than one kernel thread, and after each one
pyplot redraws every figure it holds (matplotlib's post-execute draw_all). A callback still drawing or
showing its figure on the other thread then shares the canvas with that redraw, and the image comes out
blank or cut off while the text beside it updates. So a callback draws with `figure_for_widget(draw, ...)`:
the figure is a plain matplotlib Figure (viz._figure.off_pyplot), never registered with pyplot, displayed
by the callback alone.
"""
from __future__ import annotations

STYLE = {"description_width": "initial"}        # labels in full ("temperature", not "temperat...")


def figure_for_widget(draw, *args, **kwargs):
    """draw(*args, **kwargs) -> a figure pyplot does not hold (see the module's docstring)."""
    from ._figure import off_pyplot
    with off_pyplot():
        return draw(*args, **kwargs)


def show_figure(fig):
    """Display `fig` (in a widget's output, or a cell's); if pyplot holds it, release it."""
    import matplotlib.pyplot as plt
    from IPython.display import display
    if plt.fignum_exists(fig.number if hasattr(fig, "number") else -1):
        plt.close(fig)                     # first: no pyplot redraw can touch it while it is displayed
    display(fig)


def is_drawn(fig) -> bool:
    """Does the rendered figure have visible, non-white pixels? (What the widget tests check.)"""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)              # render off-screen, whatever backend (or none) holds the figure
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    return bool((rgba[..., 3] > 0).any() and (rgba[..., :3] < 200).any())
