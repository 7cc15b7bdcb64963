"""Serving pictures from the engine's records: the request timeline, per-step latency, KV memory over time, the
KV block map, and the serving explorer."""
from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from ._figure import COLORS, finish, human_bytes, mib, new_figure

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
    swatch = dict(ec="black", lw=0.5)             # an edge, so a swatch shows even beside bars of its own colour
    ax.legend(handles=[Patch(color=COLORS["prefill"], label="prefill", **swatch),
                       Patch(color=COLORS["decode"], label="decode", **swatch),
                       Patch(color="#BBBBBB", label="padding", **swatch)],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)       # beside the grid, never over it
    ax2.bar(range(len(steps)), [len(s.seq_ids) for s in steps], color=COLORS["decode"], width=1.0, label="running")
    ax2.bar(range(len(steps)), [s.num_padding for s in steps], bottom=[len(s.seq_ids) for s in steps],
            color="#BBBBBB", width=1.0, label="padding")
    ax2.set(xlabel="engine step", ylabel="batch rows", xlim=(-0.5, len(steps) - 0.5))
    ax2.legend(handles=[Patch(color=COLORS["decode"], label="running", **swatch),
                        Patch(color="#BBBBBB", label="padding", **swatch)],
               loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return finish(fig)


# Block map colours: one per sequence (by id, so a sequence keeps its colour from one snapshot to the next), and
# one that no sequence gets for blocks several sequences share.
_SEQ_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#937860", "#DA8BC3", "#CCB974", "#64B5CD"]
_SHARED = "#6A3D9A"


def _owner_color(owners) -> str:
    if not owners:
        return COLORS["free"]
    return _SHARED if len(owners) > 1 else _SEQ_COLORS[owners[0] % len(_SEQ_COLORS)]


def plot_block_map(snapshot, title: str = "KV pool: colour = owner, xN = shared by N, hatched = prefix-cached, "
                                          "bar = slots filled"):
    """snapshot: LLMEngine.block_snapshot(). Each block a cell, coloured by owning sequence; a number for
    shared blocks' owner count; hatched if it is a prefix-cache block; its fill as a bar."""
    n = snapshot.num_blocks
    cols = int(np.ceil(np.sqrt(n * 2)))
    rows = int(np.ceil(n / cols))
    fig, axes = new_figure(width=min(12, 0.5 * cols + 3.8), height=min(8, 0.5 * rows + 1.4))
    ax = axes[0][0]
    for b in range(n):
        r, c = divmod(b, cols)
        owners = snapshot.owners[b]
        color = _owner_color(owners)
        ax.add_patch(Rectangle((c, -r), 0.92, -0.92, facecolor=color, alpha=0.35 if owners else 1,
                               hatch="//" if snapshot.cached[b] else None, ec="gray", lw=0.5))
        if owners:
            ax.add_patch(Rectangle((c, -r - 0.92), 0.92 * snapshot.filled[b] / snapshot.block_size,
                                   0.18, color=color))
        if len(owners) > 1:
            ax.text(c + 0.46, -r - 0.4, f"x{len(owners)}", ha="center", va="center", fontsize=7)
    ax.set(xlim=(0, cols), ylim=(-rows, 0.1), xticks=[], yticks=[], title=title)
    ax.set_aspect("equal")
    alone = sorted({o[0] for o in snapshot.owners if len(o) == 1})
    handles = [Patch(facecolor=_owner_color([s]), alpha=0.6, ec="gray", label=f"sequence {s}") for s in alone]
    shared = sorted({len(o) for o in snapshot.owners if len(o) > 1})
    if shared:
        handles.append(Patch(facecolor=_SHARED, alpha=0.6, ec="gray",
                             label="shared by " + " or ".join(f"{k}" for k in shared) + " (xN)"))
    if any(snapshot.cached):
        handles.append(Patch(facecolor="white", hatch="//", ec="gray", label="prefix-cached"))
    handles.append(Patch(facecolor=COLORS["free"], ec="gray", label="free"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=7, title="owner",
              title_fontsize=7)
    return finish(fig)


def plot_memory_bars(by_setting: dict, title: str = "KV memory per request at its end: used vs reserved but empty"):
    """by_setting: {label: [RequestMemory]} (minillm.bench.serve.memory_by_request). One panel per setting,
    a stacked bar per request: bytes holding its tokens, bytes reserved but never written, each request once, at
    its end (its peak). The panel title's share is summed over the requests at their ends, not averaged over steps."""
    fig, axes = new_figure(ncols=len(by_setting), width=5 * len(by_setting), height=3.6)
    top = max(r.allocated_bytes for rows in by_setting.values() for r in rows) / 2**20
    for ax, (label, rows) in zip(axes[0], by_setting.items()):
        x = range(len(rows))
        used = [r.used_bytes / 2**20 for r in rows]
        waste = [r.wasted_bytes / 2**20 for r in rows]
        ax.bar(x, used, color=COLORS["kv cache"], label="used")
        ax.bar(x, waste, bottom=used, color=COLORS["no cache"], alpha=0.45, label="wasted")
        total = sum(r.allocated_bytes for r in rows)
        share = sum(r.wasted_bytes for r in rows) / total if total else 0.0
        ax.set(title=f"{label}: {share:.0%} wasted at the requests' ends", xlabel="request", ylabel="MiB",
               ylim=(0, top * 1.3))                             # headroom: the legend sits above the bars
        ax.legend(loc="upper right", ncol=2, fontsize=8)
    fig.suptitle(title, fontsize=10)
    return finish(fig)


def plot_serve_comparison(results: list, title: str = ""):
    """results: ServeResult dicts (bench_serve.replay(...).as_dict()). Throughput, TTFT and TPOT
    (p50 bar, p99 whisker) per setting, side by side."""
    labels = [r["label"] for r in results]
    fig, axes = new_figure(ncols=3, width=12, height=3.6)
    x = range(len(results))
    axes[0][0].bar(x, [r["throughput"] for r in results], color=COLORS["decode"])
    axes[0][0].set(ylabel="output tokens / s", title="throughput")
    for ax, key, name in [(axes[0][1], "ttft", "time to first token"), (axes[0][2], "tpot", "time per output token")]:
        p50 = [r[f"{key}_p50"] * 1e3 for r in results]
        p99 = [r[f"{key}_p99"] * 1e3 for r in results]
        ax.bar(x, p50, color=COLORS["prefill"], label="p50")
        ax.errorbar(x, p50, yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p99)]], fmt="none", ecolor="black",
                    capsize=4, label="p99")
        ax.set(ylabel="ms", title=name, ylim=(0, 1.3 * max(p99 + [1e-9])))   # headroom for the legend
        ax.legend(loc="upper left", ncol=2, fontsize=8)
    for ax in axes[0]:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return finish(fig)


