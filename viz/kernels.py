"""Kernels, drawn: who reads which element (an access diagram from the CUDA simulator), where matmuls
land under the machine's roofline, and the bytes a fused kernel saves.

Each function draws plain data: an AccessLog (minillm.kernels.access_trace), the dict
minillm.bench.roofline.roofline returns, a list of dicts. Nothing here runs a kernel or times anything.
"""
from __future__ import annotations

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from ._figure import COLORS, finish, human_bytes, mib, new_figure

SPACE_COLORS = {"global": "#C44E52", "shared": "#55A868"}   # DRAM red, on-chip green, in every figure here


# ----------------------------------------------------------------------------- access diagram

def plot_access_diagram(log, array, thread=None, vmax: float | None = None, annotate: bool | None = None):
    """Each array as a grid of its elements, coloured by how many times all threads read it (the
    number is in the cell). thread=(block, thread), e.g. ((0, 0), (3, 1)): outline the elements that
    one thread read (solid) or wrote (dashed), red in global memory, green in shared memory.
    array: a name or a list of names (one panel each), e.g. ["x", "xs"] to see a tile's reuse.
    vmax: the read count drawn darkest; pass the same one to two figures (tiled, naive) to compare them."""
    names = [array] if isinstance(array, str) else list(array)
    if not names:
        raise ValueError("array: name at least one array of the log")
    shapes = [tuple(log.shapes[n]) for n in names]
    grids = [log.reads_per_element(n).reshape(-1, s[-1]) for n, s in zip(names, shapes)]  # (rows, last dim)
    width = sum(min(6.0, 0.8 + 0.32 * g.shape[1]) for g in grids) + 1.2 * len(grids)
    height = max(min(6.0, 1.6 + 0.32 * g.shape[0]) for g in grids)
    fig, axes = new_figure(ncols=len(names), width=min(16.0, width), height=height)
    numbers = {}                                                     # ax -> (grid shape, the count texts)
    for ax, name, shape, counts in zip(axes[0], names, shapes, grids):
        space = log.spaces[name]
        im = ax.imshow(counts, cmap="Blues", vmin=0, vmax=vmax or max(1, counts.max()), aspect="equal")
        fig.colorbar(im, ax=ax, shrink=0.8, label="reads")
        if annotate if annotate is not None else counts.size <= 1024:
            numbers[ax] = (counts.shape, [ax.text(c, r, str(v), ha="center", va="center", fontsize=6,
                                                  color="white" if v > 0.6 * (vmax or counts.max()) else "#333333")
                                          for (r, c), v in np.ndenumerate(counts)])
        if thread is not None:
            block, tid = thread
            for kind, style in (("read", "-"), ("write", "--")):
                for idx in log.touched(name, block, tid, kind):
                    r = int(np.ravel_multi_index(idx[:-1], shape[:-1])) if len(idx) > 1 else 0
                    c = idx[-1]
                    ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, lw=1.6, ls=style,
                                           edgecolor=SPACE_COLORS[space]))
        ax.set_title(f"{name} ({space}, {'x'.join(map(str, shape))}): {int(counts.sum())} reads", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("column (last index)")
        ax.set_ylabel("row")
    if thread is not None:
        handles = [Line2D([], [], color=SPACE_COLORS[s], ls=ls, lw=1.6, label=f"{kind}, {s} memory")
                   for s in ("global", "shared") if s in {log.spaces[n] for n in names}
                   for kind, ls in (("read", "-"), ("written", "--"))]
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=8)
        fig.suptitle(f"block {thread[0]}, thread {thread[1]}: what it touched, outlined", fontsize=9.5)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
    else:
        finish(fig)
    _fit_numbers(fig, numbers)
    return fig


def _fit_numbers(fig, numbers):
    """Size each panel's count labels to its cells once the layout is final: as large as fits (up to 12
    points), so a 4x4 tile's numbers are as readable as a 20x20 grid's are small."""
    for ax, (shape, texts) in numbers.items():
        ax.apply_aspect()
        box = ax.get_position()                                       # figure fraction, after aspect = equal
        w_in, h_in = fig.get_size_inches()
        cell_pt = 72 * min(box.width * w_in / shape[1], box.height * h_in / shape[0])
        digits = max(len(t.get_text()) for t in texts)
        size = max(5.0, min(12.0, 0.5 * cell_pt, 0.75 * cell_pt / (0.62 * digits)))
        for t in texts:
            t.set_fontsize(size)


# ----------------------------------------------------------------------------- roofline

