"""The Llama transformer as a diagram, with the tensor shape after every op for a given ModelConfig."""
from __future__ import annotations

from ._figure import finish, new_figure
from .diagram import arrow, blank, box


def llama_steps(cfg, T: int = 5):
    """(op, output shape) from tokens to logits for one sequence of T tokens (B = 1). Plain data, so
    a notebook can print it and the diagram draw it."""
    C, H, Hkv, D, V, F = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size, cfg.hidden_dim
    return [
        ("tokens", f"(1, {T})"),
        ("tok_embeddings", f"x (1, {T}, {C})"),
        ("RMSNorm", f"(1, {T}, {C})"),
        ("wq, wk, wv", f"q (1, {T}, {H}, {D})  k, v (1, {T}, {Hkv}, {D})"),
        ("RoPE on q, k", "same shapes, pairs rotated"),
        (f"causal attention (GQA: {H // Hkv} q heads per kv head)", f"(1, {T}, {H}, {D})"),
        ("wo, + residual", f"x (1, {T}, {C})"),
        ("RMSNorm", f"(1, {T}, {C})"),
        ("SwiGLU: w2(silu(w1 x) * w3 x), + residual", f"hidden (1, {T}, {F}) -> x (1, {T}, {C})"),
        ("final RMSNorm, output", f"logits (1, {T}, {V})"),
    ]


def draw_llama_block(cfg, T: int = 5):
    """Tokens to logits; the layer repeated n_layers times is framed. Shapes for cfg at T tokens."""
    steps = llama_steps(cfg, T)
    fig, axes = new_figure(width=8.5, height=6.2)
    ax = axes[0, 0]
    n = len(steps)
    ys = [n - i for i in range(n)]
    blank(ax, (0, 10), (0.2, n + 0.8))
    in_layer = range(2, 9)
    for i, ((op, shape), y) in enumerate(zip(steps, ys)):
        color = "#F6D7B0" if i in in_layer else "#DCE6F2"
        box(ax, 3.1, y, 5.2, 0.62, op, color=color, fontsize=8.5)
        ax.text(5.9, y, shape, va="center", fontsize=8, family="monospace", color="#333333")
        if i:
            arrow(ax, (3.1, ys[i - 1] - 0.31), (3.1, y + 0.31))
    top, bottom = ys[in_layer[0]] + 0.45, ys[in_layer[-1]] - 0.45
    ax.plot([0.25, 0.25, 0.35], [bottom, top, top], color="#B05A00", lw=1.2)
    ax.plot([0.25, 0.35], [bottom, bottom], color="#B05A00", lw=1.2)
    ax.text(0.15, (top + bottom) / 2, f"x {cfg.n_layers} layers", rotation=90, va="center", ha="right",
            color="#B05A00", fontsize=9)
    ax.set_title(f"Llama forward pass: C={cfg.dim}, H={cfg.n_heads}, Hkv={cfg.n_kv_heads}, D={cfg.head_dim}, "
                 f"V={cfg.vocab_size}", fontsize=10)
    return finish(fig)