def plot_latency_vs_throughput(sweeps: dict, point_labels=None):
    """sweeps: {label: [ServeResult dicts at increasing arrival rates]}. Each policy's curve: as the
    load rises, throughput saturates and latency (TTFT p99) climbs; the knee is the policy's capacity.
    point_labels: one string per arrival rate (e.g. "2x"), written beside every curve's points."""
    fig, axes = new_figure(width=7.4, height=4.0)
    ax = axes[0][0]
    for i, (label, rows) in enumerate(sweeps.items()):
        x, y = [r["throughput"] for r in rows], [r["ttft_p99"] * 1e3 for r in rows]
        ax.plot(x, y, "-o", ms=4, color=f"C{i}", label=label)
        for text, xx, yy in zip(point_labels or [], x, y):
            ax.annotate(text, (xx, yy), textcoords="offset points", xytext=(5, -9), fontsize=7, color=f"C{i}")
    ax.set(xlabel="throughput (output tokens / s)", ylabel="TTFT p99 (ms)", ylim=(0, None),
           title="Latency against throughput as the arrival rate grows")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return finish(fig)


def longest_token_gap(steps) -> tuple[float, float, float]:
    """The longest wait a decoding sequence sees between two of its tokens, from a trace:
    (gap seconds, the step end it starts at, the one it ends at). Steps that compute no decode token (a prefill
    of its own) leave every decoding sequence waiting."""
    ends = [s.start + s.seconds for s in steps if s.num_decode_tokens]
    if len(ends) < 2:
        return 0.0, 0.0, 0.0
    gap, a, b = max((b - a, a, b) for a, b in zip(ends, ends[1:]))
    return gap, a, b


