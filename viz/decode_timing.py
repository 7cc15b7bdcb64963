"""Decode speed with and without a KV cache, and prefill vs decode, from minillm.bench.profiling's results."""
from __future__ import annotations

from ._figure import COLORS, finish, new_figure


def plot_decode_timing(*timings):
    """timings: profiling.DecodeTiming results. Left: milliseconds per generated token against the
    context it attends over (linear without a cache, nearly flat with one). Right: total seconds to
    generate n tokens (quadratic vs linear)."""
    if not timings:
        raise ValueError("pass at least one DecodeTiming")
    fig, axes = new_figure(ncols=2, width=10.5, height=3.8)
    ax, ax2 = axes[0]
    for t in timings:
        color = COLORS.get(t.method)
        label = t.method + (f" (median of {t.repeats})" if t.repeats > 1 else "")
        ax.plot(t.context_lens, [s * 1e3 for s in t.seconds], lw=1, color=color, label=label)
        ax2.plot(range(1, len(t.seconds) + 1), t.cumulative_seconds, lw=1.5, color=color, label=t.method)
    ax.set(xlabel="context length (tokens)", ylabel="ms per generated token",
           title="Time per generated token (measured)")
    ax2.set(xlabel="tokens generated", ylabel="total seconds", title="Total time to generate n tokens")
    for a in (ax, ax2):
        a.set_ylim(bottom=0)
        a.legend(frameon=False)
        a.grid(alpha=0.3)
    return finish(fig)


def plot_prefill_vs_decode(result):
    """result: profiling.PrefillDecode. Tokens per second for the same tokens, one call vs one per token."""
    fig, axes = new_figure(width=5.0, height=3.4)
    ax = axes[0, 0]
    rates = [result.prefill_tokens_per_s, result.decode_tokens_per_s]
    bars = ax.bar(["prefill\n(1 call)", f"decode\n({result.n_tokens} calls)"], rates,
                  color=[COLORS["prefill"], COLORS["decode"]])
    for b, r in zip(bars, rates):
        ax.text(b.get_x() + b.get_width() / 2, r, f"{r:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="tokens / second", title=f"{result.n_tokens} tokens into the cache (measured)")
    ax.text(0.75, 0.6, f"prefill: {rates[0] / rates[1]:.0f}x\nthe tokens/s of decode", transform=ax.transAxes,
            ha="center", fontsize=9)
    ax.margins(y=0.2)
    ax.grid(axis="y", alpha=0.3)
    return finish(fig)
