"""Widgets that always draw: each change makes a fresh figure, shows it in the widget's output, and closes it.

Left to pyplot, a callback's figure stays registered with the backend, and an interactive output can end up
showing a figure that was already shown and closed: a blank, transparent image while the text beside it
updates. Showing the figure object explicitly and closing it at once leaves nothing stale to redraw.
"""
from __future__ import annotations

STYLE = {"description_width": "initial"}        # labels in full ("temperature", not "temperat...")


def show_figure(fig):
    """Display `fig` (in a widget's output, or a cell's) and release it from pyplot."""
    import matplotlib.pyplot as plt
    from IPython.display import display
    display(fig)
    plt.close(fig)


def is_drawn(fig) -> bool:
    """Does the rendered figure have visible, non-white pixels? (What the widget tests check.)"""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)              # render off-screen, whatever backend (or none) holds the figure
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    return bool((rgba[..., 3] > 0).any() and (rgba[..., :3] < 200).any())
