"""FlashAttention, drawn: the score matrix naive attention keeps against the tiles FlashAttention walks,
the online softmax one element at a time, peak memory against sequence length, bytes moved through a GPU's
memory beside the time on this CPU, and Flash-Decoding's time against its split count.

Each function draws plain data (lists, dicts, the (i, m, d) steps of
minillm.kernels.softmax.online_softmax_steps); nothing here runs a kernel or times anything.
"""
from __future__ import annotations

import numpy as np
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator

from ._figure import COLORS, finish, new_figure

# One colour per attention method, in every figure here.
METHOD_COLORS = {"naive": COLORS["no cache"], "row_tiled": COLORS["decode"], "flash": COLORS["kv cache"]}
METHOD_LABELS = {"naive": "naive (T x T scores)", "row_tiled": "row-tiled (FLAT)", "flash": "FlashAttention"}


# ----------------------------------------------------------------------------- the idea

def draw_attention_tiles(n_tiles: int = 6, query_tile: int = 3, key_tile: int = 1):
    """Two causal score matrices of n_tiles x n_tiles tiles. Left, naive attention: every score is
    in memory at once (the masked upper triangle too). Right, FlashAttention: query tile `query_tile`
    walks the key tiles 0..query_tile one at a time (the current one, `key_tile`, is the only score
    tile that exists); tiles above the diagonal are never started."""
    if not 0 <= key_tile <= query_tile < n_tiles:
        raise ValueError(f"need 0 <= key_tile <= query_tile < n_tiles, got {key_tile}, {query_tile}, {n_tiles}")
    fig, axes = new_figure(ncols=2, width=9.6, height=4.6)
    n = n_tiles
    for ax in axes[0]:
        ax.set_xlim(0, n)
        ax.set_ylim(n, 0)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("keys j  (tiles of B columns)")
        ax.set_ylabel("queries i  (tiles of B rows)")
    left, right = axes[0]
    for r in range(n):                                  # naive: the whole matrix, upper part masked but stored
        for c in range(n):
            masked = c > r
            left.add_patch(Rectangle((c, r), 1, 1, facecolor="#F2C4C4" if masked else METHOD_COLORS["naive"],
                                     edgecolor="white", lw=1, hatch="//" if masked else None, alpha=0.9))
    left.set_title("naive: all T x T scores in memory\n(masked ones too), written, then read back", fontsize=9.5)
    for r in range(n):
        for c in range(n):
            if c > r:
                face, edge = "white", "#DDDDDD"         # never computed, never stored
            elif r == query_tile and c == key_tile:
                face, edge = METHOD_COLORS["flash"], "#333333"
            elif r == query_tile and c < key_tile:
                face, edge = "#B8DDC2", "#999999"       # already folded into the running max, sum, output
            else:
                face, edge = "#F4F4F4", "#BBBBBB"
            right.add_patch(Rectangle((c, r), 1, 1, facecolor=face, edgecolor=edge, lw=1))
    right.add_patch(Rectangle((0, query_tile), query_tile + 1, 1, fill=False, edgecolor="#333333", lw=1.8))
    right.text(key_tile + 0.5, query_tile + 0.5, "now\n(on chip)", ha="center", va="center", fontsize=7.5,
               color="white")
    for c in range(key_tile):
        right.text(c + 0.5, query_tile + 0.5, "folded\nin", ha="center", va="center", fontsize=7.5, color="#333333")
    if key_tile < query_tile:
        right.annotate("", xy=(query_tile + 0.7, query_tile + 0.5), xytext=(key_tile + 1.05, query_tile + 0.5),
                       arrowprops=dict(arrowstyle="-|>", color="#333333", lw=1.2))
    right.text(n - 0.1, 0.4, "above the diagonal:\nnever started", ha="right", va="top", fontsize=8, color="#777777")
    if query_tile + 1 < n - 1:
        right.text(query_tile + 1.1, query_tile + 0.5, "running max m,\nsum l, output acc\nper query row",
                   ha="left", va="center", fontsize=7.5)
    right.set_title("FlashAttention: one B x B score tile at a time\n(on chip), rescaled into running m, l, acc",
                    fontsize=9.5)
    return finish(fig)


