"""Quantization, drawn: weight and activation value ranges (and the outlier channels SmoothQuant is
for), per-channel quantization error, perplexity against weight bytes (the Pareto picture), the
speedup of quantized decode against batch size, and the memory-bound GEMV regime (bytes against the
last-level cache, time per token).

Each function draws plain data (tensors or arrays, minillm.bench.quant's `runs` dict, measured
tok/s lists, bench_gemv's result); nothing here quantizes or times anything.
"""
from __future__ import annotations

import numpy as np

from ._figure import COLORS, finish, human_bytes, mib, new_figure

OUTLIER_FACTOR = 6.0          # a channel is an outlier when its absmax is > 6x the median channel's
OUTLIER_COLOR = "#C44E52"
SERIES_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD"]


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float64)


def _as_dict(x, default: str) -> dict:
    return {k: _np(v) for k, v in x.items()} if isinstance(x, dict) else {default: _np(x)}


def outlier_channels(absmax, factor: float = OUTLIER_FACTOR) -> np.ndarray:
    """Indices of the channels whose absmax is more than `factor` times the median channel absmax."""
    a = _np(absmax).ravel()
    return np.flatnonzero(a > factor * np.median(a))


def plot_weight_activation_hist(weights, activations, title: str = ""):
    """Three panels: the histogram of the weight values, the histogram of the activation values
    (both log y), and every input channel's max |activation| with the outlier channels (absmax >
    6x the median channel's) marked. `weights`: any shape; `activations`: (rows, K), or a dict
    {label: (rows, K)} to compare several models' inputs to the same layer."""
    acts = _as_dict(activations, "activations")
    w = _np(weights).ravel()
    fig, axes = new_figure(ncols=3, width=13.0, height=3.8)
    ax_w, ax_a, ax_c = axes[0]
    ax_w.hist(w, bins=80, color=COLORS["prefill"])
    ax_w.set_yscale("log")
    ax_w.set_xlabel("weight value")
    ax_w.set_ylabel("count (log)")
    ax_w.set_title(f"weights: max |w| = {np.abs(w).max():.3g}")
    for i, (label, a) in enumerate(acts.items()):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        a2 = a.reshape(-1, a.shape[-1])
        ax_a.hist(a2.ravel(), bins=80, color=color, alpha=0.6, label=label)
        absmax = np.abs(a2).max(0)                                               # (K,)
        ax_c.plot(np.arange(absmax.size), absmax, color=color, lw=1, label=label)
        out = outlier_channels(absmax)
        if out.size:
            ax_c.scatter(out, absmax[out], color=OUTLIER_COLOR, zorder=3, s=30,
                         label=f"outliers ({label}): channels {', '.join(map(str, out[:6]))}")
        ax_c.axhline(OUTLIER_FACTOR * np.median(absmax), color=color, ls=":", lw=1)
    ax_a.set_yscale("log")
    ax_a.set_xlabel("activation value")
    ax_a.set_ylabel("count (log)")
    ax_a.set_title("activations (the layer's input)")
    ax_a.legend(fontsize=8)
    ax_c.set_yscale("log")
    ax_c.set_xlabel("input channel j")
    ax_c.set_ylabel("max |x_j| (log)")
    ax_c.set_title(f"per-channel absmax (dotted: {OUTLIER_FACTOR:g}x median)")
    ax_c.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return finish(fig)


def plot_channel_error_heatmap(err, title: str = ""):
    """|W - dequant(quant(W))| per weight, one heatmap per entry: `err` (N, K) or a dict {label:
    (N, K)} (e.g. int8 per channel against int4 g32 of one layer), on one shared colour scale. Rows
    are output channels n, columns input channels k."""
    errs = {k: np.abs(v) for k, v in _as_dict(err, "error").items()}
    for k, v in errs.items():
        if v.ndim != 2:
            raise ValueError(f"{k}: expected an (N, K) error array, got shape {v.shape}")
    vmax = max(v.max() for v in errs.values()) or 1.0
    fig, axes = new_figure(ncols=len(errs), width=4.6 * len(errs) + 1.0, height=4.2)
    im = None
    for ax, (label, v) in zip(axes[0], errs.items()):
        im = ax.imshow(v, aspect="auto", cmap="magma", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"{label}: mean {v.mean():.2g}, max {v.max():.2g}", fontsize=10)
        ax.set_xlabel("input channel k")
        ax.set_ylabel("output channel n")
    cb = fig.colorbar(im, ax=list(axes[0]), fraction=0.04, pad=0.02)
    cb.set_label("|w - dequantized w|")
    if title:
        fig.suptitle(title)
    return fig


