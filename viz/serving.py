"""Serving pictures from the engine's records: the request timeline and the KV block map."""
from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle

from ._figure import COLORS, finish, human_bytes, new_figure

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
    ax.legend(handles=[Patch(color=COLORS["prefill"], label="prefill"), Patch(color=COLORS["decode"], label="decode"),
                       Patch(color="#BBBBBB", label="padding")], frameon=False, loc="upper right", fontsize=8)
    ax2.bar(range(len(steps)), [len(s.seq_ids) for s in steps], color=COLORS["decode"], width=1.0, label="running")
    ax2.bar(range(len(steps)), [s.num_padding for s in steps], bottom=[len(s.seq_ids) for s in steps],
            color="#BBBBBB", width=1.0, label="padding")
    ax2.set(xlabel="engine step", ylabel="batch rows", xlim=(-0.5, len(steps) - 0.5))
    ax2.legend(frameon=False, fontsize=8)
    return finish(fig)


def plot_block_map(snapshot, title: str = "KV pool: colour = owner, xN = shared by N, hatched = prefix-cached, "
                                          "bar = slots filled"):
    """snapshot: LLMEngine.block_snapshot(). Each block a cell, coloured by owning sequence; a number for
    shared blocks' owner count; hatched if it is a prefix-cache block; its fill as a bar."""
    n = snapshot.num_blocks
    cols = int(np.ceil(np.sqrt(n * 2)))
    rows = int(np.ceil(n / cols))
    fig, axes = new_figure(width=min(12, 0.5 * cols + 2), height=min(8, 0.5 * rows + 1.2))
    ax = axes[0][0]
    for b in range(n):
        r, c = divmod(b, cols)
        owners = snapshot.owners[b]
        color = f"C{owners[0] % 10}" if owners else "#EEEEEE"
        ax.add_patch(Rectangle((c, -r), 0.92, -0.92, color=color, alpha=0.35 if owners else 1,
                               hatch="//" if snapshot.cached[b] else None, ec="gray", lw=0.5))
        if owners:
            ax.add_patch(Rectangle((c, -r - 0.92), 0.92 * snapshot.filled[b] / snapshot.block_size,
                                                                      0.18, color=color))
        if len(owners) > 1:
            ax.text(c + 0.46, -r - 0.4, f"x{len(owners)}", ha="center", va="center", fontsize=7)
    ax.set(xlim=(0, cols), ylim=(-rows, 0.1), xticks=[], yticks=[], title=title)
    ax.set_aspect("equal")
    return finish(fig)


def plot_memory_bars(by_setting: dict, title: str = "KV memory per request: used vs reserved but empty"):
    """by_setting: {label: [RequestMemory]} (minillm.bench.serve.memory_by_request). One panel per setting,
    a stacked bar per request: bytes holding its tokens, bytes reserved but never written."""
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
        ax.set(title=f"{label}: {share:.0%} wasted", xlabel="request", ylabel="MiB", ylim=(0, top * 1.05))
        ax.legend(frameon=False, fontsize=8)
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
        ax.set(ylabel="ms", title=name)
        ax.legend(frameon=False, fontsize=8)
    for ax in axes[0]:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return finish(fig)


def plot_latency_vs_throughput(sweeps: dict):
    """sweeps: {label: [ServeResult dicts at increasing arrival rates]}. Each policy's curve: as the
    load rises, throughput saturates and latency (TTFT p99) climbs; the knee is the policy's capacity."""
    fig, axes = new_figure(width=6.4, height=3.8)
    ax = axes[0][0]
    for i, (label, rows) in enumerate(sweeps.items()):
        ax.plot([r["throughput"] for r in rows], [r["ttft_p99"] * 1e3 for r in rows], "-o", ms=3, color=f"C{i}",
                label=label)
    ax.set(xlabel="throughput (output tokens / s)", ylabel="TTFT p99 (ms)", yscale="log",
           title="Latency against throughput as the arrival rate grows")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    return finish(fig)


def serving_explorer(model, tokenizer, workload, max_model_len: int = 256):
    """Controls for block size, KV bytes, batching and the chunked-prefill token budget; each change
    replays `workload` (minillm.bench.workload requests) on a fresh engine and draws its timeline and numbers.
    An ipywidgets.interactive (run it in a live notebook)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    from ..bench.serve import replay

    per_seq = max_model_len * model.config.kv_bytes_per_token(4)

    def show(block_size=16, kv_sequences=4.0, batching="continuous", token_budget=0):
        opts = dict(block_size=block_size, max_model_len=max_model_len, kv_cache_bytes=int(kv_sequences * per_seq),
                    batching=batching, trace=True)
        if token_budget and batching == "continuous":   # chunked prefill is a continuous-batching policy
            opts.update(enable_chunked_prefill=True, max_num_batched_tokens=token_budget)
        res, engine, _ = replay(model, tokenizer, workload, batching, return_engine=True, **opts)
        print(f"{res.throughput:.0f} tokens/s, TTFT p50 {res.ttft_p50 * 1e3:.0f} ms, KV waste {res.kv_waste:.1%}, "
              f"peak {res.peak_running} sequences, {res.preemptions} preemptions")
        plot_timeline(engine.trace.steps, title=f"{batching}, block_size {block_size}")
        plt.show()

    return widgets.interactive(
        show, block_size=widgets.Dropdown(options=[1, 4, 16, 64, max_model_len], value=16),
        kv_sequences=widgets.FloatSlider(4.0, min=1.0, max=16.0, step=0.5, description="KV (x seq)"),
        batching=widgets.Dropdown(options=["static", "dynamic", "continuous"], value="continuous"),
        token_budget=widgets.Dropdown(options=[0, 32, 64, 128, 256], value=0, description="chunk budget"))


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