# ----------------------------------------------------------------------------- online softmax

def plot_online_softmax(x, steps, i: int):
    """Online softmax after element i of x: left, x as bars (seen ones coloured) with the running max m;
    right, the running sum d = sum_{k <= i} exp(x_k - m) after each step, a red dot where a new max
    rescaled the sum so far by exp(m_old - m_new). steps: online_softmax_steps(x), a list of (i, m, d)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    if len(steps) != len(x) or not 0 <= i < len(x):
        raise ValueError(f"need len(steps) == len(x) and 0 <= i < len(x), got {len(steps)}, {len(x)}, {i}")
    ms = np.array([s[1] for s in steps])
    ds = np.array([s[2] for s in steps])
    m, d = ms[i], ds[i]
    fig, axes = new_figure(ncols=2, width=10.0, height=3.6)
    ax = axes[0, 0]
    idx = np.arange(len(x))
    ax.bar(idx, x, color=[COLORS["prefill"] if k <= i else "#DDDDDD" for k in idx])
    ax.axhline(m, color=COLORS["decode"], lw=1.5, ls="--", label=f"running max m = {m:.2f}")
    ax.bar([i], [x[i]], color="none", edgecolor="#333333", lw=1.5)
    ax.set(xlabel="element k", ylabel="x[k]", title=f"step {i}: read x[{i}] = {x[i]:.2f}")
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, axis="y")
    ax = axes[0, 1]
    ax.plot(idx[:i + 1], ds[:i + 1], color=COLORS["prefill"], marker="o", ms=4, label="running sum d")
    rescaled = [k for k in range(1, i + 1) if ms[k] > ms[k - 1]]
    if rescaled:
        ax.scatter(rescaled, ds[rescaled], color=COLORS["no cache"], zorder=3, s=40,
                   label="new max: d rescaled by exp(m_old - m_new)")
    ax.set_xlim(-0.5, len(x) - 0.5)
    ax.set_ylim(0, max(ds.max() * 1.15, 1.5))
    new_max = i > 0 and ms[i] > ms[i - 1]
    rule = (f"d = d * exp({ms[i - 1]:.2f} - {m:.2f}) + 1" if new_max else
            f"d = d + exp({x[i]:.2f} - {m:.2f})" if i > 0 else "d = exp(x[0] - x[0]) = 1")
    ax.set(xlabel="element k", ylabel="d", title=f"{rule} = {d:.3f}")
    ax.title.set_fontsize(9.5)
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return finish(fig)


# ----------------------------------------------------------------------------- memory and time

def plot_attention_memory(lengths, measured: dict, predicted: dict | None = None):
    """Peak bytes against sequence length, log-log. measured, predicted: {method: [bytes per length]}
    with methods among "naive", "row_tiled", "flash"; measured as dots and solid lines, predicted
    (attention_peak_bytes) dashed. Reference slopes: doubling T doubles O(T), quadruples O(T^2)."""
    fig, axes = new_figure(width=6.8, height=4.2)
    ax = axes[0, 0]
    lengths = list(lengths)
    for method, ys in measured.items():
        ax.plot(lengths, ys, marker="o", color=METHOD_COLORS.get(method, "#333333"),
                label=f"{METHOD_LABELS.get(method, method)}, measured")
    for method, ys in (predicted or {}).items():
        ax.plot(lengths, ys, ls="--", lw=1.2, color=METHOD_COLORS.get(method, "#333333"),
                label=f"{METHOD_LABELS.get(method, method)}, attention_peak_bytes")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="sequence length T", ylabel="peak bytes allocated",
           title="attention's peak memory: O(T^2) naive vs O(T) tiled")
    ax.legend(frameon=False, fontsize=7.5, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    return finish(fig)


def _bytes_label(v, _=None) -> str:
    """A tick label for a power-of-two byte count: 64 KiB, 1 MiB, 256 MiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:g} {unit}"
    return f"{v:g} B"


