"""A Medusa candidate tree drawn beside its tree-attention mask: each node at its depth (its RoPE position is
base + depth), the accepted path highlighted; the mask's row i marks node i and its ancestors, the only
draft tokens node i attends to. Draws plain data (tokens, parents, the mask); nothing here runs a model."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..core.batch import Draft
from ._figure import finish

ACCEPTED_COLOR = "#55A868"      # a node on the path the target accepted (as viz.spec)


def _np_mask(mask) -> np.ndarray:
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    return np.asarray(mask).astype(bool)


def _tree(parents) -> Draft:
    """The tree as the engine's Draft: node 0 the root (its parent -1), parents first; else a ValueError."""
    parents = [int(p) for p in parents]
    return Draft([0] * len(parents), None, parents).check()


def _depths(parents: list[int]) -> list[int]:
    """Each node's depth, the root's 0 (Draft counts from the newest token before it: 1)."""
    return [d - 1 for d in _tree(parents).depths()]


def ancestor_mask(parents) -> np.ndarray:
    """The tree attention mask: mask[i, j] = node j is node i or one of its ancestors (Draft.mask)."""
    return _tree(parents).mask().numpy()


def visible_label(text) -> str:
    """A token's text as a tree label that is never blank: a newline as \\n, a tab as \\t, a label of spaces
    only as one \u2423 (open box) per space, and an empty string as ''. Other labels keep their spaces."""
    text = str(text).replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    if not text.strip():
        text = text.replace(" ", "\u2423")
    return text or "''"


def _tidy_x(parents: list[int]) -> list[float]:
    """Leaves on consecutive columns in depth-first order (children by index); a parent centred over
    its first and last child."""
    children = [[] for _ in parents]
    roots = []
    for i, p in enumerate(parents):
        (roots if p == -1 else children[p]).append(i)
    x = [0.0] * len(parents)
    next_leaf = 0.0
    stack = [(r, False) for r in reversed(roots)]
    while stack:                                                    # iterative post-order
        node, done = stack.pop()
        if not children[node]:
            x[node], next_leaf = next_leaf, next_leaf + 1
        elif done:
            x[node] = (x[children[node][0]] + x[children[node][-1]]) / 2
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children[node]))
    return x


def draw_medusa_tree(tokens, parents, mask, labels=None, accepted=None):
    """A Medusa (tree) speculation step. Left: the candidate tree top-down (root at the top, one row
    per depth, edges parent -> child), each node showing its label (token text) or token id and its
    index; the accepted path, when given, in green. Right: the tree attention mask as an image, rows
    = query node i, columns = key node j, mask[i, j] = j is i or an ancestor of i, so every
    candidate continuation is scored in one forward pass without seeing its siblings.

    tokens: (N,) ids; parents: (N,) with -1 for the root; mask: (N, N) bool, torch or numpy;
    labels: N strings (whitespace drawn visibly: visible_label); accepted: node indices on the accepted path."""
    tokens = [int(t) for t in tokens]
    parents = [int(p) for p in parents]
    n = len(tokens)
    if len(parents) != n:
        raise ValueError(f"{n} tokens but {len(parents)} parents")
    m = _np_mask(mask)
    if m.shape != (n, n):
        raise ValueError(f"mask must be ({n}, {n}), got {m.shape}")
    if labels is not None and len(labels) != n:
        raise ValueError(f"{n} tokens but {len(labels)} labels")
    depth = _depths(parents)
    x = _tidy_x(parents)
    on_path = {int(a) for a in (accepted or [])}
    n_cols = max(x) + 1 if n else 1
    max_d = max(depth, default=0)
    w_tree, w_mask = max(3.0, 0.9 * n_cols), max(3.0, 0.3 * n + 1.0)
    scale = min(1.0, 18.0 / (w_tree + w_mask))
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(scale * (w_tree + w_mask), max(3.6, max_d + 2.6)),
                                     gridspec_kw={"width_ratios": [w_tree, w_mask]})
    for i, p in enumerate(parents):
        if p != -1:
            hot = i in on_path and p in on_path
            ax_t.plot([x[p], x[i]], [-depth[p], -depth[i]], "-", color=ACCEPTED_COLOR if hot else "#999999",
                      lw=2.5 if hot else 1.0, zorder=1)
    for i in range(n):
        text = visible_label(labels[i]) if labels is not None else str(tokens[i])
        hot = i in on_path
        ax_t.text(x[i], -depth[i], text, ha="center", va="center", fontsize=9, zorder=3,
                  color="white" if hot else "black", fontweight="bold" if hot else "normal",
                  bbox=dict(boxstyle="round,pad=0.3", fc=ACCEPTED_COLOR if hot else "white",
                            ec=ACCEPTED_COLOR if hot else "#555555"))
        ax_t.annotate(str(i), (x[i], -depth[i]), textcoords="offset points", xytext=(0, 12), ha="center",
                      fontsize=7, color="#666666")
    ax_t.set_xlim(-0.7, n_cols - 0.3)
    ax_t.set_ylim(-max_d - 0.6, 0.6)
    ax_t.set_yticks([-d for d in range(max_d + 1)])
    ax_t.set_yticklabels([f"depth {d}" for d in range(max_d + 1)])
    ax_t.set_xticks([])
    for s in ("top", "right", "bottom"):
        ax_t.spines[s].set_visible(False)
    title = f"candidate tree: {n} nodes"
    if on_path:
        title += f", accepted path {sorted(on_path, key=lambda k: depth[k])}"
    ax_t.set_title(title, fontsize=10)

    ax_m.imshow(m.astype(float), cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    fs = 8 if n <= 16 else 6 if n <= 32 else 4
    ax_m.set_xticks(range(n))
    ax_m.set_yticks(range(n))
    ax_m.set_xticklabels([str(i) for i in range(n)], fontsize=fs)
    ax_m.set_yticklabels([str(i) for i in range(n)], fontsize=fs)
    for tick in ax_m.get_yticklabels():
        if int(tick.get_text()) in on_path:
            tick.set_color(ACCEPTED_COLOR)
            tick.set_fontweight("bold")
    ax_m.set(xlabel="key node j", ylabel="query node i", title="tree attention mask: j is i or an ancestor of i")
    ax_m.title.set_fontsize(10)
    return finish(fig)
