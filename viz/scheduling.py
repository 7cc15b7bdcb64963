"""Scheduling pictures (notebook 11): who waited and who was served on a request timeline, JCT and goodput per
order, each client's service over time, latency against utilisation, and the prefix cache drawn two ways (a radix
tree of token runs beside the block manager's chain of block hashes).

Inputs are plain data: RequestOutputs (their metrics: arrival, token times, finish), bench sched's result dicts, a
minillm.scheduling.radix.RadixTree and token-id lists."""
from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch, Rectangle

from ._figure import COLORS, finish, new_figure

_WAIT, _LONG, _SHORT = "#DDDDDD", "#C44E52", "#4C72B0"


def plot_request_timelines(runs: dict, long_tokens: int = 64, title: str = "Who waited, who was served",
                           steps: bool = False):
    """runs: {label: [RequestOutput]} (the same requests under several orders). One row per request in arrival
    order: a grey bar from its arrival to its first token (waiting), then a tick at each of its tokens (red for a
    long request, over long_tokens, blue for a short one). Head-of-line blocking is a column of grey bars behind
    a few red rows; a gap in a row's ticks is a preemption. steps: the engine's clock counted steps, not seconds."""
    fig, axes = new_figure(ncols=len(runs), width=5.2 * len(runs), height=4.2)
    end = max(o.metrics.finished_time for outs in runs.values() for o in outs)
    for ax, (label, outs) in zip(axes[0], runs.items()):
        outs = sorted(outs, key=lambda o: (o.metrics.arrival_time, int(o.request_id)))
        for row, o in enumerate(outs):
            m = o.metrics
            ax.add_patch(Rectangle((m.arrival_time, row - 0.4), m.first_token_time - m.arrival_time, 0.8,
                                   color=_WAIT, lw=0))
            color = _LONG if len(o.outputs[0].token_ids) > long_tokens else _SHORT
            ax.plot(m.token_times, [row] * len(m.token_times), "|", color=color, ms=3, mew=0.6)
        jct = np.mean([o.metrics.finished_time - o.metrics.arrival_time for o in outs])
        ax.set(xlim=(0, end * 1.02), ylim=(len(outs), -1), xlabel="engine step" if steps else "seconds",
               ylabel="request (arrival order)",
               title=f"{label}: mean JCT " + (f"{jct:.1f} steps" if steps else f"{jct * 1e3:.0f} ms"))
    axes[0][0].legend(handles=[Patch(color=_WAIT, label="waiting for its first token"),
                               Patch(color=_SHORT, label=f"tokens, short request (<= {long_tokens})"),
                               Patch(color=_LONG, label=f"tokens, long request (> {long_tokens})")],
                      loc="lower left", fontsize=7)
    fig.suptitle(title, fontsize=10)
    return finish(fig)


def plot_order_comparison(runs: dict, title: str = ""):
    """runs: bench sched's {order: metrics dict}. Mean and p99 job completion time, and goodput under the SLO."""
    names = list(runs)
    x = np.arange(len(names))
    fig, axes = new_figure(ncols=3, width=12, height=3.4)
    for ax, key, label in [(axes[0][0], "jct_mean", "mean JCT (ms)"), (axes[0][1], "jct_p99", "p99 JCT (ms)")]:
        ax.bar(x, [runs[n][key] * 1e3 for n in names], color=COLORS["prefill"])
        ax.set(ylabel=label, title=label.split(" (")[0])
    axes[0][2].bar(x, [runs[n]["goodput"] for n in names], color=COLORS["kv cache"])
    axes[0][2].set(ylabel="requests / s", title="goodput (both SLO targets met)")
    for ax in axes[0]:
        ax.set_xticks(x)
        ax.set_xticklabels(names)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return finish(fig)


def plot_client_service(runs: dict, title: str = "Service each client received"):
    """runs: {label: [(client, token_times)]}, one pair per request. Cumulative output tokens served per client
    over time, one panel per label (e.g. fcfs beside fair)."""
    fig, axes = new_figure(ncols=len(runs), width=5.2 * len(runs), height=3.4)
    for ax, (label, rows) in zip(axes[0], runs.items()):
        for i, client in enumerate(sorted({c for c, _ in rows}, key=str)):
            times = np.sort(np.concatenate([np.asarray(t, float) for c, t in rows if c == client] or [np.zeros(0)]))
            ax.step(times, np.arange(1, len(times) + 1), where="post", color=f"C{i}", label=f"client {client}")
        ax.set(xlabel="seconds", ylabel="output tokens served", title=label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=10)
    return finish(fig)


