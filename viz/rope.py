"""RoPE as clocks: each pair (2j, 2j+1) of a head is rotated by position * freq_j."""
from __future__ import annotations

import math

import torch

from ._figure import finish, new_figure


def plot_rope(cos, sin, pairs=None, n_positions: int = 64, arrows: int = 8):
    """cos, sin: (S, D/2) tables (minillm.llama.transformer.rope_tables). Left: the unit vector of pair 0 rotated
    to positions 0..arrows-1. Right: cos(position * freq_j), the x[2j] of a rotated unit vector, for a
    few pairs j: the first pairs spin fast (local order), the last ones barely turn (long range)."""
    cos, sin = torch.as_tensor(cos), torch.as_tensor(sin)
    half = cos.shape[1]
    pairs = pairs if pairs is not None else sorted({0, half // 4, half // 2, half - 1})
    n_positions = min(n_positions, cos.shape[0])
    fig, axes = new_figure(ncols=2, width=10, height=4.0)
    ax, ax2 = axes[0]
    t = torch.linspace(0, 2 * math.pi, 200)
    ax.plot(torch.cos(t), torch.sin(t), color="#CCCCCC", lw=1)
    for p in range(min(arrows, cos.shape[0])):
        c, s = float(cos[p, 0]), float(sin[p, 0])
        ax.annotate("", xy=(c, s), xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color=f"C{p % 10}"))
        ax.text(1.15 * c, 1.15 * s, f"pos {p}", ha="center", va="center", fontsize=8)
    ax.set_aspect("equal")
    ax.set(xlim=(-1.45, 1.45), ylim=(-1.35, 1.35), title="pair j=0: (x0, x1) = (1, 0) rotated by position",
           xlabel="x[0]", ylabel="x[1]")
    pos = torch.arange(n_positions)
    for j in pairs:
        ax2.plot(pos, cos[:n_positions, j], lw=1.2, label=f"pair j={j}")
    ax2.set(xlabel="position", ylabel="cos(position x freq_j)", ylim=(-1.1, 1.45),
            title="each pair turns at its own speed")
    ax2.legend(frameon=False, fontsize=8, loc="upper right", ncol=len(pairs))
    ax2.grid(alpha=0.3)
    return finish(fig)
