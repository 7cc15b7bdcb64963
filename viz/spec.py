"""Speculative decoding, drawn: the generated text with each step's outcome coloured (accepted draft
tokens, rejected ones struck through where they were rejected, the target's own token), acceptance
rate and speedup against gamma and against batch size (the Medusa token tree is in viz.medusa_tree).

Notation: p = the target's distribution, q = the draft's, gamma = tokens drafted per step,
alpha = E[sum_x min(p, q)], the chance that one examined draft is accepted. spec_counts and the HTML report
the acceptance rate, accepted / drafted, which is lower: drafts after a step's first rejection are
discarded without being examined (with independent slots, accepted / drafted =
alpha (1 - alpha^gamma) / ((1 - alpha) gamma)). Each function draws plain data (lists of per-step
event dicts, rows of measured numbers, the tree's parents and mask, byte counts); nothing here runs a model.
"""
from __future__ import annotations

import codecs
import html

import matplotlib.pyplot as plt
import numpy as np

from ._figure import finish, human_bytes, new_figure
from .medusa_tree import ACCEPTED_COLOR, ancestor_mask, draw_medusa_tree  # noqa: F401  (viz.spec keeps its names)

SERIES_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD"]
REJECTED_COLOR = "#C44E52"      # a draft token the target rejected
TARGET_COLOR = "#4C72B0"        # the target's own token: the correction after a rejection, or the bonus
NO_GAIN_COLOR = "#888888"

# Inline styles (a notebook's HTML output carries no stylesheet); fixed strings, so the HTML is deterministic.
STYLE = {
    "accepted": "background-color:#c8e6c9;color:#1b5e20",
    "rejected": "background-color:#ffcdd2;color:#b71c1c;text-decoration:line-through",
    "target": "background-color:#dbe7f6;color:#0d47a1;font-weight:bold",
    "prompt": "color:#666666",
}
LEGEND = {"accepted": "accepted draft token", "rejected": "rejected draft token",
          "target": "target's token (correction or bonus)"}


# ---------------------------------------------------------------------------------------- the text
def _check_event(i: int, ev: dict) -> tuple[list[int], int, list[int]]:
    drafted, accepted, emitted = list(ev["drafted"]), int(ev["accepted"]), list(ev["emitted"])
    if not 0 <= accepted <= len(drafted):
        raise ValueError(f"event {i}: accepted = {accepted} must be between 0 and len(drafted) = {len(drafted)}")
    if len(emitted) > accepted + 1:
        raise ValueError(f"event {i}: {len(emitted)} tokens emitted, at most accepted + 1 = {accepted + 1}")
    k = min(accepted, len(emitted))
    if emitted[:k] != drafted[:k]:
        raise ValueError(f"event {i}: emitted {emitted[:k]} should start with the accepted drafts {drafted[:k]}")
    return drafted, accepted, emitted


def spec_counts(events) -> dict:
    """Totals over one sequence's steps: drafted, accepted and emitted tokens, the number of steps,
    the acceptance rate accepted / drafted (nan when nothing was drafted; not alpha: drafts after a
    rejection count as drafted but are never examined) and tokens emitted per step (per target forward)."""
    drafted = accepted = emitted = 0
    for i, ev in enumerate(events):
        d, a, e = _check_event(i, ev)
        drafted, accepted, emitted = drafted + len(d), accepted + a, emitted + len(e)
    steps = len(events)
    return {"steps": steps, "drafted": drafted, "accepted": accepted, "emitted": emitted,
            "acceptance_rate": accepted / drafted if drafted else float("nan"),
            "tokens_per_step": emitted / steps if steps else float("nan")}


