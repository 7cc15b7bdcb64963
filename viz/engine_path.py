"""The one path through the engine (DESIGN.md), drawn: text in, RequestOutput out, step() in between."""
from __future__ import annotations

from ._figure import finish, new_figure
from .diagram import arrow, blank, box

# (label, what it holds) along the path, left to right; the middle four are LLMEngine.step()
PATH = [
    ("text", "\"To be, or\""),
    ("Tokenizer\n.encode", "prompt ids"),
    ("scheduler\n.schedule()", "who runs, blocks"),
    ("model(tokens,\npositions, kv, attn)", "logits (B, V)"),
    ("sampler", "next ids"),
    ("scheduler\n.update()", "append, finish,\nfree blocks"),
    ("RequestOutput", "text, token_ids,\nmetrics"),
]


def draw_engine_path():
    """The path of a request through minillm, with the loop that LLMEngine.step() repeats."""
    fig, axes = new_figure(width=10, height=3.0)
    ax = axes[0, 0]
    n = len(PATH)
    xs = [1.6 * i + 0.8 for i in range(n)]
    blank(ax, (0, xs[-1] + 0.8), (0.3, 3.3))
    for i, ((label, holds), x) in enumerate(zip(PATH, xs)):
        inner = 2 <= i <= 5
        box(ax, x, 1.6, 1.3, 0.75, label, color="#F6D7B0" if inner else "#DCE6F2", fontsize=8)
        ax.text(x, 0.95, holds, ha="center", va="top", fontsize=7.5, color="#555555")
        if i:
            arrow(ax, (xs[i - 1] + 0.65, 1.6), (x - 0.65, 1.6))
    # the loop: update -> schedule again, until every request is finished
    arrow(ax, (xs[5], 2.0), (xs[2], 2.0), connectionstyle="arc3,rad=0.35", color="#B05A00")
    ax.text((xs[2] + xs[5]) / 2, 3.05, "LLMEngine.step(), repeated: one model call per step",
            ha="center", fontsize=8.5, color="#B05A00")
    ax.set_title("One path through minillm", fontsize=10)
    return finish(fig)