_KIND_COLORS = {"prefill": COLORS["prefill"], "decode": COLORS["decode"], "mixed": COLORS["formula"]}


def _step_kind(s) -> str:
    """What a step computed: prompt tokens only, decode tokens only, or both (a chunked-prefill step)."""
    if s.num_prefill_tokens and s.num_decode_tokens:
        return "mixed"
    return "prefill" if s.num_prefill_tokens else "decode"


def plot_step_latency(runs: dict, arrival: float | None = None,
                      title: str = "Per-step latency: each bar one model call, as wide and as tall as it took"):
    """runs: {label: Trace.steps} timed on the same clock. One panel per run: every step a bar from its start,
    as wide and as tall as it took (a long step is a big block), coloured by what it computed (prompt tokens,
    decode tokens, or both: decodes and a prompt chunk); a vertical line at `arrival` (seconds), and the longest
    wait between two decode tokens (longest_token_gap) marked above the bars."""
    fig, axes = new_figure(nrows=len(runs), width=10, height=1.9 * len(runs) + 0.8)
    top = 1e3 * max(s.seconds for steps in runs.values() for s in steps)
    for ax, (label, steps) in zip(axes[:, 0], runs.items()):
        for s in steps:
            ax.bar(1e3 * s.start, 1e3 * s.seconds, width=1e3 * s.seconds, align="edge",
                   color=_KIND_COLORS[_step_kind(s)], ec="white", lw=0.3)
        gap, a, b = longest_token_gap(steps)
        ax.annotate("", (1e3 * a, 1.15 * top), (1e3 * b, 1.15 * top), arrowprops=dict(arrowstyle="<->", lw=1))
        ax.text(1e3 * (a + b) / 2, 1.2 * top, f"longest wait between two tokens: {1e3 * gap:.1f} ms",
                ha="center", va="bottom", fontsize=8)
        if arrival is not None:
            ax.axvline(1e3 * arrival, color="black", ls=":", lw=1)
        ax.set(ylabel="step (ms)", ylim=(0, 1.45 * top), title=label)
        ax.title.set_fontsize(9)
        ax.grid(axis="y", alpha=0.3)
    axes[-1][0].set_xlabel("time (ms)")
    names = {"prefill": "prompt tokens only", "decode": "decode tokens only", "mixed": "decodes + a prompt chunk"}
    handles = [Patch(color=c, label=names[k], ec="black", lw=0.5) for k, c in _KIND_COLORS.items()]
    if arrival is not None:
        handles.append(Line2D([], [], color="black", ls=":", label="long prompt arrives"))
    axes[0][0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.suptitle(title, fontsize=10)
    return finish(fig)


def plot_kv_over_time(runs: dict, pool_bytes: int | None = None,
                      title: str = "KV cache over time: blocks reserved and slots holding tokens"):
    """runs: {label: Trace.steps}. One panel per run (shared axes): the bytes of the blocks in use after each
    step (kv_bytes_used) and the bytes holding tokens (kv_bytes_filled); the gap between them is reserved but
    empty (static batching's padding rows keep theirs until the batch ends)."""
    fig, axes = new_figure(ncols=len(runs), width=3.6 * len(runs) + 1.4, height=3.2)
    end = max(s.start + s.seconds for steps in runs.values() for s in steps)
    for ax, (label, steps) in zip(axes[0], runs.items()):
        t = [s.start + s.seconds for s in steps]
        used = [mib(s.kv_bytes_used) for s in steps]
        filled = [mib(s.kv_bytes_filled) for s in steps]
        ax.fill_between(t, used, step="post", color=COLORS["no cache"], alpha=0.3, lw=0)
        ax.fill_between(t, filled, step="post", color=COLORS["kv cache"], alpha=0.9, lw=0)
        ax.set(title=f"{label}: peak {max(used):.2f} MiB", xlabel="time (s)", xlim=(0, end))
        ax.title.set_fontsize(9)
        if pool_bytes:
            ax.axhline(mib(pool_bytes), color="black", ls=":", lw=1)
        ax.grid(alpha=0.3)
    for ax in axes[0][1:]:
        ax.sharey(axes[0][0])
        ax.tick_params(labelleft=False)
    axes[0][0].set_ylabel("MiB")
    handles = [Patch(color=COLORS["kv cache"], label="holding tokens"),
               Patch(color=COLORS["no cache"], alpha=0.3, label="reserved, empty")]
    if pool_bytes:
        handles.append(Line2D([], [], color="black", ls=":", label="the pool"))
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    fig.suptitle(title, fontsize=10)
    return finish(fig)


def plot_ttft_vs_rate(rates, series: dict, title: str = "Time to first token as the arrival rate grows"):
    """rates: arrival rates (requests/s); series: {label: {"p50": [seconds per rate], "p99": [...]}}.
    One colour per label: p50 solid, p99 dashed."""
    fig, axes = new_figure(width=7.4, height=3.8)
    ax = axes[0][0]
    for i, (label, ys) in enumerate(series.items()):
        for key, style in (("p50", "-o"), ("p99", "--s")):
            if key in ys:
                ax.plot(rates, [1e3 * y for y in ys[key]], style, ms=4, color=f"C{i}", label=f"{label}, {key}")
    from matplotlib.ticker import NullFormatter

    ax.set(xscale="log", xlabel="arrival rate (requests / s)", ylabel="TTFT (ms)", title=title, ylim=(0, None))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(list(rates))
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.3g}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return finish(fig)