class _Text:
    """Token text through `tokenizer.decode_bytes([t], prev_token=prev)` when it has one (run.c's
    rules: a leading space is dropped after BOS; <0xXX> pieces are raw bytes), else
    `tokenizer.decode([t])`. Bytes go through an incremental UTF-8 decoder, so a character split
    across byte tokens comes out whole (on the token that completes it)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.has_bytes = hasattr(tokenizer, "decode_bytes")

    def stream(self):
        return codecs.getincrementaldecoder("utf-8")(errors="replace")

    def piece(self, tok: int, prev, decoder) -> str:
        """The token's text; a token with none to show (BOS/EOS, a control byte) as \u27e8id\u27e9 so it is
        not invisible, except a byte that starts a character the next token finishes."""
        if not self.has_bytes:
            s = self.tokenizer.decode([tok])
        else:
            s = decoder.decode(self.tokenizer.decode_bytes([tok], prev_token=prev))
            if not s and decoder.getstate()[0]:
                return ""
        return _visible(s) or f"\u27e8{tok}\u27e9"

    def whole(self, ids: list[int]) -> str:
        if not self.has_bytes:
            return _visible(self.tokenizer.decode(ids))
        return _visible(self.tokenizer.decode_bytes(ids).decode("utf-8", errors="replace"))


def _visible(s: str) -> str:
    """Drop control characters other than tab and newline (HTML has no place for them)."""
    return "".join(c for c in s if c.isprintable() or c in "\t\n")


def _span(kind: str, text: str, title: str) -> str:
    # a newline in the output is a line break; in a rejected draft (not in the output) it is shown as a mark
    body = html.escape(text).replace("\r\n", "\n").replace("\n", "\u21b5" if kind == "rejected" else "<br>")
    return f'<span style="{STYLE[kind]}" title="{html.escape(title)}">{body}</span>'


def spec_text_html(events, tokenizer, prompt_ids=None) -> str:
    """One sequence's generated text as HTML (show it with IPython.display.HTML), coloured by what
    speculative decoding did with each token: accepted draft tokens on green, the drafts the target
    rejected in red and struck through, inline where they were rejected, and the target's own token
    (the corrected token after a rejection, or the bonus token when every draft was accepted) blue
    and bold. A legend with the totals sits above the text.

    events: in step order, {"drafted": [ids], "accepted": n, "emitted": [ids]} where emitted =
    drafted[:n] + [the target's token] (shorter if the sequence stopped). prompt_ids, when given,
    are shown first in grey and set the previous token for the first generated one. Every span's
    title (hover text) says its step and token id; the output holds no ids or addresses of objects,
    so the same events give the same string."""
    text = _Text(tokenizer)
    counts = spec_counts(events)
    parts = []
    prev = None
    decoder = text.stream()
    if prompt_ids:
        prompt_ids = [int(t) for t in prompt_ids]
        parts.append(_span("prompt", text.whole(prompt_ids), f"prompt: {len(prompt_ids)} tokens"))
        prev = prompt_ids[-1]
    for step, ev in enumerate(events):
        drafted, accepted, emitted = _check_event(step, ev)
        drafted, emitted = [int(t) for t in drafted], [int(t) for t in emitted]
        for t in emitted[:accepted]:
            parts.append(_span("accepted", text.piece(t, prev, decoder), f"step {step}: draft token {t}, accepted"))
            prev = t
        rejected_prev, rejected_decoder = prev, text.stream()     # off the output: its own decoder
        for t in drafted[accepted:]:
            parts.append(_span("rejected", text.piece(t, rejected_prev, rejected_decoder),
                               f"step {step}: draft token {t}, rejected"))
            rejected_prev = t
        if len(emitted) > accepted:
            t = emitted[accepted]
            why = ("bonus (every draft accepted)" if accepted == len(drafted)
                   else "correction (resampled from the target)")
            parts.append(_span("target", text.piece(t, prev, decoder), f"step {step}: target token {t}, {why}"))
            prev = t
    if text.has_bytes:
        tail = decoder.decode(b"", final=True)                      # a character left unfinished at the end
        if tail:
            parts.append(html.escape(tail))
    rate = counts["acceptance_rate"]
    legend = " ".join(_span(k, v, v) for k, v in LEGEND.items())
    summary = (f'{counts["steps"]} steps: {counts["accepted"]} of {counts["drafted"]} drafts accepted '
               f'(acceptance rate, accepted / drafted = {rate:.2f}), {counts["emitted"]} tokens emitted '
               f'({counts["tokens_per_step"]:.2f} per target step)' if counts["steps"] else "no steps")
    return ('<div class="minillm-spec" style="font-family:monospace;line-height:1.6">'
            f'<div style="font-size:85%;margin-bottom:0.4em">{legend}<br>{html.escape(summary)}</div>'
            f'<div style="white-space:pre-wrap">{"".join(parts)}</div></div>')


# ---------------------------------------------------------------------------- alpha and speedup
def _proposer_colors(names) -> dict:
    out = {}
    for n in names:
        if n not in out:
            out[n] = SERIES_COLORS[len(out) % len(SERIES_COLORS)]
    return out


def _no_gain(ax):
    ax.axhline(1.0, color=NO_GAIN_COLOR, ls=":", lw=1.2, label="1x = no gain over plain decoding")


def plot_spec_vs_gamma(rows):
    """Two panels against gamma (tokens drafted per step), one colour per proposer. Left: the measured
    acceptance probability alpha. Right: speedup over plain decoding, the model's prediction dashed and the
    measurement solid, with the line at 1 (no gain). rows: [{"proposer", "gamma", "alpha",
    "predicted", "measured"}, ...] (a missing or None value is left out)."""
    if not rows:
        raise ValueError("no rows to plot")
    colors = _proposer_colors(r["proposer"] for r in rows)
    fig, axes = new_figure(ncols=2, width=13.5, height=4.2)
    ax_a, ax_s = axes[0]

    def series(name, key):
        pts = sorted((int(r["gamma"]), float(r[key])) for r in rows
                     if r["proposer"] == name and r.get(key) is not None)
        return [g for g, _ in pts], [v for _, v in pts]

    gammas = sorted({int(r["gamma"]) for r in rows})
    for name, color in colors.items():
        ax_a.plot(*series(name, "alpha"), "-o", color=color, label=name)
        ax_s.plot(*series(name, "predicted"), "--", marker="o", mfc="none", color=color, label=f"{name}: predicted")
        ax_s.plot(*series(name, "measured"), "-", marker="o", color=color, label=f"{name}: measured")
    _no_gain(ax_s)
    ax_a.set(xlabel="gamma (drafted tokens per step)", ylabel="alpha (acceptance probability)", ylim=(0, 1.05),
             title="alpha: the chance an examined draft is accepted")
    ax_s.set(xlabel="gamma (drafted tokens per step)", ylabel="speedup over plain decoding",
             title="speedup: predicted (dashed) and measured (solid)")
    for ax in (ax_a, ax_s):
        ax.set_xticks(gammas)
        ax.grid(alpha=0.3)
    ax_a.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))   # beside the data, not on it
    ax_s.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return finish(fig)


def plot_spec_vs_batch(points: dict):
    """Speedup of speculative decoding over plain decoding against batch size (log2 x), one line per
    proposer, with the line at 1: drafting pays while decode is memory-bound and stops paying as the
    batch fills the target's compute. points: {proposer: [(batch_size, speedup), ...]}."""
    if not points:
        raise ValueError("no points to plot")
    fig, axes = new_figure(width=6.8, height=4.0)
    ax = axes[0][0]
    batches = set()
    for i, (name, pts) in enumerate(points.items()):
        pts = sorted((int(b), float(s)) for b, s in pts)
        batches.update(b for b, _ in pts)
        ax.plot([b for b, _ in pts], [s for _, s in pts], "-o", color=SERIES_COLORS[i % len(SERIES_COLORS)], label=name)
    _no_gain(ax)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(batches))
    ax.set_xticklabels([str(b) for b in sorted(batches)])
    ax.set(xlabel="batch size (sequences decoding together)", ylabel="speedup over plain decoding",
           title="speculative decoding against batch size")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    return finish(fig)


