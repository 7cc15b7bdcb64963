"""The scheduler: who runs this step. FCFS, iteration-level (Orca-style continuous batching).

Each step is either a prefill of newly admitted sequences or one decode token for every running
sequence (vLLM's default before chunked prefill). A sequence is admitted only if the block manager
has room for its whole prompt plus one token; when a decode step finds no free block, the most
recently admitted sequence is preempted by recompute: its blocks are freed and it waits again at the
front of the queue, to be prefilled anew with the tokens it has so far.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .block_manager import BlockManager
from .config import EngineConfig
from .sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    kind: str                                   # "prefill" or "decode"
    seqs: list = field(default_factory=list)    # [Sequence]
    starts: list = field(default_factory=list)  # first position each sequence computes this step

    @property
    def num_tokens(self) -> int:
        return sum(len(s) - st for s, st in zip(self.seqs, self.starts))

    def __bool__(self):
        return bool(self.seqs)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, clock: Callable[[], float]):
        self.config = config
        self.block_manager = block_manager
        self.clock = clock
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.max_batched_tokens = config.max_num_batched_tokens or max(config.max_model_len, 2048)

    def add(self, seq: Sequence):
        self.waiting.append(seq)

    def add_running(self, seq: Sequence):
        """A sequence that arrives with its blocks already in place (a forked sample)."""
        seq.status = Status.RUNNING
        self.running.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> ScheduledBatch:
        batch = self._schedule_prefill()
        return batch if batch else self._schedule_decode()

    def _schedule_prefill(self) -> ScheduledBatch:
        batch, tokens = ScheduledBatch("prefill"), 0
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            n = len(seq)
            if batch and tokens + n > self.max_batched_tokens:
                break
            if not self.block_manager.can_allocate(seq, n + 1):
                break
            self.waiting.popleft()
            hits = self.block_manager.allocate_prompt(seq)  # prefix-cache hits need no computing
            seq.metrics.num_cached_tokens += hits
            seq.status = Status.RUNNING
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = self.clock()
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.starts.append(seq.num_computed)
            tokens += n - hits
        return batch

    def _schedule_decode(self) -> ScheduledBatch:
        batch = ScheduledBatch("decode")
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue  # preempted below while making room for an earlier sequence
            while not self.block_manager.can_allocate(seq, len(seq)):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                self.block_manager.allocate(seq, len(seq))
                batch.seqs.append(seq)
                batch.starts.append(len(seq) - 1)
        return batch

    def _preempt(self, seq: Sequence):
        """Recompute preemption: drop the sequence's KV, queue it first; its prefill rebuilds the KV."""
        self.running.remove(seq)
        self.block_manager.free_seq(seq)
        seq.status = Status.WAITING
        seq.metrics.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ------------------------------------------------------------------ update
    def update(self, batch: ScheduledBatch, ids: list[int], is_finished: Callable[[Sequence], bool]):
        """Append each sequence's new token; finish (and free) those that are done."""
        now = self.clock()
        for seq, tok in zip(batch.seqs, ids):
            seq.num_computed = len(seq)
            seq.output_ids.append(tok)
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            seq.metrics.token_times.append(now)
            self.block_manager.mark_computed(seq)   # full blocks become reusable prefixes
            if is_finished(seq):
                self.finish(seq)

    def finish(self, seq: Sequence):
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:  # (a sample still waiting to be forked is in no queue)
            self.waiting.remove(seq)
        self.block_manager.free_seq(seq)
        seq.status = Status.FINISHED
        seq.metrics.finished_time = self.clock()