def _overlaps(a, b, pad: float = 1.0) -> bool:
    return not (a.x1 + pad <= b.x0 or b.x1 + pad <= a.x0 or a.y1 + pad <= b.y0 or b.y1 + pad <= a.y0)


def place_labels(ax, xs, ys, labels, fontsize: float = 8, step: float = 11.0):
    """Label each point (xs[i], ys[i]) with labels[i] so that no two labels overlap each other or a
    point, inside the axes: each label (top point first) takes the first free spot right of its point,
    then left of it, stepping `step` points up and down; a label moved off its point gets a thin leader
    line. Several schemes often sit on the same spot (int8, q8_0, W8A8 at the same bytes and
    perplexity), so their labels stack beside it. -> the annotations, in the order of `labels`."""
    from matplotlib.transforms import Bbox
    fig = ax.figure
    fig.canvas.draw()                                                # settles the limits; gives a renderer
    renderer = fig.canvas.get_renderer()
    pts = ax.transData.transform(np.column_stack([xs, ys]))         # (n, 2) display pixels
    px = fig.dpi / 72.0                                              # pixels per point
    frame = ax.get_window_extent(renderer)
    taken = [Bbox.from_extents(x - 4 * px, y - 4 * px, x + 4 * px, y + 4 * px) for x, y in pts]
    offsets = [None] * len(labels)
    for i in sorted(range(len(labels)), key=lambda k: (-pts[k, 1], pts[k, 0])):
        t = ax.text(0, 0, labels[i], fontsize=fontsize)
        bb = t.get_window_extent(renderer)
        w, h = bb.width, bb.height
        t.remove()
        best = None
        spots = [(side, sign * k * step * px) for side in (1, -1)   # right of the point, then left
                 for k in range(13) for sign in ((1,) if k == 0 else (-1, 1))]
        for side, dy in spots:
            x0 = pts[i, 0] + 6 * px if side == 1 else pts[i, 0] - 6 * px - w
            box = Bbox.from_bounds(x0, pts[i, 1] + dy - h / 2, w, h)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(_overlaps(box, o) for o in taken):
                best = (side, dy, box)
                break
        if best is None:                                             # nowhere free: right of the point
            best = (1, 0.0, Bbox.from_bounds(pts[i, 0] + 6 * px, pts[i, 1] - h / 2, w, h))
        taken.append(best[2])
        offsets[i] = best
    out = []
    for i, (side, dy, _) in enumerate(offsets):
        far = abs(dy) > 0.6 * step * px
        out.append(ax.annotate(labels[i], (xs[i], ys[i]), textcoords="offset points",
                               xytext=(6 * side, dy / px), ha="left" if side == 1 else "right", va="center",
                               fontsize=fontsize,
                               arrowprops=dict(arrowstyle="-", color="#999999", lw=0.6, shrinkA=0, shrinkB=3)
                               if far else None))
    return out


def plot_pareto(rows: dict, baseline: str | None = None):
    """Perplexity change (%) against weight bytes, one labelled point per scheme: `rows` is
    minillm.bench.quant.bench_quant()['runs'] ({label: {'weight_bytes', 'perplexity', ...}}).
    Down and to the left is better; delta_ppl is used when present, else computed against
    `baseline` (default: the first row). Labels never overprint (place_labels): schemes on the same
    spot get stacked labels with leader lines."""
    if not rows:
        raise ValueError("no rows to plot")
    base = rows[baseline or next(iter(rows))]
    fig, axes = new_figure(width=7.6, height=4.6)
    ax = axes[0][0]
    xs, ys = [], []
    for i, (label, r) in enumerate(rows.items()):
        d = r.get("delta_ppl", r["perplexity"] / base["perplexity"] - 1) * 100
        x = mib(r["weight_bytes"])
        color = OUTLIER_COLOR if "outlier" in label else SERIES_COLORS[i % len(SERIES_COLORS)]
        ax.scatter([x], [d], color=color, s=40, zorder=3)
        xs.append(x)
        ys.append(d)
    ax.axhline(0.0, color="#888888", lw=1, ls="--")
    ax.set_xlabel("weight bytes (MiB)")
    ax.set_ylabel("perplexity change vs float32 (%)")
    ax.set_title("quality against size: down and left is better")
    ax.grid(alpha=0.3)
    span_x, span_y = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    ax.set_xlim(min(xs) - 0.35 * span_x, max(xs) + 0.35 * span_x)  # room for labels on both sides
    ax.set_ylim(min(ys) - 0.3 * span_y, max(ys) + 0.3 * span_y)
    fig.tight_layout()
    place_labels(ax, xs, ys, list(rows))
    return fig


