"""The proposer seam: who drafts the tokens a decode row verifies. Plain decoding is the proposer that drafts
nothing (k = 0), so the engine has one step path with or without speculation.

A proposer answers four questions, each called by LLMEngine.step:
    num_slots(seq) -> int            draft slots it wants past a decode's newest token (the scheduler grants
                                     them all, or none when they would not fit without preempting anyone)
    propose(batch) -> [Draft|None]   per row: up to row.lookahead drafted tokens (a chain, or a tree), with the
                                     proposer's distributions q when it samples (None: one-hot, as n-gram lookup)
    observe(batch, drafts, verdicts, out)   after verification: how many drafts each row kept (roll back the
                                     rest), its forks, and hidden states at the kept tokens if needs_hidden
    rollback(seq, valid)             only the first `valid` tokens of seq stand (a failed step; 0: forget seq)
and gc(running, swapped) drops what it holds for sequences that no longer run. The shipped proposers are
minillm.spec_decode.ngram, minillm.spec_decode.draft_model and minillm.spec_decode.medusa; a new one is one more file.
"""
from __future__ import annotations

from .batch import ScheduledBatch
from .sequence import Sequence


def draft_len(seq: Sequence, gamma: int, max_model_len: int) -> int:
    """Tokens worth drafting for seq: gamma, fewer near max_tokens (no draft past the last token the request
    wants) or max_model_len (the drafts take positions len(seq) .. len(seq) + k - 1)."""
    return max(0, min(gamma, seq.params.max_tokens - len(seq.output_ids), max_model_len - len(seq)))


class Proposer:
    """Drafts nothing: plain decoding."""
    needs_hidden = False

    def num_slots(self, seq: Sequence) -> int:
        return 0

    def propose(self, batch: ScheduledBatch) -> list:
        return [None] * len(batch.rows)

    def observe(self, batch: ScheduledBatch, drafts: list, verdicts: list, out) -> None:
        pass

    def rollback(self, seq: Sequence, valid: int) -> None:
        pass

    def gc(self, running: set, swapped: set) -> None:
        pass
