"""Training curves (from the JSONL logs minillm.training.train writes), the memory a training step holds against
inference's, and draft acceptance vs gamma."""
from __future__ import annotations

from ._figure import COLORS, finish, mib, new_figure

# One colour per kind of bytes (minillm.training.memory's parts).
PART_COLORS = {"weights": COLORS["prefill"], "gradients": COLORS["decode"], "Adam m": COLORS["formula"],
               "Adam v": "#B9A9DD", "KV cache": COLORS["kv cache"]}


def plot_training_curves(logs: dict, baseline: float | None = None):
    """logs: {label: [rows of log.jsonl]}, each row with tokens, train_loss, val_loss, lr (and, for a run
    in phases, phase and eval_seq_len: a dashed line marks where a phase starts). Left: train and val loss
    against tokens seen; right: the learning-rate schedule."""
    fig, axes = new_figure(ncols=2, width=11, height=3.8)
    ax, ax2 = axes[0]
    for i, (label, rows) in enumerate(logs.items()):
        tokens = [r["tokens"] / 1e6 for r in rows]
        color = f"C{i}"
        ax.plot(tokens, [r["val_loss"] for r in rows], "-o", ms=3, color=color, label=f"{label}: val")
        ax.plot(tokens, [r["train_loss"] for r in rows], ":", color=color, label=f"{label}: train (one batch)")
        ax2.plot(tokens, [r["lr"] for r in rows], "-", color=color, label=label)
        for prev, r in zip(rows, rows[1:]):  # a run in phases (e.g. 256- then 1024-token windows)
            if r.get("phase") != prev.get("phase"):
                for a in (ax, ax2):
                    a.axvline(prev["tokens"] / 1e6, color=color, ls="--", lw=0.8, alpha=0.6)
                ax.annotate(f" windows of {r.get('eval_seq_len', '?')}", (prev["tokens"] / 1e6, r["val_loss"]),
                            fontsize=7, color=color, va="bottom")
    if baseline is not None:
        ax.axhline(baseline, color="gray", ls="--", lw=1, label="unigram baseline")
    ax.set(xlabel="tokens seen (millions)", ylabel="loss (nats/token)", title="Loss (measured during training)")
    ax2.set(xlabel="tokens seen (millions)", ylabel="learning rate", title="Schedule: warm-up, then cosine")
    for a in (ax, ax2):
        a.grid(alpha=0.3)
        a.legend(frameon=False, fontsize=8)
    return finish(fig)


def plot_memory_budget(bars: dict, n_params: int | None = None,
                       title: str = "Memory: a training step against inference"):
    """bars: {label: {part: bytes}}, each drawn as one stacked bar in MiB (parts such as "weights", "gradients",
    "Adam m", "Adam v", "KV cache", one colour each, in every bar). With n_params, a right axis reads the same
    heights in bytes per parameter."""
    fig, axes = new_figure(width=8.8, height=4.2)
    ax = axes[0, 0]
    labels = list(bars)
    seen = set()
    for x, label in enumerate(labels):
        bottom = 0.0
        for part, nbytes in bars[label].items():
            color = PART_COLORS.get(part, f"C{len(seen) % 10}")
            ax.bar(x, mib(nbytes), bottom=bottom, width=0.62, color=color, edgecolor="white",
                   label=part if part not in seen else None)
            seen.add(part)
            bottom += mib(nbytes)
        ax.text(x, bottom, f"{bottom:.0f} MiB" if bottom >= 10 else f"{bottom:.1f} MiB", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(0, max(sum(mib(v) for v in parts.values()) for parts in bars.values()) * 1.15)
    ax.set(ylabel="MiB", title=title)
    if n_params:
        right = ax.secondary_yaxis("right", functions=(lambda m: m * 2**20 / n_params,
                                                       lambda b: b * n_params / 2**20))
        right.set_ylabel("bytes per parameter")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.12, 1.0))
    return finish(fig)


def plot_expected_tokens(alphas: dict, gammas=range(1, 9)):
    """alphas: {label: alpha}. Left: expected tokens per target step E = (1 - a^(g+1)) / (1 - a) against gamma,
    on a y axis fitted to the curves (the ceiling gamma + 1, every draft accepted, is drawn but mostly above it:
    on a shared scale it squashes the curves together). Right: E as a share of that ceiling."""
    fig, axes = new_figure(ncols=2, width=11, height=3.8)
    ax, share = axes[0]
    gammas = list(gammas)
    styles = ["-o", "-s", "--o", "--s", ":o", ":s"]
    top = 1.0
    for i, (label, a) in enumerate(alphas.items()):
        e = [(1 - a ** (g + 1)) / (1 - a) if a < 1 else g + 1 for g in gammas]
        top = max(top, max(e))
        style = styles[i % len(styles)]
        ax.plot(gammas, e, style, ms=4, color=f"C{i}", label=f"{label} (alpha = {a:.2f})")
        share.plot(gammas, [v / (g + 1) for v, g in zip(e, gammas)], style, ms=4, color=f"C{i}")
    ax.plot(gammas, [g + 1 for g in gammas], ":", color="gray", label="every draft accepted: gamma + 1")
    ax.set_ylim(1.0, 1.0 + (top - 1.0) * 1.35)
    ax.set(xlabel="gamma (drafted tokens per step)", ylabel="expected tokens per target step",
           title="What a draft's acceptance rate buys")
    share.set_ylim(0, 1.05)
    share.set(xlabel="gamma (drafted tokens per step)", ylabel="E / (gamma + 1)",
              title="Share of the most a step could yield")
    for a in (ax, share):
        a.set_xticks(gammas)
        a.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    return finish(fig)
