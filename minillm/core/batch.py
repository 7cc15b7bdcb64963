"""What one engine step runs: the scheduler's plan (ScheduledBatch of Rows), the proposer's drafts, and
what verification decided. Plain data passed from stage to stage of LLMEngine.step.

A row is one sequence's slice of the step: its own tokens at positions start .. end - 1 (a whole prompt,
a prompt chunk, or the one newest token of a decode), then, on a decode row, up to `lookahead` drafted
tokens in the slots after it. Plain decoding is the case lookahead = 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .sequence import Sequence


@dataclass
class Row:
    seq: Sequence
    start: int                  # first position computed this step (the sequence's num_computed)
    end: int                    # one past its last own token computed (< len(seq): a partial prompt chunk)
    lookahead: int = 0          # draft slots reserved at positions end .. end + lookahead - 1
    writes: bool = True         # False: a static batch's padding row (computes, writes and samples nothing)
    prefill: bool = False       # the row computes more than the newest token (a prompt, chunk or recompute)
    completes: bool = field(init=False)   # it reaches the newest token, so it samples the next one (set once:
                                          # the step reads it many times, all before the update appends)

    def __post_init__(self):
        self.completes = self.writes and self.end == len(self.seq)


@dataclass
class ScheduledBatch:
    kind: str                                     # "prefill", "decode" or "mixed"
    rows: list = field(default_factory=list)      # [Row] in order; a static batch's padding rows last
    forks: list = field(default_factory=list)     # (row index, child): n > 1 samples forked off a finished prefill
    copies: list = field(default_factory=list)    # (src, dst) block copies to make first (copy-on-write)
    swap_in: list = field(default_factory=list)   # (swap block, device block) pairs to bring back
    swap_out: list = field(default_factory=list)  # (device block, swap block) pairs to save
    moved: bool = False                           # the copies and swaps above have been carried out
    pruned: list = field(default_factory=list)    # beam search: seq ids of the beams pruned after verification

    def add(self, seq: Sequence, start: int, end: Optional[int] = None, lookahead: int = 0, writes: bool = True) -> Row:
        end = len(seq) if end is None else end
        row = Row(seq, start, end, lookahead, writes, prefill=writes and start < len(seq) - 1)  # padding: one token
        self.rows.append(row)
        return row

    @property
    def seqs(self) -> list:
        """The sequences that run for real (padding rows excluded)."""
        return [r.seq for r in self.rows if r.writes]

    @property
    def padding(self) -> list:
        return [r.seq for r in self.rows if not r.writes]

    @property
    def num_prefill_tokens(self) -> int:
        return sum(r.end - r.start for r in self.rows if r.writes and r.prefill)

    def __bool__(self):
        return bool(self.rows)


@dataclass
class Draft:
    """k proposed tokens after a row's newest token. A chain by default (token i follows token i - 1); a tree
    (Medusa) gives each node's parent: -1 is the row's newest token, else an earlier node's index."""
    tokens: list                         # (k,) drafted ids
    q: object = None                     # (k, V) the proposer's distributions, or None (one-hot: n-gram, greedy)
    parents: Optional[list] = None       # (k,) tree only; None: a chain

    def __len__(self):
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.parents is None

    def depth(self, i: int) -> int:
        """Node i's distance from the row's newest token (its RoPE position is base + depth)."""
        d = 1
        while self.parents is not None and self.parents[i] >= 0:
            i, d = self.parents[i], d + 1
        return d if self.parents is not None else i + 1

    def ancestors(self, i: int) -> list:
        """Node i's ancestors among the drafts, nearest last, then i itself: the tokens its context ends with."""
        if self.parents is None:
            return list(range(i + 1))
        path = []
        while i >= 0:
            path.append(i)
            i = self.parents[i]
        return path[::-1]

    def depths(self) -> list:
        """(k,) each node's distance from the row's newest token."""
        return [self.depth(i) for i in range(len(self))]

    def mask(self) -> torch.Tensor:
        """(k, k) bool tree attention among the drafts: mask[i, j] = node j is node i or one of its ancestors
        (a chain: causal). The one place the engine, Medusa's tree and minillm.viz build it."""
        k = len(self)
        m = torch.zeros(k, k, dtype=torch.bool)                           # (k, k)
        for i in range(k):
            p = i - 1 if self.parents is None else self.parents[i]
            if p >= 0:
                m[i] = m[p]                                               # the parent's ancestors (parents first)
            m[i, i] = True
        return m

    def check(self) -> "Draft":
        """A tree's parents come first: each node's parent is -1 (the newest token) or an earlier node."""
        parents = list(range(-1, len(self) - 1)) if self.parents is None else self.parents
        bad = [i for i, p in enumerate(parents) if not -1 <= p < i]
        if len(parents) != len(self.tokens) or bad:
            raise ValueError(f"parents {self.parents} is not a tree of {len(self.tokens)} nodes whose parents come "
                             f"first (node {bad[0] if bad else len(self.tokens)})")
        return self


@dataclass
class Verdict:
    """What verification decided for one row."""
    tokens: list = field(default_factory=list)   # to append, in order ([] for a partial prompt chunk)
    accepted: int = 0                            # drafts kept: their K/V now count as computed
    path: list = field(default_factory=list)     # the accepted draft nodes in order (a tree's may skip slots)
    drafted: list = field(default_factory=list)  # what the trace shows as drafted
    terms: list = field(default_factory=list)    # per examined draft slot: sum_x min(p, q) (alpha's estimate)
    error: Optional[str] = None                  # the request's own mistake (a logits processor raised ...)
    logprobs: Optional[list] = None              # per token: {token id: raw logprob} (minillm.core.logprobs)
    prompt_logprobs: Optional[tuple] = None      # (first position, one dict per prompt token it scores)
