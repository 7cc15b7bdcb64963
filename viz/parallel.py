"""Parallelism pictures (notebook 12): what each rank holds, what each rank did and when, the pipeline bubble, link
times, the router comparison, and prefill/decode disaggregation per request.

Inputs are plain data: minillm.parallel.tensor.describe_split's rows, the ranks' timeline events
(minillm.parallel.timeline.Event: rank, kind, start, end, label), bench parallel's bubble table, bench sched's and
cluster's metrics dicts, and minillm.cluster.timelines' per-request rows."""
from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from ._figure import COLORS, finish, new_figure

RANK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
OP_COLORS = {"compute": "#4C72B0", "all_reduce": "#C44E52", "all_gather": "#DD8452", "broadcast": "#8C8C8C",
             "send": "#55A868", "recv": "#8172B3"}


# ---------------------------------------------------------------------------- what each rank holds
def draw_tp_split(split: list, title: str = ""):
    """split: describe_split(cfg, p) rows. One row per weight, one column per rank: the full weight (out, in) as a
    box with the rank's share filled in (a band of rows: column-parallel; of columns: row-parallel; all of it:
    replicated), and the shape the rank holds."""
    weights = list(dict.fromkeys(r["weight"] for r in split))
    ranks = sorted({r["rank"] for r in split})
    fig, axes = new_figure(width=1.2 + 1.55 * len(ranks), height=0.5 * len(weights) + 0.8)
    ax = axes[0, 0]
    ax.set(xlim=(-1.2, 1.55 * len(ranks)), ylim=(len(weights) - 0.3, -0.9))
    ax.axis("off")
    for col, rank in enumerate(ranks):
        ax.text(1.55 * col + 0.45, -0.62, f"rank {rank}", ha="center", fontsize=9, color=RANK_COLORS[rank % 8])
    for row, name in enumerate(weights):
        ax.text(-0.15, row + 0.2, name, ha="right", va="center", fontsize=9, family="monospace")
        for col, rank in enumerate(ranks):
            r = next(x for x in split if x["weight"] == name and x["rank"] == rank)
            x0, y0, w, h = 1.55 * col, row - 0.05, 0.9, 0.5
            ax.add_patch(Rectangle((x0, y0), w, h, fill=False, ec="#999999", lw=0.8))
            color = RANK_COLORS[rank % 8]
            if r["dim"] is None:
                ax.add_patch(Rectangle((x0, y0), w, h, color=color, alpha=0.35, lw=0))
            else:
                lo, hi = r["lo"] / r["full"][r["dim"]], r["hi"] / r["full"][r["dim"]]
                band = (x0, y0 + lo * h, w, (hi - lo) * h) if r["dim"] == 0 else (x0 + lo * w, y0, (hi - lo) * w, h)
                ax.add_patch(Rectangle(band[:2], *band[2:], color=color, alpha=0.8, lw=0))
            what = {None: "all", 0: "rows", 1: "cols"}[r["dim"]]
            ax.text(x0 + w + 0.05, y0 + h / 2, f"{what}\n{r['shape'][0]}x{r['shape'][1]}", va="center", fontsize=6.5,
                    color="#444444")
    ax.set_title(title or f"Tensor parallelism over {len(ranks)} ranks: each weight (out, in), each rank's share "
                          "filled", fontsize=9)
    return finish(fig)


