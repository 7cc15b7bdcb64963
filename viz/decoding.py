"""Notebook 10's pictures: decoding strategies reshaping one distribution, beams forking and pruned, a regex's DFA,
the legal tokens at each step of a constrained generation, and what masking costs per step. Each draws plain data
(probabilities, token ids, a DFA's edge list, counts, milliseconds) that the notebook took from the engine."""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

from ._figure import finish, new_figure
from .sampling import visible

KEPT, DROPPED, PRUNED, BEST = "#4C72B0", "#DDDDDD", "#C44E52", "#55A868"


# ---------------------------------------------------------------------------- strategies on one distribution
def plot_strategies(dists: dict, labels=None, k: int = 12, marked=()):
    """dists: {strategy name: probabilities (V,)}, the first one the untouched distribution (its top k tokens set
    the bars' order). One panel per strategy: the probability each of those tokens gets, grey where the strategy
    sets it to 0; the title says how many tokens of the whole vocabulary keep a probability. labels: V token
    pieces; marked: token ids to outline (e.g. the tokens a penalty saw)."""
    names = list(dists)
    first = torch.as_tensor(dists[names[0]]).double()
    top = torch.topk(first, min(k, first.shape[-1])).indices.tolist()
    ticks = [visible(labels[i]) if labels is not None else str(i) for i in top]
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = new_figure(ncols=cols, nrows=rows, width=3.3 * cols, height=2.6 * rows)
    ymax = max(float(torch.as_tensor(p).double()[top].max()) for p in dists.values()) * 1.1
    for j, ax in enumerate(axes.flat):
        if j >= len(names):
            ax.axis("off")
            continue
        p = torch.as_tensor(dists[names[j]]).double()
        vals = p[top].tolist()
        ax.bar(range(len(top)), vals, color=[KEPT if v > 0 else DROPPED for v in vals],
               edgecolor=["black" if t in marked else "none" for t in top], linewidth=1.2)
        for i, v in enumerate(vals):
            if v == 0:
                ax.text(i, ymax * 0.02, "0", ha="center", va="bottom", fontsize=6, color="#888888")
        ax.set_title(f"{names[j]}\n{int((p > 0).sum())} tokens kept", fontsize=8.5)
        ax.set_ylim(0, ymax)
        ax.set_xticks(range(len(top)))
        ax.set_xticklabels(ticks, rotation=60, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"One next-token distribution, reshaped: the {len(top)} most likely tokens"
                 + (" (outlined: tokens already in the text)" if len(marked) else ""), fontsize=10)
    return finish(fig)


# ---------------------------------------------------------------------------- beams
def draw_beam_tree(steps, labels=None, best=None, title: str = ""):
    """steps: after each beam-search step, the live beams' generated ids (one list per beam). Every prefix a beam
    held is a node (x = its length, the token it ends with as its label), linked to its parent prefix; a prefix no
    later beam extends was pruned (red, crossed) unless it is in the last step or in best (green: the ids returned
    first). labels: token id -> piece (a list or dict)."""
    nodes: dict = {(): (0, 0.0)}
    rank: dict = {}
    for step in steps:
        for r, beam in enumerate(step):
            for d in range(1, len(beam) + 1):
                rank.setdefault(tuple(beam[:d]), (len(rank), r))
    by_depth: dict = {}
    for prefix in rank:
        by_depth.setdefault(len(prefix), []).append(prefix)
    for d in sorted(by_depth):                                   # children under their parents: few crossings
        prefixes = by_depth[d]
        prefixes.sort(key=lambda p: (-nodes[p[:-1]][1], rank[p]))
        for i, p in enumerate(prefixes):
            nodes[p] = (d, -(i - (len(prefixes) - 1) / 2))
    last = {tuple(b) for b in steps[-1]} if steps else set()
    best = tuple(best) if best is not None else None
    on_best = {best[:d] for d in range(len(best) + 1)} if best else set()
    parents = {p[:-1] for p in nodes if p}
    depth = max((len(p) for p in nodes), default=1)
    height = max(len(v) for v in by_depth.values()) if by_depth else 1
    fig, axes = new_figure(width=min(14, 1.0 + 0.85 * depth), height=min(7, 1.4 + 0.45 * height))
    ax = axes[0, 0]
    for p, (x, y) in nodes.items():
        if p:
            px, py = nodes[p[:-1]]
            hot = p in on_best
            ax.plot([px, x], [py, y], "-", color=BEST if hot else "#AAAAAA", lw=2.2 if hot else 0.8, zorder=1)
    for p, (x, y) in nodes.items():
        if not p:
            ax.text(x, y, "prompt", ha="center", va="center", fontsize=8, bbox=dict(fc="white", ec="#555555"))
            continue
        pruned = p not in parents and p not in last and p not in on_best
        color = BEST if p in on_best else PRUNED if pruned else "#333333"
        piece = labels[p[-1]] if labels is not None else str(p[-1])
        ax.text(x, y, visible(piece), ha="center", va="center", fontsize=7, color=color, zorder=3,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=color, lw=1.2 if p in on_best else 0.6))
        if pruned:
            ax.plot([x + 0.32], [y], marker="x", color=PRUNED, ms=5, zorder=4)
    ax.set_xlim(-0.6, depth + 0.6)
    ax.set_ylim(-height / 2 - 0.3, height / 2 + 0.3)
    ax.set_yticks([])
    ax.set_xlabel("generated tokens (one beam step each)")
    for s in ("top", "right", "left"):
        ax.spines[s].set_visible(False)
    ax.set_title(title or "Beams: every prefix a beam held (green: the best result; red x: pruned)", fontsize=9.5)
    return finish(fig)


