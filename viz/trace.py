"""The engine's trace (llm.engine.trace.steps, a list of StepRecord), drawn step by step."""
from __future__ import annotations

from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ._figure import COLORS, finish, new_figure


def plot_trace(steps):
    """Left: milliseconds of each engine step, coloured prefill / decode. Right: tokens each step
    computed. Reads only StepRecord fields (kind, seconds, num_prefill_tokens, num_decode_tokens)."""
    if not steps:
        raise ValueError("the trace has no steps: run llm.generate(...) with trace=True first")
    fig, axes = new_figure(ncols=2, width=10, height=3.4)
    ax, ax2 = axes[0]
    idx = [s.step for s in steps]
    colors = [COLORS.get(s.kind, "#999999") for s in steps]
    ax.bar(idx, [s.seconds * 1e3 for s in steps], color=colors)
    ax.set(xlabel="engine step", ylabel="milliseconds", title="Time per engine step (measured)")
    tokens = [s.num_prefill_tokens + s.num_decode_tokens for s in steps]
    ax2.bar(idx, tokens, color=colors)
    ax2.set(xlabel="engine step", ylabel="tokens computed", title="Tokens through the model per step")
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    kinds = dict.fromkeys(s.kind for s in steps)
    ax.legend(handles=[Patch(color=COLORS.get(k, "#999999"), label=k) for k in kinds], frameon=False)
    for a in (ax, ax2):
        a.grid(axis="y", alpha=0.3)
    return finish(fig)