def plot_latency_vs_utilisation(utilisation, series: dict, theory=None,
                                title: str = "Mean job completion time as the load grows"):
    """utilisation: arrival rate / capacity per point; series: {label: [mean JCT seconds]}; theory: optional
    {label: [seconds]} drawn dashed (e.g. M/M/1's E[S] / (1 - rho))."""
    fig, axes = new_figure(width=7.0, height=3.8)
    ax = axes[0][0]
    for i, (label, ys) in enumerate(series.items()):
        ax.plot(utilisation, np.asarray(ys) * 1e3, "-o", ms=4, color=f"C{i}", label=label)
    for i, (label, ys) in enumerate((theory or {}).items()):
        ax.plot(utilisation, np.asarray(ys) * 1e3, "--", color=f"C{i + len(series)}", label=label)
    ax.set(xlabel="utilisation (arrival rate / capacity)", ylabel="mean JCT (ms)", title=title, ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return finish(fig)


# ---------------------------------------------------------------------------- the prefix cache, two ways
def _layout(edges):
    """edges: (start depth, parent id, child id, tokens), depth first. -> {node id: y}, leaves one row apart,
    an inner node at the middle of its children."""
    children, ys = {}, {}
    for _, parent, child, _ in edges:
        children.setdefault(parent, []).append(child)
    row = [0]

    def place(node):
        kids = children.get(node, [])
        for k in kids:
            place(k)
        ys[node] = float(np.mean([ys[k] for k in kids])) if kids else float(row[0])
        row[0] += 0 if kids else 1
    for root in {p for _, p, _, _ in edges} - {c for _, _, c, _ in edges}:
        place(root)
    return ys


def _draw_runs(ax, edges, label, dashed=frozenset()):
    ys = _layout(edges)
    for start, parent, child, tokens in edges:
        y, y0 = ys[child], ys[parent]
        if start:
            ax.plot([start, start], [y0, y], color="#999999", lw=0.8, zorder=1)
        ax.add_patch(Rectangle((start, y - 0.3), len(tokens), 0.6, fc="white" if child in dashed else "#DCE6F2",
                               ec=COLORS["prefill"], ls="--" if child in dashed else "-", lw=0.8, zorder=2))
        text, room = label(tokens, child), max(2, int(1.5 * len(tokens)))      # about 1.5 characters fit a token
        ax.text(start + len(tokens) / 2, y, text if len(text) <= room else text[:room - 1] + "…", ha="center",
                va="center", fontsize=7, zorder=3)
    return max(ys.values(), default=0)


def draw_prefix_caches(tree, sequences, block_size: int, label=None,
                       title: str = "One cache, two structures"):
    """tree: a RadixTree holding `sequences` (token-id lists); label(tokens) -> text for a run of tokens (default:
    the ids). Left: the radix tree, one box per edge (a run of tokens shared by every sequence below it), x = token
    position. Right: the block manager's prefix cache of the same sequences: one box per full block, named by its
    chained hash (equal prefixes, equal names), and each sequence's last partial block dashed: never cached."""
    from minillm.core.block_manager import BlockManager
    label = label or (lambda toks: " ".join(map(str, toks)))
    blocks, seen, dashed = [], {}, set()
    for seq in sequences:                                   # a trie of blocks, keyed by the chained hashes
        parent, h = "root", None
        for i in range(0, len(seq), block_size):
            toks = tuple(seq[i:i + block_size])
            full = len(toks) == block_size
            h = BlockManager.chain_hash(h, toks) if full else (h or b"") + bytes(str(toks), "utf8")
            node = seen.get(h)
            if node is None:
                node = seen[h] = len(seen) + 1
                blocks.append((i, parent, node, toks, h.hex()[:6] if full else "partial"))
                if not full:
                    dashed.add(node)
            parent = node
    names = {b[2]: b[4] for b in blocks}
    width = max((len(s) for s in sequences), default=1)
    fig, axes = new_figure(ncols=2, width=13, height=0.55 * max(4, len(sequences)) + 1.6)
    ax_t, ax_b = axes[0]
    top = _draw_runs(ax_t, tree.edges(), lambda toks, _: label(toks))
    ax_t.set(title=f"radix tree: {len(tree.edges())} runs, {tree.size} tokens stored once")
    top_b = _draw_runs(ax_b, [b[:4] for b in blocks], lambda toks, node: names[node], dashed)
    ax_b.set(title=f"block hashes (block_size {block_size}): {len(blocks) - len(dashed)} cached blocks, "
                   f"{len(dashed)} partial")
    for ax, t in ((ax_t, top), (ax_b, top_b)):
        ax.set(xlim=(-0.5, width + 0.5), ylim=(t + 0.8, -0.8), xlabel="token position", yticks=[])
    fig.suptitle(title, fontsize=10)
    return finish(fig)