# ---------------------------------------------------------------------------- what each rank did and when
def plot_rank_timeline(events: list, title: str = "What each rank did, and when", window=None, ax=None):
    """events: Event rows (rank, kind, start, end, label) from RankGroup.recording(). One row per rank: a bar per
    event, blue for compute, a colour per collective (the time a rank waits in it included). window: (start, end)
    in the events' clock, to zoom in; times are shown in ms from its start."""
    if ax is None:
        fig, axes = new_figure(width=10, height=1.0 + 0.6 * len({e.rank for e in events}))
        ax = axes[0, 0]
    else:
        fig = ax.figure
    t0, t1 = window or (min(e.start for e in events), max(e.end for e in events))
    seen = []
    for e in events:
        if e.end < t0 or e.start > t1:
            continue
        ax.add_patch(Rectangle(((e.start - t0) * 1e3, e.rank - 0.35), (e.end - e.start) * 1e3, 0.7,
                               color=OP_COLORS.get(e.kind, "#333333"), lw=0))
        seen.append(e.kind)
    ranks = sorted({e.rank for e in events})
    ax.set(xlim=(0, (t1 - t0) * 1e3), ylim=(max(ranks) + 0.6, min(ranks) - 0.6), yticks=ranks,
           yticklabels=[f"rank {r}" for r in ranks], xlabel="ms", title=title)
    ax.legend(handles=[Patch(color=OP_COLORS[k], label=k) for k in OP_COLORS if k in seen], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.005, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return finish(fig)


def time_shares(events: list, rank: int = 0) -> dict:
    """Seconds one rank spent in compute and in each collective: {kind: seconds}."""
    out: dict = {}
    for e in events:
        if e.rank == rank:
            out[e.kind] = out.get(e.kind, 0.0) + e.end - e.start
    return out


# ---------------------------------------------------------------------------- the pipeline bubble
def plot_bubble(table: list, p: int, title: str = "Pipeline bubble: each stage's idle share of a step"):
    """table: bench parallel's bubble rows ({"m", "formula", "idle_rank0", "idle_rank1", ...}). The measured idle
    fraction per rank against GPipe's (p - 1) / (m + p - 1), over the micro-batches m."""
    fig, axes = new_figure(width=6.4, height=3.4)
    ax = axes[0, 0]
    ms = [r["m"] for r in table]
    grid = np.linspace(1, max(ms), 100)
    ax.plot(grid, (p - 1) / (grid + p - 1), color=COLORS["formula"], label="(p - 1) / (m + p - 1)")
    for rank in range(p):
        ax.plot(ms, [r[f"idle_rank{rank}"] for r in table], "o--", color=RANK_COLORS[rank], ms=5,
                label=f"measured, rank {rank}")
    ax.set(xlabel="micro-batches m", ylabel="idle fraction of the step", ylim=(0, 1), xscale="log", title=title)
    ax.minorticks_off()
    ax.set_xticks(ms)
    ax.set_xticklabels([str(m) for m in ms])
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return finish(fig)


# ---------------------------------------------------------------------------- link times
def plot_link_times(seconds: dict, title: str = "Moving one decoded token's bytes (batch 8)"):
    """seconds: {setting: {link: seconds}} (e.g. tensor / pipeline x NVLink / PCIe / this CPU's gloo). Grouped bars,
    microseconds on a log scale."""
    links = list(dict.fromkeys(k for v in seconds.values() for k in v))
    fig, axes = new_figure(width=7.5, height=3.4)
    ax = axes[0, 0]
    x, w = np.arange(len(seconds)), 0.8 / len(links)
    for i, link in enumerate(links):
        vals = [seconds[s].get(link, np.nan) * 1e6 for s in seconds]
        bars = ax.bar(x + (i - (len(links) - 1) / 2) * w, vals, w, label=link, color=RANK_COLORS[i % 8])
        ax.bar_label(bars, fmt="%.2g", fontsize=7)
    ax.set(xticks=x, xticklabels=list(seconds), ylabel="microseconds per token", yscale="log", title=title)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return finish(fig)


# ---------------------------------------------------------------------------- data parallelism
def plot_router_comparison(runs: dict, title: str = "Routing policies on a shared-prefix workload"):
    """runs: {policy: cluster.routed_metrics dict}. Throughput, TTFT p50 and p99, and the prefix-cache hit rate."""
    names = list(runs)
    x = np.arange(len(names))
    fig, axes = new_figure(ncols=3, width=11, height=3.2)
    a, b, c = axes[0]
    a.bar(x, [runs[n]["throughput"] for n in names], color=COLORS["prefill"])
    a.set(ylabel="output tokens / s", title="throughput")
    b.bar(x - 0.2, [runs[n]["ttft_p50"] * 1e3 for n in names], 0.4, color=COLORS["decode"], alpha=0.6, label="p50")
    b.bar(x + 0.2, [runs[n]["ttft_p99"] * 1e3 for n in names], 0.4, color=COLORS["decode"], label="p99")
    b.set(ylabel="ms", title="time to first token")
    b.legend(fontsize=8)
    c.bar(x, [100 * runs[n]["prefix_hit_rate"] for n in names], color=COLORS["kv cache"])
    c.set(ylabel="% of prompt tokens", title="prefix-cache hits", ylim=(0, 100))
    for ax in axes[0]:
        ax.set_xticks(x)
        ax.set_xticklabels(names, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return finish(fig)


# ---------------------------------------------------------------------------- disaggregation
_WAIT, _HANDOVER = "#DDDDDD", "#8172B3"


def plot_disagg_timelines(runs: dict, title: str = "Each request: waiting, prefill, KV handover, decode"):
    """runs: {label: cluster.timelines rows} (the same requests, colocated and disaggregated). One row per request
    in arrival order: grey from arrival to its prefill, blue prefill up to the first token, purple from the handover
    sent to taken in by the decode engine (disaggregated), and a tick per later token."""
    fig, axes = new_figure(ncols=len(runs), width=5.4 * len(runs), height=4.0)
    end = max(r["finished"] for rows in runs.values() for r in rows)
    for ax, (label, rows) in zip(axes[0], runs.items()):
        for i, r in enumerate(rows):
            ax.add_patch(Rectangle((r["arrival"], i - 0.4), r["first_scheduled"] - r["arrival"], 0.8, color=_WAIT,
                                   lw=0))
            ax.add_patch(Rectangle((r["first_scheduled"], i - 0.4), r["first_token"] - r["first_scheduled"], 0.8,
                                   color=COLORS["prefill"], lw=0))
            if r["handover_sent"] is not None:
                ax.add_patch(Rectangle((r["handover_sent"], i - 0.4), r["handover_received"] - r["handover_sent"],
                                       0.8, color=_HANDOVER, lw=0))
            later = r["token_times"][1:]
            ax.plot(later, [i] * len(later), "|", color=COLORS["decode"], ms=3, mew=0.6)
        ax.set(xlim=(0, end * 1.02), ylim=(len(rows), -1), xlabel="seconds (simulated clock)",
               ylabel="request (arrival order)", title=label)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][0].legend(handles=[Patch(color=_WAIT, label="waiting"), Patch(color=COLORS["prefill"], label="prefill"),
                               Patch(color=_HANDOVER, label="KV handover"),
                               Patch(color=COLORS["decode"], label="decoded tokens")], fontsize=7, loc="lower left")
    fig.suptitle(title, fontsize=10)
    return finish(fig)


def plot_disagg_tradeoff(results: dict, title: str = "Colocated against disaggregated, per workload"):
    """results: {workload: {setting: bench sched metrics}}. TPOT p99 and TTFT p99 per workload and setting."""
    workloads = list(results)
    settings = list(dict.fromkeys(s for r in results.values() for s in r))
    fig, axes = new_figure(ncols=2, width=10, height=3.2)
    x, w = np.arange(len(workloads)), 0.8 / len(settings)
    for ax, key, label in ((axes[0][0], "tpot_p99", "TPOT p99 (ms)"), (axes[0][1], "ttft_p99", "TTFT p99 (ms)")):
        for i, s in enumerate(settings):
            vals = [results[wl][s][key] * 1e3 for wl in workloads]
            ax.bar(x + (i - (len(settings) - 1) / 2) * w, vals, w, label=s, color=RANK_COLORS[i % 8])
        ax.set(xticks=x, ylabel=label, title=label.split(" (")[0])
        ax.set_xticklabels(workloads, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return finish(fig)
