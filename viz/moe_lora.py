"""Mixture of experts and LoRA, drawn (notebook 15): the idea, a sentence's routing, tokens per expert per step, and
what several adapters cost against merged copies. Inputs are the plain dicts minillm.bench.moe returns."""
from __future__ import annotations

import numpy as np

from ._figure import finish, new_figure
from .diagram import arrow, blank, box

EXPERT_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
ADAPTER_COLORS = {"a": "#4C72B0", "b": "#DD8452", "none": "#BBBBBB"}


def draw_moe_and_lora():
    """Two pictures side by side. Left: one token through an MoE layer (router -> top-2 of 4 experts -> gated sum).
    Right: one batch through a linear serving two adapters (x W^T for every row, + each row's own B A)."""
    fig, axes = new_figure(ncols=2, width=10, height=3.4)
    ax = axes[0, 0]
    blank(ax, (0, 6), (0, 4.2))
    box(ax, 0.6, 2.1, 0.8, 0.5, "token x", color="#DCE6F2", fontsize=8)
    box(ax, 1.9, 2.1, 1.0, 0.5, "router\nsoftmax", color="#F6D7B0", fontsize=8)
    arrow(ax, (1.0, 2.1), (1.4, 2.1))
    ys, probs, chosen = [3.5, 2.6, 1.6, 0.7], [0.10, 0.55, 0.05, 0.30], (1, 3)
    for e, (y, p) in enumerate(zip(ys, probs)):
        on = e in chosen
        box(ax, 3.6, y, 1.2, 0.55, f"expert {e}\np = {p:.2f}", color=EXPERT_COLORS[e] if on else "#F2F2F2",
            fontsize=7.5, edge="#333333" if on else "#BBBBBB", textcolor="white" if on else "#999999")
        arrow(ax, (2.4, 2.1), (3.0, y), color="#333333" if on else "#CCCCCC")
        if on:
            arrow(ax, (4.2, y), (4.9, 2.1))
    box(ax, 5.3, 2.1, 0.8, 0.6, "sum,\ngated", color="#DCE6F2", fontsize=8)
    ax.text(3.0, 0.05, "top-2 of 4: gates 0.55/0.85, 0.30/0.85 (renormalised); 2 of 4 experts run",
            ha="center", fontsize=7.5)
    ax.set_title("Mixture of experts: parameters stored x4, compute per token x2", fontsize=9)

    ax = axes[0, 1]
    blank(ax, (0, 6), (0, 4.2))
    rows = ["a", "b", "none", "a", "b"]
    for i, r in enumerate(rows):
        y = 3.5 - 0.62 * i
        box(ax, 0.55, y, 0.8, 0.45, f"row {i}\n{r}", color=ADAPTER_COLORS[r], fontsize=7,
            textcolor="white" if r != "none" else "#333333")
        arrow(ax, (0.95, y), (1.9, 2.3), color="#999999")
    box(ax, 2.6, 2.3, 1.3, 0.8, "x W^T\nevery row\n(one W)", color="#F6D7B0", fontsize=8)
    for j, (r, y) in enumerate((("a", 3.6), ("b", 1.0))):
        box(ax, 2.6, y, 1.3, 0.55, f"(x A_{r}^T) B_{r}^T\nrows of {r} only", color=ADAPTER_COLORS[r], fontsize=7,
            textcolor="white")
        arrow(ax, (3.25, y), (4.3, 2.3), color=ADAPTER_COLORS[r])
    arrow(ax, (3.25, 2.3), (4.3, 2.3))
    box(ax, 4.9, 2.3, 1.0, 0.6, "y (M, N)", color="#DCE6F2", fontsize=8)
    ax.text(3.0, 0.05, "rows grouped per adapter: two small matmuls per adapter, never W + s B A",
            ha="center", fontsize=7.5)
    ax.set_title("LoRA, several adapters in one batch (S-LoRA, Punica)", fontsize=9)
    return finish(fig)


