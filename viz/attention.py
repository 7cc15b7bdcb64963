"""One attention head's probabilities as a heatmap: who each query token looks at."""
from __future__ import annotations

import matplotlib
import torch

from ._figure import finish, new_figure


def plot_attention(probs, labels=None, title: str = "attention probabilities"):
    """probs: (T, S) rows summing to 1 (query t over keys s), e.g. one head of one layer.
    Keys in a query's future (the causal mask) are left white."""
    probs = torch.as_tensor(probs).detach().float()
    T, S = probs.shape
    fig, axes = new_figure(width=5.2, height=4.4)
    ax = axes[0, 0]
    future = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)          # (T, S) keys a causal query never sees
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    im = ax.imshow(probs.masked_fill(future, float("nan")).numpy(), cmap=cmap, vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="probability")
    if labels is not None:
        ax.set_xticks(range(S))
        ax.set_xticklabels(labels[:S], rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(T))
        ax.set_yticklabels(labels[:T], fontsize=8)
    ax.set(xlabel="key (earlier token)", ylabel="query (token)", title=title)
    return finish(fig)