def plot_gemv_regime(res: dict):
    """minillm.bench.quant.bench_gemv's result, two panels per format. Left (memory): the weight bytes one
    token reads, with the last-level cache as a dashed line (above it, every pass comes from main memory).
    Right (speed): milliseconds per token (one pass over the layers), each bar labelled with its speedup
    over the first format (above 1x: faster) and its effective bandwidth."""
    rows = res["rows"]
    if not rows:
        raise ValueError("no formats to plot")
    names = list(rows)
    colors = [SERIES_COLORS[i % len(SERIES_COLORS)] for i in range(len(names))]
    fig, axes = new_figure(ncols=2, width=11.0, height=3.8)
    ax_m, ax_t = axes[0]
    mb = [mib(rows[n]["weight_bytes"]) for n in names]
    bars = ax_m.bar(names, mb, color=colors)
    for b, n in zip(bars, names):
        ax_m.annotate(human_bytes(rows[n]["weight_bytes"]), (b.get_x() + b.get_width() / 2, b.get_height()),
                      textcoords="offset points", xytext=(0, 3), ha="center", fontsize=9)
    llc = res.get("llc_bytes")
    if llc:
        ax_m.axhline(mib(llc), color="#C44E52", ls="--", lw=1.2, label=f"last-level cache: {human_bytes(llc)}")
        ax_m.legend(frameon=False, fontsize=8, loc="upper right")
    N, K = res["shape"]
    ax_m.set(ylabel="weights read per token (MiB)", ylim=(0, max(mb) * 1.18),
             title=f"memory: {res['layers']} layers of {N} x {K}" + ("" if llc else " (cache size unknown)"))
    ms = [rows[n]["ms_per_token"] for n in names]
    bars = ax_t.bar(names, ms, color=colors)
    for b, n in zip(bars, names):
        r = rows[n]
        ax_t.annotate(f"{r['speedup']:.2f}x {names[0]}\n{r['gb_s']:.1f} GB/s",
                      (b.get_x() + b.get_width() / 2, b.get_height()), textcoords="offset points", xytext=(0, 3),
                      ha="center", fontsize=9)
    ax_t.set(ylabel="ms per token (median)", ylim=(0, max(ms) * 1.3),
             title=f"speed: batch-1 GEMVs, {res['threads']} thread(s)")
    for ax in (ax_m, ax_t):
        ax.grid(alpha=0.3, axis="y")
    return finish(fig)


def plot_speedup_vs_batch(rows: dict, baseline: str = "fp32", title: str | None = None):
    """Decode speedup over `baseline` against batch size (log x): `rows` is {scheme: [(batch, tok_s),
    ...]}; each scheme's tok/s is divided by the baseline's at the same batch size. The default title
    only says how to read the plot (the points say whether quantization paid; pass a title that does)."""
    if baseline not in rows:
        raise ValueError(f"rows need the baseline {baseline!r}; got {sorted(rows)}")
    base = dict(rows[baseline])
    fig, axes = new_figure(width=6.8, height=4.0)
    ax = axes[0][0]
    for i, (label, pts) in enumerate(rows.items()):
        pts = sorted((b, t) for b, t in pts if b in base)
        xs = [b for b, _ in pts]
        ys = [t / base[b] for b, t in pts]
        ax.plot(xs, ys, marker="o", color=SERIES_COLORS[i % len(SERIES_COLORS)], label=label,
                ls="--" if label == baseline else "-")
    ax.set_xscale("log", base=2)
    batches = sorted(base)
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("batch size (sequences decoding together)")
    ax.set_ylabel(f"decode tok/s / {baseline}'s")
    ax.set_title(title or f"decode tok/s relative to {baseline} (above 1: faster than {baseline})")
    ax.grid(alpha=0.3)
    ax.legend()
    return finish(fig)


def quant_error_explorer(weights, quantize, size: int = 64):
    """Bits and group size over one weight matrix: `quantize(bits, group) -> (dequantized, nbytes)`; shows the
    bytes, the error, and the error map of the first size x size weights (an ipywidgets.interactive)."""
    import ipywidgets as widgets

    from .widget import STYLE, figure_for_widget, show_figure
    w = _np(weights)

    def show(bits=4, group=32):
        deq, nbytes = quantize(bits, group)
        e = np.abs(_np(deq) - w)
        print(f"int{bits}{'' if bits == 8 else f' g{group}'}: {nbytes:,} bytes ({nbytes / w.nbytes:.3f} of float32), "
              f"max error {e.max():.2e}, mean error {e.mean():.2e}")
        show_figure(figure_for_widget(plot_channel_error_heatmap, e[:size, :size],
                                      title=f"first {size} x {size} weights"))
    return widgets.interactive(show, bits=widgets.Dropdown(options=[8, 4], value=4, description="bits", style=STYLE),
                               group=widgets.Dropdown(options=[32, 64, 128], value=32, description="group size",
                                                      style=STYLE))
