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


# The engine's parts as a map, each tagged with the notebooks that build it: (label, x, y, w, h, notebooks).
# Top row: the path a request takes; below each stage, the parts the stage is made of.
MAP = [
    ("prompt text", 0.9, 3.2, 1.4, 0.6, ("00",)),
    ("tokenizer\n(BPE)", 2.6, 3.2, 1.4, 0.6, ("00", "01")),
    ("scheduler\nwho runs this step", 4.6, 3.2, 1.9, 0.6, ("00", "05", "11", "16")),
    ("model forward\nlogits", 7.0, 3.2, 2.2, 0.6, ("00", "01")),
    ("sampler / verify\nnext tokens", 9.5, 3.2, 2.0, 0.6, ("00", "08", "10")),
    ("RequestOutput", 11.6, 3.2, 1.5, 0.6, ("00",)),
    ("batching policies\nchunked prefill", 4.6, 2.2, 1.9, 0.6, ("05", "16")),
    ("block manager\npaging, prefix cache", 4.6, 1.3, 1.9, 0.6, ("06", "11", "14", "16")),
    ("Llama layers\nRMSNorm, RoPE, GQA", 7.0, 2.2, 2.2, 0.6, ("01", "15")),
    ("KV cache\n(paged pool)", 6.35, 1.3, 0.95, 0.6, ("02", "06", "14", "16")),
    ("weights\nint8 / int4", 7.65, 1.3, 0.95, 0.6, ("07", "13", "15", "16")),
    ("kernels: numba CUDA\nmatmul, flash attention", 7.0, 0.4, 2.2, 0.6, ("03", "04")),
    ("proposer\ndraft, n-gram, Medusa", 9.5, 2.2, 2.0, 0.6, ("08", "16")),
    ("router -> replicas\nprefill | decode engines", 1.75, 2.2, 2.5, 0.6, ("12",)),
    ("ranks (torch.distributed)\ntensor / pipeline parallel", 9.5, 1.3, 2.0, 0.6, ("12",)),
    ("training (offline)\ntrain, distil -> .bin", 11.6, 1.3, 1.5, 0.9, ("09", "15")),
]


def draw_engine_map(notebook: str = "00"):
    """minillm's parts on one page, with the parts this notebook builds highlighted (the rest greyed)."""
    fig, axes = new_figure(width=10, height=3.6)
    ax = axes[0, 0]
    blank(ax, (0, 12.5), (0.0, 4.2))
    for label, x, y, w, h, nbs in MAP:
        here = notebook in nbs
        box(ax, x, y, w, h, label, color="#F6C28B" if here else "#F2F2F2", fontsize=7.5,
            edge="#B05A00" if here else "#BBBBBB", textcolor="#222222" if here else "#888888")
        ax.text(x + w / 2 - 0.05, y + h / 2 - 0.02, " ".join(nbs), ha="right", va="top", fontsize=6,
                color="#B05A00" if here else "#AAAAAA")
    tops = [m for m in MAP if m[2] == 3.2]
    for a, b in zip(tops, tops[1:]):
        arrow(ax, (a[1] + a[3] / 2, 3.2), (b[1] - b[3] / 2, 3.2), color="#666666")
    arrow(ax, (9.5, 3.52), (4.6, 3.52), connectionstyle="arc3,rad=0.12", color="#B05A00")
    ax.text(7.0, 3.95, "LLMEngine.step(), repeated", ha="center", va="bottom", fontsize=7.5, color="#B05A00")
    ax.set_title(f"Notebook {notebook} builds the highlighted parts (numbers: the notebooks that build each part)",
                 fontsize=9)
    return finish(fig)
