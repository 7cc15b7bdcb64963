"""Quantization, drawn: weight and activation value ranges (and the outlier channels SmoothQuant is
for), per-channel quantization error, perplexity against weight bytes (the Pareto picture), and the
speedup of quantized decode against batch size.

Each function draws plain data (tensors or arrays, minillm.bench.quant's `runs` dict, measured
tok/s lists); nothing here quantizes or times anything.
"""
from __future__ import annotations

import numpy as np

from ._figure import COLORS, finish, mib, new_figure

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


def plot_pareto(rows: dict, baseline: str | None = None):
    """Perplexity change (%) against weight bytes, one labelled point per scheme: `rows` is
    minillm.bench.quant.bench_quant()['runs'] ({label: {'weight_bytes', 'perplexity', ...}}).
    Down and to the left is better; delta_ppl is used when present, else computed against
    `baseline` (default: the first row)."""
    if not rows:
        raise ValueError("no rows to plot")
    base = rows[baseline or next(iter(rows))]
    fig, axes = new_figure(width=7.6, height=4.4)
    ax = axes[0][0]
    for i, (label, r) in enumerate(rows.items()):
        d = r.get("delta_ppl", r["perplexity"] / base["perplexity"] - 1) * 100
        x = mib(r["weight_bytes"])
        color = OUTLIER_COLOR if "outlier" in label else SERIES_COLORS[i % len(SERIES_COLORS)]
        ax.scatter([x], [d], color=color, s=40, zorder=3)
        ax.annotate(label, (x, d), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.axhline(0.0, color="#888888", lw=1, ls="--")
    ax.set_xlabel("weight bytes (MiB)")
    ax.set_ylabel("perplexity change vs float32 (%)")
    ax.set_title("quality against size: down and left is better")
    ax.grid(alpha=0.3)
    return finish(fig)


def plot_speedup_vs_batch(rows: dict, baseline: str = "fp32"):
    """Decode speedup over `baseline` against batch size (log x): `rows` is {scheme: [(batch, tok_s),
    ...]}; each scheme's tok/s is divided by the baseline's at the same batch size."""
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
    ax.set_title("weight-only quantization pays at small batch, when decode is memory-bound")
    ax.grid(alpha=0.3)
    ax.legend()
    return finish(fig)