def plot_roofline(result, title: str = ""):
    """Log-log: arithmetic intensity (flops per byte) against achieved FLOP/s. The slope is what the
    memory bandwidth allows, the flat roof the best FLOP/s measured; they meet at the ridge. Decode
    points (M = batch) sit left, on the slope: memory-bound; prefill points (M = tokens) sit right,
    under the roof. Takes the dict minillm.bench.roofline.roofline returns."""
    peak, bw = result["peak_flop_s"], result["bandwidth"]
    points = result["points"]
    ridge = peak / bw
    xs = [p["intensity"] for p in points] + [ridge]
    lo, hi = min(xs) / 4, max(xs) * 4
    fig, axes = new_figure(width=6.8, height=4.2)
    ax = axes[0, 0]
    grid = np.geomspace(lo, hi, 200)
    ax.plot(grid, np.minimum(peak, bw * grid), color="#333333", lw=1.5, label="roofline min(peak, bandwidth x I)")
    ax.plot(grid, bw * grid, color="#999999", lw=0.8, ls=":")
    ax.axvline(ridge, color="#999999", lw=0.8, ls="--")
    ax.text(ridge, peak * 1.15, f"ridge {ridge:.0f} flop/B", ha="center", fontsize=7.5)
    for kind in ("decode", "prefill"):
        mine = [p for p in points if p["kind"] == kind]
        if not mine:
            continue
        ax.scatter([p["intensity"] for p in mine], [p["flop_s"] for p in mine], color=COLORS[kind], zorder=3,
                   label=f"{kind} (M = {'batch' if kind == 'decode' else 'tokens'})")
        for i, p in enumerate(mine):       # decode labels below, prefill above, staggered: no overlaps
            offset = (5, -11 - 9 * (i % 2)) if kind == "decode" else (-20, 6 + 9 * (i % 2))
            ax.annotate(f"{kind} M={p['M']}", (p["intensity"], p["flop_s"]), textcoords="offset points",
                        xytext=offset, fontsize=7, color=COLORS[kind])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min([p["flop_s"] for p in points] + [bw * lo]) / 2, peak * 2)
    ax.set(xlabel="arithmetic intensity (flop / byte)", ylabel="achieved FLOP/s",
           title=title or f"roofline, {result.get('device', '')}: peak {peak / 1e9:.0f} GFLOP/s, "
                          f"{bw / 1e9:.1f} GB/s")
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    return finish(fig)


# ----------------------------------------------------------------------------- fusion

def plot_fusion(rows, title: str = "fused vs unfused: bytes moved and time"):
    """rows: dicts {name, unfused_bytes, fused_bytes, unfused_seconds, fused_seconds}. Left, the bytes
    each version moves (every intermediate an unfused chain writes and reads back); right, the time.
    Each fused bar says how many times less it is."""
    if not rows:
        raise ValueError("plot_fusion needs at least one row")
    fig, axes = new_figure(ncols=2, width=max(8.0, 2.4 * len(rows) + 4), height=3.8)
    x = np.arange(len(rows))
    for ax, key, scale, unit, fmt in ((axes[0, 0], "bytes", mib, "MiB", human_bytes),
                                      (axes[0, 1], "seconds", lambda s: s * 1e6, "microseconds",
                                       lambda s: f"{s * 1e6:.0f} us")):
        un = [r[f"unfused_{key}"] for r in rows]
        fu = [r[f"fused_{key}"] for r in rows]
        a = ax.bar(x - 0.2, [scale(v) for v in un], 0.4, color=COLORS["no cache"], label="unfused")
        b = ax.bar(x + 0.2, [scale(v) for v in fu], 0.4, color=COLORS["kv cache"], label="fused")
        for bar, v in zip(a, un):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), fmt(v), ha="center", va="bottom", fontsize=7)
        for bar, v, u in zip(b, fu, un):
            ratio = "" if v <= 0 else f"\n{u / v:.1f}x less" if u >= v else f"\n{v / u:.1f}x more"
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), fmt(v) + ratio, ha="center", va="bottom",
                    fontsize=7)
        ax.set_xticks(x)
        ax.set_xticklabels([r["name"] for r in rows], fontsize=8)
        ax.set_ylim(0, 1.45 * max(scale(v) for v in un + fu) or 1)      # room for the labels and the legend
        ax.set(ylabel=unit, title=f"{key} moved" if key == "bytes" else "time")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(frameon=False, fontsize=8, loc="upper left", ncol=2)   # one line above the tallest label
    fig.suptitle(title, fontsize=10)
    return finish(fig)