def plot_acceptance_bars(alpha_by_method: dict):
    """Acceptance probability alpha per method (draft model, n-gram, Medusa heads, ...), one labelled bar each."""
    if not alpha_by_method:
        raise ValueError("nothing to plot")
    names = list(alpha_by_method)
    values = [float(alpha_by_method[n]) for n in names]
    fig, axes = new_figure(width=max(4.5, 1.2 * len(names) + 2), height=3.6)
    ax = axes[0][0]
    bars = ax.bar(range(len(names)), values, color=[SERIES_COLORS[i % len(SERIES_COLORS)] for i in range(len(names))])
    for b, v in zip(bars, values):
        ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=9)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set(ylim=(0, 1.1), ylabel="alpha (acceptance probability)", title="alpha per proposer")
    ax.grid(alpha=0.3, axis="y")
    return finish(fig)


def plot_spec_memory(parts: dict, title: str = ""):
    """What speculation adds to memory, beside what the target already holds: one horizontal bar per
    entry of `parts` ({name: bytes}, e.g. minillm.bench.spec_memory.spec_memory()'s "parts"), log x,
    each labelled with its size. A name starting with "target" is drawn grey (the baseline), the rest
    (the additions) in colour."""
    if not parts:
        raise ValueError("nothing to plot")
    names = list(parts)
    values = [float(parts[n]) for n in names]
    if any(v <= 0 for v in values):
        raise ValueError(f"every part needs a positive byte count (log axis), got {parts}")
    fig, axes = new_figure(width=8.6, height=0.42 * len(names) + 1.4)
    ax = axes[0][0]
    colors = ["#BBBBBB" if n.startswith("target") else SERIES_COLORS[i % len(SERIES_COLORS)]
              for i, n in enumerate(names)]
    y = np.arange(len(names))[::-1]
    ax.barh(y, values, color=colors)
    for yi, v in zip(y, values):
        ax.annotate(human_bytes(v), (v, yi), textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(min(values) / 2, max(values) * 8)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=8)
    ax.set(xlabel="bytes (log)", title=title or "memory: what speculation adds (colour) beside the target (grey)")
    ax.grid(alpha=0.3, axis="x")
    return finish(fig)


# ------------------------------------------------------------------------------- the Medusa tree
def plot_pass_cost(cost: dict, title: str = ""):
    """cost: {n new tokens scored in one forward: seconds}. Time relative to n = 1, against n (ideal: flat)."""
    ns = sorted(cost)
    base = cost[ns[0]]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.plot(ns, [cost[n] / base for n in ns], "o-", label="one forward over n tokens")
    ax.plot(ns, [n / ns[0] for n in ns], ":", color="gray", label="n separate one-token forwards")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("tokens scored in one target forward (gamma + 1)")
    ax.set_ylabel("time / one-token forward")
    ax.set_title(title or "scoring several tokens costs little more than one")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def plot_exactness(p, counts, labels=None):
    """p (V,) the target distribution; counts (V,) how often verification emitted each token. Bars side by side."""
    p = np.asarray(p, dtype=float)
    counts = np.array([float(c) for c in counts])
    freq = counts / max(counts.sum(), 1.0)
    x = np.arange(len(p))
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(x - 0.2, p, 0.4, label="p (target)")
    ax.bar(x + 0.2, freq, 0.4, label="emitted by speculative sampling")
    ax.set_xticks(x, labels if labels is not None else [str(i) for i in x])
    ax.set_ylabel("probability")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig
