"""Where one forward pass's parameters and time go, from minillm.bench.profiling.forward_breakdown."""
from __future__ import annotations

from ._figure import finish, new_figure


def plot_forward_breakdown(result):
    """result: profiling.ForwardBreakdown. Left: parameters per part (millions). Right: measured
    milliseconds per part for one forward over result.n_tokens tokens."""
    parts = list(result.seconds)
    fig, axes = new_figure(ncols=2, width=10.5, height=3.6)
    ax, ax2 = axes[0]
    colors = [f"C{i}" for i in range(len(parts))]
    p = ax.bar(parts, [result.params[k] / 1e6 for k in parts], color=colors)
    if result.tied_classifier and "classifier" in parts:
        ax.text(parts.index("classifier"), 0, "tied to\nembedding", ha="center", va="bottom", fontsize=8)
    for b, k in zip(p, parts):
        if result.params[k]:
            n = result.params[k]
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{n / 1e6:.2f}M" if n >= 1e4 else f"{n:,}",
                    ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="parameters (millions)", title="Parameters by part")
    ax2.bar(parts, [result.seconds[k] * 1e3 for k in parts], color=colors)
    ax2.set(ylabel="milliseconds (measured)",
            title=f"Time by part, one forward over {result.n_tokens} tokens")
    for a in (ax, ax2):
        a.tick_params(axis="x", labelsize=8, rotation=20)
        a.margins(y=0.15)
        a.grid(axis="y", alpha=0.3)
    return finish(fig)
