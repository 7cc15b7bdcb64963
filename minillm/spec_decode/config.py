"""Speculative decoding: its configuration (EngineConfig.speculative), the proposer it builds, and the speedup
model. The engine's step is the same with or without it: a proposer drafts k tokens per decode row
(minillm.core.proposer), the runner scores them in the same forward, and minillm.core.verify keeps what the exact
acceptance rule keeps (the rule and its proof sketch are there; verify_sampled and friends are re-exported here).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..core.proposer import Proposer
from ..core.verify import residual, verify_greedy, verify_sampled
from .acceptance import expected_tokens

METHODS = ("draft", "ngram", "medusa")
__all__ = ["METHODS", "SpeculativeConfig", "make_proposer", "verify_greedy", "verify_sampled", "residual",
           "expected_tokens", "predicted_speedup"]


@dataclass
class SpeculativeConfig:
    """EngineConfig.speculative as a dict: {"method": ..., "gamma": 4, ...} (DESIGN.md's names)."""
    method: str
    gamma: int = 4
    model: Optional[str] = None       # draft: a model name or .bin path (default: the shipped draft)
    draft_backend: str = "auto"       # draft: "numba" runs the draft as one compiled call per step (cheaper c);
                                      # "auto": numba for a float32 draft, else torch
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
        if cfg.draft_backend not in ("auto", "torch", "numba"):
            raise ValueError(f"speculative draft_backend must be 'auto', 'torch' or 'numba', got {cfg.draft_backend!r}")
        if not (isinstance(cfg.ngram_min, int) and isinstance(cfg.ngram_max, int)
                and 1 <= cfg.ngram_min <= cfg.ngram_max):
            raise ValueError(f"speculative ngram sizes need 1 <= ngram_min <= ngram_max, got "
                             f"ngram_min={cfg.ngram_min!r}, ngram_max={cfg.ngram_max!r}")
        return cfg


def predicted_speedup(alpha: float, gamma: int, c: float, r: float) -> float:
    """E(alpha, gamma) / (gamma c + r): tokens per step over the step's cost in target decode steps, where
    c = one draft step / one target step and r = a target pass over gamma + 1 tokens / over 1 token."""
    return expected_tokens(alpha, gamma) / (gamma * c + r)


def make_proposer(spec: "SpeculativeConfig", target, tokenizer, config, draft=None, heads=None) -> Proposer:
    """The proposer a speculative config asks for, from parts prepared by minillm.engine.parts (the loaded draft
    model's forward, or the Medusa heads): the engine never opens a file."""
    if spec.method == "ngram":
        from .ngram import NgramProposer
        return NgramProposer(spec.gamma, config.max_model_len, spec.ngram_max, spec.ngram_min)
    if spec.method == "draft":
        from .draft_model import DraftProposer
        forward, draft_config, blocks, kv_dtype = draft
        return DraftProposer(forward, draft_config, spec.gamma, config.max_model_len, blocks, config.block_size,
                             kv_dtype)
    from .medusa import MedusaProposer
    from .medusa_tree import DEFAULT_CHOICES
    return MedusaProposer(heads, target.output.weight, spec.tree or DEFAULT_CHOICES, spec.gamma, config.max_model_len)