# ---------------------------------------------------------------------------- a regex's DFA
def _chars(ranges) -> str:
    def one(b):
        return "␣" if b == 32 else chr(b) if 33 <= b < 127 else f"0x{b:02X}"
    return ",".join(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}" for lo, hi in ranges)


def _quoted(label: str) -> str:
    return f"'{label}'" if len(label) == 1 and not label.isalnum() and label != "␣" else label   # '.' stays visible


def byte_label(ranges) -> str:
    """[(lo, hi), ...] byte ranges as a short label: 'a-z', '␣' (a space), "'.'", '0x80-0xBF'."""
    return _quoted(_chars(ranges))


def _chains(num_states: int, edges, accepting, start: int = 0):
    """Merge runs of single-byte, single-way states into one edge: -> [(from, to, label)] over the kept states."""
    out_e = [[] for _ in range(num_states)]
    indeg = [0] * num_states
    for a, b, r in edges:
        out_e[a].append((b, r))
        indeg[b] += 1

    def passthrough(s):
        return (s != start and not accepting[s] and indeg[s] == 1 and len(out_e[s]) == 1
                and out_e[s][0][0] != s and len(out_e[s][0][1]) == 1 and out_e[s][0][1][0][0] == out_e[s][0][1][0][1])
    merged = []
    for a in range(num_states):
        if passthrough(a):
            continue
        for b, r in out_e[a]:
            label = _chars(r)
            while passthrough(b):
                nb, nr = out_e[b][0]
                label += _chars(nr)
                b = nb
            merged.append((a, b, _quoted(label)))
    return merged