def plot_attention_traffic(lengths, bytes_moved: dict, seconds: dict, threads: int | None = None):
    """Left: bytes moved through a GPU's HBM (the model of minillm.bench.attention_traffic) against T, log-log.
    bytes_moved: {label: [bytes per length]}; a label starting with a method name ("naive", "flash ...") takes
    its colour, later flash lines a lighter dash. Right: measured seconds per call on this CPU against the same
    T. seconds: {method: [seconds per length]}. Reference: doubling T quadruples an O(T^2) line."""
    fig, axes = new_figure(ncols=2, width=11.0, height=4.0)
    left, right = axes[0]
    lengths = list(lengths)
    styles = iter(["-", "--", ":", "-."])
    for label, ys in bytes_moved.items():
        method = label.split()[0].strip(",:;")
        ls = "-" if method == "naive" else next(styles)
        left.plot(lengths, ys, marker="o", ms=4, ls=ls, color=METHOD_COLORS.get(method, "#333333"), label=label)
    for method, secs in seconds.items():
        right.plot(lengths, np.array(secs, dtype=float) * 1e3, marker="o", ms=4,
                   color=METHOD_COLORS.get(method, "#333333"), label=METHOD_LABELS.get(method, method))
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths)
        ax.set_xticklabels([str(t) for t in lengths])
        ax.set_xlabel("sequence length T")
        ax.grid(alpha=0.3, which="both")
        ax.legend(frameon=False, fontsize=8, loc="upper left")
    left.set_yscale("log", base=2)
    left.yaxis.set_major_locator(LogLocator(base=4))
    left.yaxis.set_major_formatter(FuncFormatter(_bytes_label))
    left.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    left.set(ylabel="bytes moved through HBM (model)", title="On a GPU: bytes moved decide (fp16, model)")
    on = f" on {threads} thread{'s' if threads != 1 else ''}" if threads else ""
    right.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    right.set(ylabel="ms per call (log scale)", title=f"On this CPU: measured time{on}")
    return finish(fig)


def plot_split_sweep(splits, series: dict, threads: int | None = None,
                     title: str = "Flash-Decoding: time against num_splits"):
    """Left, time per call against the number of KV splits; right, the speed-up over num_splits = 1.
    series: {label: [seconds per split count]}. threads: the CPU threads, drawn on the right as the
    most any number of splits can give a single (row, head) task."""
    fig, axes = new_figure(ncols=2, width=10.0, height=3.8)
    left, right = axes[0]
    splits = list(splits)
    palette = [COLORS["prefill"], COLORS["decode"], COLORS["kv cache"], COLORS["formula"]]
    for (label, secs), color in zip(series.items(), palette * 4):
        ms = np.array(secs, dtype=float) * 1e3
        left.plot(splits, ms, marker="o", color=color, label=label)
        right.plot(splits, ms[0] / ms, marker="o", color=color, label=label)
    if threads:
        right.axhline(threads, color="#999999", ls=":", lw=1)
        right.text(splits[0], threads, f" {threads} threads: the most splitting can give", va="bottom",
                   fontsize=8, color="#777777")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(splits)
        ax.set_xticklabels([str(s) for s in splits])
        ax.set_xlabel("num_splits (KV chunks per row and head)")
        ax.grid(alpha=0.3, which="both")
    left.set_yscale("log")
    left.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    left.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    left.set(ylabel="ms per call (log scale)", title=title)
    left.title.set_fontsize(10)
    top = max([threads or 1] + [float(np.max(np.array(s[0]) / np.array(s))) for s in series.values()])
    right.set_ylim(0, top * 1.25)
    right.set(ylabel="speed-up over num_splits = 1", title="speed-up from splitting")
    right.legend(frameon=False, fontsize=8, loc="lower right")
    return finish(fig)


def online_softmax_explorer(x, steps, start: int = 4):
    """A slider over the online softmax's steps: plot_online_softmax at each (an ipywidgets.interactive)."""
    import ipywidgets as widgets

    from .widget import STYLE, figure_for_widget, show_figure

    def show(step=start):
        show_figure(figure_for_widget(plot_online_softmax, x, steps, step))
    return widgets.interactive(show, step=widgets.IntSlider(start, min=0, max=len(x) - 1, description="step",
                                                            continuous_update=False, style=STYLE))
