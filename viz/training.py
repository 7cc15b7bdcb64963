"""Training curves (from the JSONL logs minillm.training.train writes) and draft acceptance vs gamma."""
from __future__ import annotations

from ._figure import finish, new_figure


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


def plot_expected_tokens(alphas: dict, gammas=range(1, 9)):
    """alphas: {label: alpha}. Expected tokens per target step E = (1 - a^(g+1)) / (1 - a) vs gamma."""
    fig, axes = new_figure(width=6.4, height=3.8)
    ax = axes[0][0]
    for label, a in alphas.items():
        ax.plot(list(gammas), [(1 - a ** (g + 1)) / (1 - a) if a < 1 else g + 1 for g in gammas], "-o", ms=3,
                label=f"{label} (alpha = {a:.2f})")
    ax.plot(list(gammas), [g + 1 for g in gammas], ":", color="gray", label="every draft accepted")
    ax.set(xlabel="gamma (drafted tokens per step)", ylabel="expected tokens per target step",
           title="What a draft's acceptance rate buys")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    return finish(fig)
