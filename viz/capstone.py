"""The capstone's pictures (notebook 16): the trace (who arrives when, with how long a prompt), and the waterfall of
what each technique adds to goodput, peak KV memory and p99 latency.

Inputs are plain data: the workload's Requests, and minillm.bench.capstone.score's result dicts."""
from __future__ import annotations

from matplotlib.patches import Patch

from ._figure import finish, new_figure

_CLASS = {"chat": "#4C72B0", "docs": "#DD8452"}
_UP, _DOWN, _END = "#55A868", "#C44E52", "#8172B2"


def plot_capstone_trace(workload: list, slo: dict):
    """Each request as a point: its arrival (x) against its prompt length (y), sized by the tokens it asks for,
    coloured by client class; the SLO of each class in the legend."""
    fig, axes = new_figure(width=9.0, height=3.4)
    ax = axes[0][0]
    for c in sorted({r.client for r in workload}):
        mine = [r for r in workload if r.client == c]
        ttft, tpot = slo[c]
        ax.scatter([r.arrival for r in mine], [len(r.prompt_ids) for r in mine], s=[6 + r.max_tokens / 2 for r in mine],
                   color=_CLASS.get(c, "grey"), alpha=0.7,
                   label=f"{c}: {len(mine)} requests; SLO TTFT {ttft * 1e3:.0f} ms, TPOT {tpot * 1e3:.1f} ms")
    ax.set(xlabel="arrival (simulated seconds)", ylabel="prompt tokens",
           title="The capstone's trace (marker size: output tokens asked)")
    ax.legend(fontsize=7, loc="upper right")
    return finish(fig)


def plot_waterfall(rows: list, title: str = "What each technique adds"):
    """rows: score() results in order, the plain engine first, each later row one more technique switched on.
    Left: goodput as a waterfall (each bar floats from the previous total; green up, red down; the last bar is the
    total). Middle: peak KV bytes filled. Right: p99 TTFT and TPOT."""
    fig, axes = new_figure(ncols=3, width=13.5, height=4.2)
    labels = [r["label"] for r in rows]
    x = range(len(rows))
    ax = axes[0][0]
    prev = 0.0
    for i, r in enumerate(rows):
        g = r["goodput"]
        if i == 0:
            ax.bar(i, g, color="grey")
        else:
            ax.bar(i, g - prev, bottom=prev, color=_UP if g >= prev else _DOWN)
        ax.text(i, g, f"{g:.1f}", ha="center", va="bottom", fontsize=7)
        prev = g
    ax.bar(len(rows), rows[-1]["goodput"], color=_END)
    ax.text(len(rows), rows[-1]["goodput"], f"{rows[-1]['goodput'] / rows[0]['goodput']:.1f}x", ha="center",
            va="bottom", fontsize=8, weight="bold")
    ax.set_xticks(list(x) + [len(rows)], labels + ["total"], rotation=40, ha="right", fontsize=7)
    ax.set(ylabel="goodput (requests/s meeting the SLO)", title="goodput")
    ax.legend(handles=[Patch(color=_UP, label="adds"), Patch(color=_DOWN, label="takes away")], fontsize=7)
    ax = axes[0][1]
    ax.bar(x, [r["peak_kv_bytes"] / 2**20 for r in rows], color="#64B5CD")
    ax.set_xticks(list(x), labels, rotation=40, ha="right", fontsize=7)
    ax.set(ylabel="MiB", title="peak KV bytes filled")
    ax = axes[0][2]
    ax.plot(x, [r["ttft_p99"] * 1e3 for r in rows], "o-", label="TTFT p99")
    ax.plot(x, [r["tpot_p99"] * 1e3 for r in rows], "s-", label="TPOT p99")
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels, rotation=40, ha="right", fontsize=7)
    ax.set(ylabel="ms (log)", title="p99 latency")
    ax.legend(fontsize=7)
    fig.suptitle(title)
    return finish(fig)
