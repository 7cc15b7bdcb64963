"""The KV cache, drawn: what is recomputed without one, how bytes add up, and the pool's slots."""
from __future__ import annotations

import matplotlib.colors as mcolors
from matplotlib.patches import Patch, Rectangle

from ._figure import COLORS, finish, human_bytes, mib, new_figure


def draw_recompute_grid(n: int = 6):
    """Rows are decode steps, columns positions. Without a cache, every step computes K/V for the
    whole prefix again; with one, each step computes one new column and reads the rest back."""
    fig, axes = new_figure(ncols=2, width=9, height=3.6)
    computed, cached, none = COLORS["no cache"], "#B8DDB8", "white"
    for ax, with_cache in zip(axes[0], (False, True)):
        for step in range(n):
            for pos in range(n):
                if pos > step:
                    color = none
                elif with_cache and pos < step:
                    color = cached
                else:
                    color = computed if not with_cache else COLORS["kv cache"]
                ax.add_patch(_cell(pos, n - 1 - step, color))
        work = n if with_cache else n * (n + 1) // 2
        ax.set(xlim=(0, n), ylim=(0, n), xticks=[i + 0.5 for i in range(n)], yticks=[i + 0.5 for i in range(n)],
               xlabel="position", ylabel="step")
        ax.set_xticklabels(range(n))
        ax.set_yticklabels(reversed(range(1, n + 1)))
        ax.set_aspect("equal")
        ax.set_title(f"{'with' if with_cache else 'without'} a KV cache: {work} token computations", fontsize=9.5)
    handles = [Patch(facecolor=c, edgecolor="#666666", label=label) for c, label in
               [(computed, "computed (no cache)"), (COLORS["kv cache"], "computed, then cached"),
                (cached, "read from the cache")]]
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False, fontsize=8.5)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _cell(x, y, color):
    return Rectangle((x, y), 1, 1, facecolor=color, edgecolor="#666666", lw=0.6)


def plot_kv_bytes(rows, title: str = "KV-cache bytes: formula vs measured"):
    """Grouped bars per row (profiling.KVBytes): the formula 2 x L x Hkv x D x bytes x tokens and
    what the allocated pool measures (KVCache.nbytes), in MiB, each labelled."""
    fig, axes = new_figure(width=max(5.0, 1.6 * len(rows) + 2), height=3.6)
    ax = axes[0, 0]
    x = range(len(rows))
    f = ax.bar([i - 0.2 for i in x], [mib(r.formula) for r in rows], 0.4, color=COLORS["formula"], label="formula")
    m = ax.bar([i + 0.2 for i in x], [mib(r.measured) for r in rows], 0.4, color=COLORS["measured"],
               label="measured (KVCache.nbytes)")
    for bars, vals in ((f, [r.formula for r in rows]), (m, [r.measured for r in rows])):
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), human_bytes(v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{r.label}\n{r.n_tokens} tokens" for r in rows], fontsize=8)
    ax.set(ylabel="MiB", title=title)
    ax.set_ylim(0, 1.35 * max(mib(max(r.formula, r.measured)) for r in rows))
    ax.legend(frameon=False, fontsize=8, loc="upper center", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    return finish(fig)


def plot_kv_bytes_vs_length(lengths, series: dict):
    """series: label -> measured bytes at each length. One line per model shape."""
    fig, axes = new_figure(width=6.4, height=3.6)
    ax = axes[0, 0]
    for label, values in series.items():
        ax.plot(list(lengths), [mib(v) for v in values], marker="o", ms=3, label=label)
    ax.set(xlabel="tokens in the cache", ylabel="MiB (measured)", title="KV cache grows linearly with the context")
    ax.legend(frameon=False, fontsize=8)
    ax.grid(alpha=0.3)
    return finish(fig)


def draw_kv_pool(block_tables: dict, lengths: dict, num_blocks: int, block_size: int, title: str = ""):
    """The pool as num_blocks rows of block_size slots. block_tables: name -> list of blocks;
    lengths: name -> tokens written. Each slot shows its number (block * block_size + offset); filled
    slots are dark, slots reserved but empty are pale (the waste), free blocks are grey."""
    fig, axes = new_figure(width=min(12.0, max(6.0, 1.2 + 0.55 * block_size)),
                           height=1.3 + 0.5 * num_blocks + 0.2 * len(block_tables))
    ax = axes[0, 0]
    owner = {}
    for k, (name, table) in enumerate(block_tables.items()):
        for i, blk in enumerate(table):
            owner[blk] = (k, name, i)
    for blk in range(num_blocks):
        for off in range(block_size):
            slot = blk * block_size + off
            color, text_color = COLORS["free"], "#999999"
            if blk in owner:
                k, name, i = owner[blk]
                base = mcolors.to_rgb(f"C{k}")
                filled = i * block_size + off < lengths[name]
                color = base if filled else tuple(0.75 + 0.25 * c for c in base)
                text_color = "white" if filled else "#555555"
            ax.add_patch(_cell(off, num_blocks - 1 - blk, color))
            ax.text(off + 0.5, num_blocks - 0.5 - blk, str(slot), ha="center", va="center", fontsize=7,
                    color=text_color)
    handles = [Patch(color=f"C{k}", label=f"{name}: blocks {table}, {lengths[name]} tokens")
               for k, (name, table) in enumerate(block_tables.items())]
    ax.set(xlim=(0, block_size), ylim=(0, num_blocks),
           title=title or f"KV pool: {num_blocks} blocks x {block_size} slots (numbers are slots)")
    ax.set_yticks([num_blocks - 0.5 - b for b in range(num_blocks)])
    ax.set_yticklabels([f"block {b}" for b in range(num_blocks)], fontsize=8)
    ax.set_xticks([])
    ax.set_aspect("equal" if block_size <= 16 else "auto")
    ax.legend(handles=handles, frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=1)
    return finish(fig)
