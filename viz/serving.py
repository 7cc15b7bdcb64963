"""Serving pictures from the engine's records: the request timeline and the KV block map."""
from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle

from ._figure import COLORS, finish, new_figure

_PHASES = {"prefill": 1, "decode": 2, "padding": 3, "fork": 2}


def plot_timeline(steps, title: str = "Who ran at each step"):
    """steps: Trace.steps. One row per sequence, one column per engine step: prefill (or a prompt chunk),
    decode, or padding (a finished sequence still computed in a static batch). Below: batch occupancy."""
    seqs = sorted({i for s in steps for i in s.seq_ids + s.padding_ids})
    row = {sid: r for r, sid in enumerate(seqs)}
    grid = np.zeros((len(seqs), len(steps)))
    for c, s in enumerate(steps):
        for sid, ph in zip(s.seq_ids, s.phases or ["decode"] * len(s.seq_ids)):
            grid[row[sid], c] = _PHASES[ph]
        for sid in s.padding_ids:
            grid[row[sid], c] = _PHASES["padding"]
    fig, axes = new_figure(nrows=2, width=10, height=4.6)
    ax, ax2 = axes[0][0], axes[1][0]
    cmap = ListedColormap(["white", COLORS["prefill"], COLORS["decode"], "#BBBBBB"])
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=3, interpolation="nearest")
    ax.set(ylabel="sequence", title=title, xticks=[])
    ax.legend(handles=[Patch(color=COLORS["prefill"], label="prefill"), Patch(color=COLORS["decode"], label="decode"),
                       Patch(color="#BBBBBB", label="padding")], frameon=False, loc="upper right", fontsize=8)
    ax2.bar(range(len(steps)), [len(s.seq_ids) for s in steps], color=COLORS["decode"], width=1.0, label="running")
    ax2.bar(range(len(steps)), [s.num_padding for s in steps], bottom=[len(s.seq_ids) for s in steps],
            color="#BBBBBB", width=1.0, label="padding")
    ax2.set(xlabel="engine step", ylabel="batch rows", xlim=(-0.5, len(steps) - 0.5))
    ax2.legend(frameon=False, fontsize=8)
    return finish(fig)


def plot_block_map(snapshot, title: str = "KV pool: colour = owner, xN = shared by N, hatched = prefix-cached, bar = slots filled"):
    """snapshot: LLMEngine.block_snapshot(). Each block a cell, coloured by owning sequence; a number for
    shared blocks' owner count; hatched if it is a prefix-cache block; its fill as a bar."""
    n = snapshot.num_blocks
    cols = int(np.ceil(np.sqrt(n * 2)))
    rows = int(np.ceil(n / cols))
    fig, axes = new_figure(width=min(12, 0.5 * cols + 2), height=min(8, 0.5 * rows + 1.2))
    ax = axes[0][0]
    for b in range(n):
        r, c = divmod(b, cols)
        owners = snapshot.owners[b]
        color = f"C{owners[0] % 10}" if owners else "#EEEEEE"
        ax.add_patch(Rectangle((c, -r), 0.92, -0.92, color=color, alpha=0.35 if owners else 1,
                                                                  hatch="//" if snapshot.cached[b] else None, ec="gray", lw=0.5))
        if owners:
            ax.add_patch(Rectangle((c, -r - 0.92), 0.92 * snapshot.filled[b] / snapshot.block_size,
                                                                      0.18, color=color))
        if len(owners) > 1:
            ax.text(c + 0.46, -r - 0.4, f"x{len(owners)}", ha="center", va="center", fontsize=7)
    ax.set(xlim=(0, cols), ylim=(-rows, 0.1), xticks=[], yticks=[], title=title)
    ax.set_aspect("equal")
    return finish(fig)
