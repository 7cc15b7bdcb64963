"""Prompt lookup (Saxena 2023; vLLM's "ngram" proposer): find the context's latest earlier occurrence of its
last n tokens and propose what followed it. Free to run; its q is one-hot; it holds no state."""
from __future__ import annotations

from ..core.batch import Draft, ScheduledBatch
from ..core.proposer import Proposer, draft_len
from ..core.sequence import Sequence


def ngram_lookup(tokens: list[int], k: int, ngram_max: int = 3, ngram_min: int = 1) -> list[int]:
    """k tokens copied from what followed the most recent earlier occurrence of the context's last n
    tokens, trying n = ngram_max first, down to ngram_min; [] when nothing matches. A copy that reaches
    the end of the context goes on through the tokens it has just proposed (a loop of period P repeats:
    the copy runs P tokens behind), so a short loop still fills all k."""
    L = len(tokens)
    for n in range(min(ngram_max, L - 1), ngram_min - 1, -1):
        suffix = tokens[L - n:]
        for i in range(L - n - 1, -1, -1):            # latest first; a match must end before the suffix
            if tokens[i:i + n] == suffix:
                ext = list(tokens)
                for j in range(i + n, i + n + k):     # j < len(ext) always: the copy trails by L - i - n >= 1
                    ext.append(ext[j])
                return ext[L:]
    return []


class NgramProposer(Proposer):
    def __init__(self, gamma: int, max_model_len: int, ngram_max: int = 3, ngram_min: int = 1):
        self.gamma, self.max_model_len, self.ngram_max, self.ngram_min = gamma, max_model_len, ngram_max, ngram_min

    def num_slots(self, seq: Sequence) -> int:
        return draft_len(seq, self.gamma, self.max_model_len)

    def propose(self, batch: ScheduledBatch) -> list:
        drafts = []
        for row in batch.rows:
            tokens = (ngram_lookup(row.seq.token_ids, row.lookahead, self.ngram_max, self.ngram_min)
                      if row.lookahead else [])
            drafts.append(Draft(tokens) if tokens else None)
        return drafts