def plot_expert_routing(route: dict, max_tokens: int = 32, title: str | None = None):
    """A sentence's routing: rows = layers, columns = tokens; each cell holds the two experts the token chose
    (most probable first) and is coloured by the first, shaded by its router probability. Beside it, tokens per
    expert per layer. route: minillm.bench.moe.routing_on_text's dict."""
    experts = np.asarray(route["experts"])[:, :max_tokens]                          # (L, T, k)
    probs = np.asarray(route["probs"])[:, :max_tokens]                              # (L, T, E)
    pieces = route["pieces"][:max_tokens]
    L, T, k = experts.shape
    E = probs.shape[-1]
    fig, axes = new_figure(ncols=2, width=11, height=0.38 * L + 1.6)
    ax, bx = axes[0]
    ax.set_position([0.06, 0.25, 0.72, 0.62])
    bx.set_position([0.82, 0.25, 0.16, 0.62])
    top = probs.max(-1)                                                             # (L, T)
    for layer in range(L):
        for t in range(T):
            first = experts[layer, t, 0]
            shade = 0.35 + 0.65 * (top[layer, t] - 1 / E) / (1 - 1 / E)
            ax.add_patch(_cell(t, layer, EXPERT_COLORS[first % len(EXPERT_COLORS)], min(max(shade, 0.2), 1.0)))
            ax.text(t + 0.5, layer + 0.5, "".join(str(e) for e in experts[layer, t]), ha="center", va="center",
                    fontsize=6.5, color="white")
    ax.set_xlim(0, T)
    ax.set_ylim(L, 0)
    ax.set_xticks(np.arange(T) + 0.5)
    ax.set_xticklabels([repr(p)[1:-1] if p else "<s>" for p in pieces], rotation=90, fontsize=7)
    ax.set_yticks(np.arange(L) + 0.5)
    ax.set_yticklabels([f"layer {i}" for i in range(L)], fontsize=7)
    ax.set_title(title or f"experts chosen per token and layer (top-{k}, first = colour, darker = surer)", fontsize=9)
    load = np.zeros((L, E))
    for layer in range(L):
        load[layer] = np.bincount(experts[layer].reshape(-1), minlength=E)
    left = np.zeros(L)
    for e in range(E):
        bx.barh(np.arange(L) + 0.5, load[:, e], left=left, color=EXPERT_COLORS[e], height=0.8, label=f"expert {e}")
        left += load[:, e]
    bx.set_ylim(L, 0)
    bx.set_yticks([])
    bx.set_xlabel("assignments", fontsize=7)
    bx.set_title("per expert", fontsize=8)
    fig.legend(*bx.get_legend_handles_labels(), fontsize=6, loc="lower right", bbox_to_anchor=(0.99, 0.01), ncol=2)
    return fig


def _cell(x, y, color, alpha):
    from matplotlib.patches import Rectangle
    return Rectangle((x, y), 1, 1, facecolor=color, alpha=alpha, edgecolor="white", linewidth=0.5)


def plot_tokens_per_expert(steps: list, layer: int | None = None, title: str | None = None):
    """Tokens per expert in each engine step (stacked), from minillm.bench.moe.load_per_step: one layer's counts, or
    the mean over layers (layer=None). Prefill steps carry every prompt token; decode steps one token per sequence."""
    load = np.asarray([s["load"] for s in steps], dtype=float)                     # (S, L, E)
    counts = load.mean(1) if layer is None else load[:, layer]                     # (S, E)
    S, E = counts.shape
    fig, axes = new_figure(width=8, height=3.2)
    ax = axes[0, 0]
    bottom = np.zeros(S)
    for e in range(E):
        ax.bar(np.arange(S), counts[:, e], bottom=bottom, color=EXPERT_COLORS[e % len(EXPERT_COLORS)],
               label=f"expert {e}", width=0.85)
        bottom += counts[:, e]
    for i, s in enumerate(steps):
        if s["kind"] and s["kind"] != "decode":
            ax.text(i, bottom[i], s["kind"], ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_yscale("symlog", linthresh=10)
    which = "mean over layers" if layer is None else f"layer {layer}"
    ax.set(xlabel="engine step", ylabel=f"assignments ({which})",
           title=title or "tokens per expert in each engine step (k assignments per token)")
    ax.legend(fontsize=7, ncol=E)
    ax.grid(alpha=0.3, axis="y")
    return finish(fig)


def plot_adapter_costs(base_bytes: int, adapter_bytes: int, n_adapters: int, tok_s: dict):
    """Left: bytes to serve n adapters: one base + n adapters, against n merged copies. Right: generated tokens/s
    of each run in tok_s (label -> tokens/s)."""
    fig, axes = new_figure(ncols=2, width=10, height=3.2)
    ax, bx = axes[0]
    n = np.arange(1, n_adapters + 1)
    ax.plot(n, (base_bytes + n * adapter_bytes) / 2**20, "o-", label="one base + n adapters (LoRA slots)")
    ax.plot(n, n * base_bytes / 2**20, "s-", label="n merged copies")
    ax.set(xlabel="adapters served", ylabel="MiB of weights", title="memory", ylim=(0, None))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    labels = list(tok_s)
    bx.bar(labels, [tok_s[k] for k in labels], color=["#8C8C8C", "#4C72B0", "#DD8452"][:len(labels)])
    bx.set(ylabel="generated tokens / s", title="speed (this machine, shown not asserted)")
    bx.tick_params(axis="x", labelsize=7)
    bx.grid(alpha=0.3, axis="y")
    return finish(fig)