def plot_block_size_cost(block_sizes, step_ms, waste, title: str = "Block size: time against memory"):
    """block_sizes; step_ms: measured milliseconds (per decode step's attention) at each; waste: the share of
    reserved KV bytes left empty at each. Left: the time small blocks cost; right: the memory large ones waste."""
    fig, axes = new_figure(ncols=2, width=11, height=3.4)
    ax, ax2 = axes[0]
    labels = [str(b) for b in block_sizes]
    ax.bar(labels, step_ms, color=COLORS["decode"])
    ax.set(xlabel="block_size (tokens)", ylabel="ms", title="attention (gather + softmax) per decode step")
    ax2.bar(labels, [100 * w for w in waste], color=COLORS["no cache"], alpha=0.7)
    ax2.set(xlabel="block_size (tokens)", ylabel="% of reserved KV bytes empty", title="memory reserved but empty")
    for a in (ax, ax2):
        a.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return finish(fig)


def explorer_run(run, block_size: int = 16, batching: str = "continuous", token_budget: int = 0, **setting):
    """One setting of the serving explorer: run(block_size=..., batching=..., token_budget=..., **setting) replays
    a workload and returns (trace steps, a line of numbers) (minillm.bench.replay.explorer_replay, bound to a model
    and workload) -> (figure of its timeline, the line). The widget calls this for every change; tests call it."""
    steps, line = run(block_size=block_size, batching=batching, token_budget=token_budget, **setting)
    chunk = f", chunk budget {token_budget}" if token_budget and batching == "continuous" else ""
    fig = plot_timeline(steps, title=f"{batching}, block_size {block_size}{chunk}")
    return fig, line


