"""Boxes and arrows: the small drawing kit the concept pictures (engine path, Llama block) share."""
from __future__ import annotations

from matplotlib.patches import FancyArrowPatch, FancyBboxPatch


def box(ax, x, y, w, h, text, color="#DCE6F2", fontsize=9, edge="#333333", textcolor="black", **kw):
    """A rounded box centred at (x, y) with text inside (color: the fill); returns the patch."""
    patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.05",
                           facecolor=color, edgecolor=edge, linewidth=1.0)
    ax.add_patch(patch)
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, color=textcolor, **kw)
    return patch


def arrow(ax, start, end, color="#333333", style="-|>", connectionstyle="arc3", **kw):
    patch = FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color,
                            connectionstyle=connectionstyle, linewidth=1.0, **kw)
    ax.add_patch(patch)
    return patch


def blank(ax, xlim, ylim):
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
