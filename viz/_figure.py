"""Shared figure helpers: one look for every plot (sizes, grid, byte units)."""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

import matplotlib.pyplot as plt

# One colour per idea, used the same way in every notebook.
COLORS = {"prefill": "#4C72B0", "decode": "#DD8452", "no cache": "#C44E52", "kv cache": "#55A868",
          "formula": "#8172B3", "measured": "#55A868", "free": "#EEEEEE"}


_OFF_PYPLOT = contextvars.ContextVar("off_pyplot", default=False)


@contextmanager
def off_pyplot():
    """Figures made inside are plain matplotlib Figures that pyplot never holds: a widget's callback draws one
    and displays it, and nothing else (pyplot's draw_all after another widget message, on another kernel
    thread) can redraw it at the same moment and blank it."""
    token = _OFF_PYPLOT.set(True)
    try:
        yield
    finally:
        _OFF_PYPLOT.reset(token)


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 6.4, height: float = 3.6):
    """A pyplot figure (so Jupyter's inline backend shows it once) and its axes; inside off_pyplot(), a figure
    pyplot does not hold (display it yourself)."""
    if _OFF_PYPLOT.get():
        from matplotlib.figure import Figure
        fig = Figure(figsize=(width, height))
        return fig, fig.subplots(nrows, ncols, squeeze=False)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    return fig, axes


def finish(fig):
    fig.tight_layout()
    return fig


def mib(n_bytes) -> float:
    return n_bytes / 2**20


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