def serving_explorer(run, max_model_len: int = 256):
    """Controls for block size, KV bytes, batching and the chunked-prefill token budget; each change calls
    run(block_size=, kv_sequences=, batching=, token_budget=) -> (trace steps, a line of numbers), e.g.
    functools.partial(minillm.bench.replay.explorer_replay, model, tokenizer, workload, max_model_len), which
    replays the workload on a fresh engine, and draws its timeline and numbers.
    A VBox of the controls and an Output (run it in a live notebook). Each drawing is a figure pyplot never
    holds (viz/widget.py says why), shown with display() inside the Output; the last one stays in `.figure`
    (and its numbers in `.summary`) for tests."""
    import ipywidgets as widgets
    from IPython.display import display

    from .widget import figure_for_widget

    style = {"description_width": "initial"}          # whole labels ("chunk budget", not "chunk bu...")
    controls = [
        widgets.Dropdown(options=sorted({1, 4, 16, 64, max_model_len}), value=16, description="block_size",
                         style=style),
        widgets.FloatSlider(4.0, min=1.0, max=16.0, step=0.5, description="KV (x seq)", style=style),
        widgets.Dropdown(options=["static", "dynamic", "continuous"], value="continuous", description="batching",
                         style=style),
        widgets.Dropdown(options=[0, 32, 64, 128, 256], value=0, description="chunk budget", style=style)]
    names = ["block_size", "kv_sequences", "batching", "token_budget"]
    out = widgets.Output()
    box = widgets.VBox([*controls, out])

    def redraw(_change=None):
        values = {n: c.value for n, c in zip(names, controls)}
        fig, line = figure_for_widget(explorer_run, run, **values)
        with out:
            out.clear_output(wait=True)
            print(line)
            display(fig)
        box.figure, box.summary = fig, line

    for c in controls:
        c.observe(redraw, names="value")
    redraw()
    return box


def block_map_explorer(snapshots, start: int = 1):
    """A slider over engine steps showing plot_block_map(snapshots[step - 1]); the figure is drawn, shown with
    display() inside an Output (as serving_explorer), the last one kept in `.figure` for tests."""
    import ipywidgets as widgets
    from IPython.display import display

    from .widget import figure_for_widget

    slider = widgets.IntSlider(start, min=1, max=len(snapshots), description="step",
                               style={"description_width": "initial"})
    out = widgets.Output()
    box = widgets.VBox([slider, out])

    def redraw(_change=None):
        fig = figure_for_widget(plot_block_map, snapshots[slider.value - 1], title=f"after step {slider.value}")
        with out:
            out.clear_output(wait=True)
            display(fig)
        box.figure = fig

    slider.observe(redraw, names="value")
    redraw()
    return box


def plot_block_size_sweep(block_sizes, waste, concurrency, kv_bytes: int):
    """One workload replayed at several block sizes in the same KV bytes: the share of reserved KV bytes
    holding no token (mean over steps), and the most sequences that ran at once."""
    fig, axes = new_figure(ncols=2, width=11, height=3.6)
    ax, ax2 = axes[0]
    labels = [str(b) for b in block_sizes]
    ax.bar(labels, [100 * w for w in waste], color=COLORS["no cache"], alpha=0.7)
    ax.set(xlabel="block_size (the last is max_model_len: the contiguous cache)", ylabel="% of reserved KV bytes empty",
           title="Waste: only a sequence's last block is partly empty")
    ax2.bar(labels, concurrency, color=COLORS["kv cache"])
    ax2.set(xlabel="block_size", ylabel="peak sequences running",
            title=f"Concurrency in the same {human_bytes(kv_bytes)}")
    for a in (ax, ax2):
        a.grid(axis="y", alpha=0.3)
    return finish(fig)
