"""How temperature and top-p reshape the next-token distribution; a widget to play with both."""
from __future__ import annotations

import torch

from ..core.sampling import probs_from_logits
from ._figure import finish, new_figure

_WHITESPACE = {"\n": "\\n", "\t": "\\t", "\r": "\\r", " ": "\u2423"}   # newline -> \n, space -> ␣


def visible(piece: str) -> str:
    """A token piece as a label one can see: newline, tab and carriage return written as escapes (\\n),
    spaces as ␣ (so " a" reads ␣a), and an empty piece as ''. A label made only of whitespace is otherwise blank."""
    return "".join(_WHITESPACE.get(ch, ch) for ch in piece) if piece else "''"


def _labels(logits, labels, k):
    top = torch.topk(logits.float(), k).indices.tolist()
    names = [visible(labels[i]) if labels is not None else str(i) for i in top]
    return top, names


def plot_next_token_distribution(logits, temperatures=(0.5, 1.0, 2.0), top_p: float = 1.0, k: int = 12,
                                 labels=None, log: bool = False):
    """Probabilities of the k most likely tokens under each temperature (grouped bars), after top-p.
    logits: (V,); labels: optional list of V strings (token pieces), whitespace drawn visibly (visible());
    log: a logarithmic probability axis, so a flat (high-temperature) distribution's small bars still show."""
    logits = torch.as_tensor(logits).float()
    k = min(k, logits.shape[-1])
    top, names = _labels(logits, labels, k)
    fig, axes = new_figure(width=8, height=3.4)
    ax = axes[0, 0]
    width = 0.8 / len(temperatures)
    for j, t in enumerate(temperatures):
        p = probs_from_logits(logits, t, 0, top_p)[top]                    # (k,)
        ax.bar([i + (j - (len(temperatures) - 1) / 2) * width for i in range(k)], p.tolist(), width,
               label=f"T = {t:g}")
    ax.set_xticks(range(k))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(top=1.5)
    ax.set(ylabel="probability (log scale)" if log else "probability",
           title=f"Next-token distribution, top {k} tokens" + (f" (top-p = {top_p:g})" if top_p < 1 else ""))
    ax.legend(frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return finish(fig)


def sampling_explorer(logits, labels=None, k: int = 12):
    """Sliders for temperature and top-p over one row of logits (an ipywidgets.interactive)."""
    import ipywidgets as widgets

    from .widget import STYLE, figure_for_widget, show_figure

    def show(temperature=1.0, top_p=1.0):
        show_figure(figure_for_widget(plot_next_token_distribution, logits, (temperature,), top_p, k, labels))

    slider = dict(continuous_update=False, style=STYLE)
    return widgets.interactive(show, temperature=widgets.FloatSlider(1.0, min=0.05, max=3.0, step=0.05,
                                                                     description="temperature", **slider),
                               top_p=widgets.FloatSlider(1.0, min=0.05, max=1.0, step=0.05, description="top_p",
                                                         **slider))
