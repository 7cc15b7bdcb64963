"""Speculative decoding: the configuration and the exact verification rule.

Notation, fixed once (DESIGN.md rule 10): p is the TARGET's next-token distribution, q the DRAFT's
(the proposer's), both taken after the request's temperature / top-k / top-p (sampling.probs_from_logits).
gamma tokens x_1..x_gamma are drafted; one target forward scores all gamma + 1 positions, giving
p_1..p_{gamma+1} (p_i is the target's distribution for the slot x_i was drafted into).

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023), for i = 1..gamma in order:
    accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
    on the first rejection emit one token from norm(max(0, p_i - q_i)) (or from p_i if that residual
    sums to 0) and stop;
    if all gamma are accepted, emit a bonus token from p_{gamma+1}.
Every emitted token is distributed exactly as the target alone would have sampled it: for one slot,
P(emit y) = min(p(y), q(y)) + (1 - sum_x min(p, q)) * max(0, p(y) - q(y)) / sum_x max(0, p - q) = p(y).
A proposer without a distribution (n-gram lookup) is the one-hot q = [x_i]: accept with p_i(x_i), and
the residual is p_i with x_i removed. Greedy requests (temperature 0) accept while x_i == argmax p_i.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .acceptance import expected_tokens

METHODS = ("draft", "ngram", "medusa")
__all__ = ["METHODS", "SpeculativeConfig", "verify_greedy", "verify_sampled", "residual", "expected_tokens",
           "predicted_speedup"]


@dataclass
class SpeculativeConfig:
    """EngineConfig.speculative as a dict: {"method": ..., "gamma": 4, ...} (DESIGN.md's names)."""
    method: str
    gamma: int = 4
    model: Optional[str] = None       # draft: a model name or .bin path (default: the shipped draft)
    draft_backend: str = "torch"      # draft: "numba" runs the draft as one compiled call per step (cheaper c)
    ngram_max: int = 3                # ngram: the longest suffix looked up in the context
    ngram_min: int = 1                # ngram: the shortest
    heads: Optional[str] = None       # medusa: the heads file (default: the shipped heads)
    tree: Optional[list] = field(default=None)  # medusa: the candidate tree as top-k rank paths

    @classmethod
    def from_dict(cls, d) -> "SpeculativeConfig":
        if isinstance(d, SpeculativeConfig):
            return d
        if not isinstance(d, dict) or "method" not in d:
            raise ValueError(f"speculative must be a dict with a 'method' ({', '.join(METHODS)}), got {d!r}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown speculative option(s) {sorted(unknown)}; known: {sorted(known)}")
        cfg = cls(**d)
        if cfg.method not in METHODS:
            raise ValueError(f"speculative method {cfg.method!r} is not one of {METHODS}")
        if not isinstance(cfg.gamma, int) or isinstance(cfg.gamma, bool) or cfg.gamma < 1:
            raise ValueError(f"speculative gamma must be an integer >= 1 (tokens drafted per step), got {cfg.gamma!r}")
        if cfg.draft_backend not in ("torch", "numba"):
            raise ValueError(f"speculative draft_backend must be 'torch' or 'numba', got {cfg.draft_backend!r}")
        if not (isinstance(cfg.ngram_min, int) and isinstance(cfg.ngram_max, int) and 1 <= cfg.ngram_min <= cfg.ngram_max):
            raise ValueError(f"speculative ngram sizes need 1 <= ngram_min <= ngram_max, got "
                             f"ngram_min={cfg.ngram_min!r}, ngram_max={cfg.ngram_max!r}")
        return cfg


def verify_greedy(target_next: list[int], draft: list[int]) -> int:
    """How many drafted tokens a greedy target accepts: the longest prefix with draft[i] == target_next[i]
    (target_next[i] = argmax p_{i+1}). The emitted tokens are draft[:n] + [target_next[n]]."""
    n = 0
    while n < len(draft) and draft[n] == target_next[n]:
        n += 1
    return n


def residual(p_i: torch.Tensor, q_i: Optional[torch.Tensor], x: int) -> torch.Tensor:
    """The distribution sampled after rejecting x: norm(max(0, p - q)), or p itself if that is all zero.
    q_i None is the one-hot q = [x]. p_i, q_i: (V,) -> (V,)."""
    if q_i is None:
        r = p_i.clone()
        r[x] = 0.0
    else:
        r = (p_i - q_i).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else p_i


def verify_sampled(p: torch.Tensor, q: Optional[torch.Tensor], draft: list[int], generator) -> tuple[int, int]:
    """Speculative sampling for one sequence. p (k + 1, V) target; q (k, V) draft, or None for a one-hot
    proposer; draft: the k drafted ids. One uniform draw per examined slot, then one draw for the emitted
    token, all from the sequence's own generator. -> (n accepted, the token emitted after them)."""
    for i, x in enumerate(draft):
        px = float(p[i, x])
        qx = 1.0 if q is None else float(q[i, x])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if qx <= 0.0 or u >= min(1.0, px / qx):        # rejected (a token q could not draw is never accepted)
            dist = residual(p[i], None if q is None else q[i], x)
            return i, int(torch.multinomial(dist, 1, generator=generator))
    return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=generator))


def predicted_speedup(alpha: float, gamma: int, c: float, r: float) -> float:
    """E(alpha, gamma) / (gamma c + r): tokens per step over the step's cost in target decode steps, where
    c = one draft step / one target step and r = a target pass over gamma + 1 tokens / over 1 token."""
    return expected_tokens(alpha, gamma) / (gamma * c + r)
