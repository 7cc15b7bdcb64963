"""A draft model as proposer (Leviathan et al. 2023; the shipped distilled draft): it decodes k tokens ahead on
its own paged KV pool, sampled with the request's own parameters and generator, and q is its distribution.

The draft keeps a shadow of each speculating sequence (the same tokens, its own block table in its own pool).
Each step, round 1 catches the shadow up on the tokens the target accepted since the last step and drafts
one token; rounds 2..k draft one more each, every round one batched forward of the draft. After verification
the shadow is rolled back to the tokens that stand. Where samples or prefix-cache hits share the target's
blocks the shadows do not, so the draft's pool may run short: a sequence it cannot hold this step drafts
nothing (it decodes plainly), which never changes what is emitted.
"""
from __future__ import annotations

import torch

from ..core.batch import Draft, ScheduledBatch
from ..core.block_manager import BlockManager
from ..core.model_runner import ModelRunner
from ..core.proposer import Proposer, draft_len
from ..core.sampling import sampling_probs
from ..core.sequence import Sequence
from ..llama.kv_cache import KVCache


class DraftProposer(Proposer):
    def __init__(self, draft_forward, draft_config, gamma: int, max_model_len: int, num_blocks: int,
                 block_size: int, kv_dtype=torch.float32):
        """draft_forward: the draft's forward (a Transformer, or its numba twin: minillm.backends.capabilities)."""
        self.gamma, self.max_model_len = gamma, max_model_len
        self.kv = KVCache(draft_config, num_blocks, block_size, kv_dtype)
        self.blocks = BlockManager(num_blocks, block_size)
        self.runner = ModelRunner(draft_forward, self.kv)
        self.shadows: dict[int, Sequence] = {}           # target seq_id -> the draft's copy

    def num_slots(self, seq: Sequence) -> int:
        return draft_len(seq, self.gamma, self.max_model_len)

    def _shadow(self, seq: Sequence) -> Sequence:
        sh = self.shadows.get(seq.seq_id)
        if sh is None:
            sh = self.shadows[seq.seq_id] = Sequence(seq.seq_id, seq.request_id, seq.index, [], seq.params, 0, 0.0)
        sh.prompt_ids, sh.output_ids = list(seq.token_ids), []
        return sh

    @torch.inference_mode()
    def propose(self, batch: ScheduledBatch) -> list:
        tokens, qs, active, free = {}, {}, [], self.blocks.num_free
        for b, row in enumerate(batch.rows):
            if not row.lookahead:
                continue
            sh = self._shadow(row.seq)
            need = self.blocks.blocks_needed(sh, len(sh) + row.lookahead - 1)   # positions up to len + k - 2
            if need > free:                                                    # no room: no drafts this step
                self.rollback(row.seq, 0)
                continue
            free -= need
            active.append((b, row.seq, sh, row.lookahead))
            tokens[b], qs[b] = [], []
        for j in range(max((k for *_, k in active), default=0)):
            rows = [(b, s, sh) for b, s, sh, k in active if k > j]
            step = ScheduledBatch("decode")
            for _, _, sh in rows:
                self.blocks.allocate(sh, len(sh))
                step.add(sh, sh.num_computed, len(sh))
            logits = self.runner.run(step).logits                              # per row (1, V)
            for (b, s, sh), row in zip(rows, logits):
                p = s.params
                if p.greedy:
                    x = int(torch.argmax(row[0]))
                else:
                    q = sampling_probs(row[0], p)                                      # (V,) min_p too
                    x = int(torch.multinomial(q, 1, generator=s.generator))
                    qs[b].append(q)
                sh.num_computed = len(sh)
                sh.output_ids.append(x)
                tokens[b].append(x)
        return [Draft(tokens[b], torch.stack(qs[b]) if qs[b] else None) if tokens.get(b) else None
                for b in range(len(batch.rows))]

    def observe(self, batch: ScheduledBatch, drafts: list, verdicts: list, out) -> None:
        for row, d, v in zip(batch.rows, drafts, verdicts):
            if d is not None:
                self.rollback(row.seq, row.end + v.accepted)   # the draft's K/V past the kept tokens are stale

    def rollback(self, seq: Sequence, valid: int) -> None:
        sh = self.shadows.get(seq.seq_id)
        if sh is None:
            return
        if valid == 0:
            self.blocks.free_seq(self.shadows.pop(seq.seq_id))
            return
        sh.num_computed = min(sh.num_computed, valid)
        self.blocks.truncate(sh, sh.num_computed)

    def gc(self, running: set, swapped: set) -> None:
        """Free the shadows of sequences no longer running (a shadow is cheap to rebuild, and its blocks are
        better used by the sequences that run)."""
        for seq_id in [i for i in self.shadows if i not in running]:
            self.blocks.free_seq(self.shadows.pop(seq_id))
