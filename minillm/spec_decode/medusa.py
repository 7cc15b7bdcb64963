"""Medusa as proposer (Cai et al. 2024): K heads on the target's own last hidden state guess the tokens 2..K+1
ahead; their top candidates form a tree (minillm.spec_decode.medusa_tree.build_tree) that the target verifies
in one forward through a tree attention mask. Greedy only: the longest path the target agrees with is kept
(the runner moves its K/V into consecutive slots) and the target's token after it emitted.

The proposer keeps, per sequence, the target's final hidden state at its last computed token (position
num_computed - 1), which the runner returns because needs_hidden is set. A sequence whose state is missing or
stale (a failed step, a recompute) asks for no slots: it decodes plainly once, which refreshes the state.
"""
from __future__ import annotations

import torch

from ..core.batch import ScheduledBatch
from ..core.proposer import Proposer, draft_len
from ..core.sequence import Sequence
from .medusa_tree import build_tree


class MedusaProposer(Proposer):
    needs_hidden = True

    def __init__(self, heads, classifier_weight, choices, gamma: int, max_model_len: int):
        self.heads, self.classifier = heads, classifier_weight        # (K, C, C) heads, (V, C) the target's
        self.choices, self.gamma, self.max_model_len = [tuple(c) for c in choices], gamma, max_model_len
        self.hidden: dict[int, tuple] = {}                             # seq_id -> (position, (C,) hidden state)

    def _state(self, seq: Sequence):
        pos, h = self.hidden.get(seq.seq_id, (None, None))
        return h if pos == seq.num_computed - 1 else None

    def _choices(self, seq: Sequence) -> list:
        """The tree cut to depth k (gamma, fewer near max_tokens) and to the slots left before max_model_len."""
        k = draft_len(seq, self.gamma, self.max_model_len)
        return [c for c in self.choices if len(c) <= k][:max(0, self.max_model_len - len(seq))]

    def num_slots(self, seq: Sequence) -> int:
        return len(self._choices(seq)) if self._state(seq) is not None else 0

    @torch.inference_mode()
    def propose(self, batch: ScheduledBatch) -> list:
        drafts = []
        for row in batch.rows:
            h = self._state(row.seq) if row.lookahead else None
            choices = self._choices(row.seq)[:row.lookahead] if h is not None else []
            if not choices:
                drafts.append(None)
                continue
            tree = build_tree(row.seq.token_ids[-1], self.heads(h, self.classifier), choices)   # heads: (K, V)
            drafts.append(tree.draft)                                                         # node 0 is the root
        return drafts

    def observe(self, batch: ScheduledBatch, drafts: list, verdicts: list, out) -> None:
        for i, (row, v) in enumerate(zip(batch.rows, verdicts)):
            if row.completes and v.error is None and out.hidden[i] is not None:
                last = v.path[-1] + 1 if v.path else 0                     # the newest token, or the path's end
                self.hidden[row.seq.seq_id] = (row.end - 1 + len(v.path), out.hidden[i][last])
        for i, child in batch.forks:                                       # the same prefix, the same state
            if batch.rows[i].seq.seq_id in self.hidden:
                self.hidden[child.seq_id] = self.hidden[batch.rows[i].seq.seq_id]

    def rollback(self, seq: Sequence, valid: int) -> None:
        pos, _ = self.hidden.get(seq.seq_id, (None, None))
        if pos is not None and pos >= valid:
            del self.hidden[seq.seq_id]

    def gc(self, running: set, swapped: set) -> None:
        """Keep swapped sequences' states: they resume decoding without a prefill to refresh them."""
        for seq_id in [i for i in self.hidden if i not in running and i not in swapped]:
            del self.hidden[seq_id]