def draw_dfa(num_states: int, edges, accepting, start: int = 0, merge_chains: bool = True, title: str = ""):
    """A DFA over bytes (minillm.guided: dfa.edges() -> [(from, to, [(byte lo, byte hi), ...])], dfa.accepting):
    states left to right by their distance from the start, the start with an arrow in, accepting states filled with a
    double ring, each edge labelled with its bytes (␣ is a space). merge_chains draws a run of states that each have
    one way in and one byte out as one edge labelled with the bytes it spells (their states are not drawn)."""
    accepting = [bool(a) for a in accepting]
    merged = _chains(num_states, edges, accepting, start) if merge_chains else \
        [(a, b, byte_label(r)) for a, b, r in edges]
    keep = sorted({start} | {a for a, _, _ in merged} | {b for _, b, _ in merged})
    depth, queue = {start: 0}, deque([start])
    while queue:
        s = queue.popleft()
        for a, b, _ in merged:
            if a == s and b not in depth:
                depth[b] = depth[s] + 1
                queue.append(b)
    cols: dict = {}
    for s in keep:
        cols.setdefault(depth.get(s, 0), []).append(s)
    pos = {s: (d, -(i - (len(c) - 1) / 2) * 1.1) for d, c in cols.items() for i, s in enumerate(c)}
    width = max(cols) + 1 if cols else 1
    tall = max(len(c) for c in cols.values()) if cols else 1
    fig, axes = new_figure(width=min(14, 1.6 + 1.5 * width), height=min(6, 1.9 + 1.0 * tall))
    ax = axes[0, 0]
    size = 22                                                    # a state's marker, in points
    pairs: dict = {}
    for a, b, label in merged:
        pairs.setdefault((a, b), []).append(label)
    for (a, b), labels in pairs.items():
        (xa, ya), (xb, yb) = pos[a], pos[b]
        if a == b:                                               # a self-loop: an arc over the state
            ax.annotate("", xy=(xa + 0.06, ya + 0.08), xytext=(xa - 0.06, ya + 0.08), zorder=1,
                        arrowprops=dict(arrowstyle="-|>", color="#555555", lw=0.9, shrinkA=0, shrinkB=0,
                                        connectionstyle="arc3,rad=-2.6"))
            ax.text(xa, ya + 0.34, " | ".join(labels), ha="center", va="bottom", fontsize=8, color="#B05A00")
            continue
        straight = ya == yb and xb == xa + 1 and (b, a) not in pairs
        for k, label in enumerate(labels):                        # parallel edges bend apart
            rad = (0.0 if straight else 0.25) + 0.35 * (k - (len(labels) - 1) / 2)
            ax.annotate("", xy=(xb, yb), xytext=(xa, ya), zorder=1,
                        arrowprops=dict(arrowstyle="-|>", color="#555555", lw=0.9, shrinkA=size / 2 + 1,
                                        shrinkB=size / 2 + 1, connectionstyle=f"arc3,rad={rad}"))
            mx, my = (xa + xb) / 2 + 0.5 * rad * (yb - ya), (ya + yb) / 2 - 0.5 * rad * (xb - xa)   # the arc's middle
            ax.text(mx, my, label, ha="center", va="center", fontsize=10 if len(label) <= 3 else 8, color="#B05A00",
                    fontweight="bold" if len(label) <= 3 else "normal", zorder=2,
                    bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none"))
    for s, (x, y) in pos.items():
        ax.plot([x], [y], "o", ms=size, mfc="#F6C28B" if accepting[s] else "white", mec="#333333", zorder=3)
        if accepting[s]:
            ax.plot([x], [y], "o", ms=size - 6, mfc="none", mec="#333333", zorder=4)
        ax.text(x, y, str(s), ha="center", va="center", fontsize=7, zorder=5)
    sx, sy = pos[start]
    ax.annotate("start", xy=(sx, sy), xytext=(sx - 0.75, sy), fontsize=7.5, va="center", ha="center",
                arrowprops=dict(arrowstyle="-|>", color="#333333", lw=0.9, shrinkB=size / 2 + 1))
    ys = [y for _, y in pos.values()]
    ax.set_xlim(-1.1, width - 0.4)
    ax.set_ylim(min(ys) - 0.7, max(ys) + 0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    shown = len(keep)
    ax.set_title(title or (f"DFA over bytes: {num_states} states"
                           + (f" ({shown} drawn; a chain of one-way states is one edge)" if shown < num_states else "")
                           + "; double ring = accepting"), fontsize=9)
    return finish(fig)


# ---------------------------------------------------------------------------- masks per step, and their cost
def plot_masks_per_step(allowed, chosen, vocab_size: int, forced=None, title: str = ""):
    """allowed: the number of legal tokens at each step of one constrained generation; chosen: the piece emitted
    there; forced: per step, True where the DFA allowed a single next byte string (what jump-forward appends
    without sampling). Bars on a log scale, out of vocab_size."""
    n = len(allowed)
    forced = list(forced) if forced is not None else [False] * n
    fig, axes = new_figure(width=min(12, 2 + 0.55 * n), height=3.4)
    ax = axes[0, 0]
    ax.bar(range(n), allowed, color=["#DD8452" if f else KEPT for f in forced])
    ax.axhline(vocab_size, color="#888888", lw=0.8, ls="--")
    ax.text(n - 0.5, vocab_size, f"vocabulary: {vocab_size}", ha="right", va="bottom", fontsize=7, color="#666666")
    for i, a in enumerate(allowed):
        ax.text(i, a, str(a), ha="center", va="bottom", fontsize=6.5)
    ax.set_yscale("log")
    ax.set_ylim(0.8, vocab_size * 3)
    ax.set_xticks(range(n))
    ax.set_xticklabels([visible(c) for c in chosen], rotation=60, ha="right", fontsize=7.5)
    ax.set(ylabel="legal tokens (log scale)", xlabel="token emitted at each step")
    if any(forced):
        from matplotlib.patches import Patch
        ax.legend(handles=[Patch(color=KEPT, label="the pattern allows several next bytes"),
                           Patch(color="#DD8452", label="the next byte(s) forced: jump-forward would append them")],
                  fontsize=7, frameon=False, loc="upper left")
    ax.set_title(title or "Legal tokens at each step of a constrained generation", fontsize=9.5)
    return finish(fig)


def plot_mask_cost(rows: dict, title: str = ""):
    """rows: {label: (decode step ms, of which the masks' own ms)}. Horizontal bars, the mask part shaded."""
    names = list(rows)
    step = np.array([rows[n][0] for n in names], dtype=float)
    mask = np.array([rows[n][1] or 0.0 for n in names], dtype=float)
    fig, axes = new_figure(width=7, height=0.6 * len(names) + 1.7)
    ax = axes[0, 0]
    y = np.arange(len(names))[::-1]
    ax.barh(y, step - mask, color=KEPT, label="model forward and the rest of the step")
    ax.barh(y, mask, left=step - mask, color="#DD8452", label="computing and applying the masks")
    for yi, s in zip(y, step):
        ax.text(s, yi, f" {s:.2f} ms", va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlim(0, step.max() * 1.25)
    ax.set_xlabel("median decode step (ms)")
    ax.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    ax.set_title(title or "What a constraint costs per step", fontsize=9.5)
    return finish(fig)
