"""The scheduler: who runs this step, and how many of their tokens. FCFS throughout.

Batching policies (EngineConfig.batching), each a rule for when waiting requests may join:
- "continuous" (Orca, Yu et al. 2022): at every step. A step is a prefill of newly admitted
  sequences or one decode token for every running one (vLLM's default before chunked prefill).
- "static" (FasterTransformer): only into an empty batch; a finished sequence stays in the batch as
  padding, holding its blocks and costing a row of compute, until the whole batch has finished.
- "dynamic" (Triton's dynamic batcher): static, but the batch is formed once max_num_seqs requests
  wait or the oldest has waited batch_window_s.
With enable_chunked_prefill (Sarathi-Serve; DeepSpeed-FastGen's SplitFuse), every step has a budget of
max_num_batched_tokens: running decodes first, then prompt chunks, so long prompts never stall decodes.

A sequence is admitted only if its whole prompt plus one token fits in free blocks (prefix-cache
hits counted as free). When a decode finds no free block, the most recently admitted sequence is
preempted by recompute: its blocks are freed and it waits again at the front of the queue.
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
    kind: str                                    # "prefill", "decode" or "mixed"
    seqs: list = field(default_factory=list)     # [Sequence]
    starts: list = field(default_factory=list)   # first position each sequence computes this step
    ends: list = field(default_factory=list)     # one past its last (< len(seq) for a partial prompt chunk)
    padding: list = field(default_factory=list)  # finished sequences riding along (static batching)
    copies: list = field(default_factory=list)   # (src, dst) block copies to make first (copy-on-write)
    swap_in: list = field(default_factory=list)  # (swap block, device block) pairs to bring back, first of all
    swap_out: list = field(default_factory=list) # (device block, swap block) pairs to save, before the copies
    lookahead: dict = field(default_factory=dict) # seq_id -> draft slots reserved past its next token (speculative)

    def add(self, seq: Sequence, start: int, end: int | None = None):
        self.seqs.append(seq)
        self.starts.append(start)
        self.ends.append(len(seq) if end is None else end)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(e - s for q, s, e in zip(self.seqs, self.starts, self.ends) if s < len(q) - 1)

    @property
    def num_decode_tokens(self) -> int:
        return sum(1 for q, s in zip(self.seqs, self.starts) if s == len(q) - 1)

    def __bool__(self):
        return bool(self.seqs)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, clock: Callable[[], float]):
        self.config = config
        self.block_manager = block_manager
        self.clock = clock
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.padding: list[Sequence] = []   # static/dynamic: finished, still holding their batch slot
        self.swapped: deque[Sequence] = deque()  # preempted by swapping, oldest first
        default_budget = 512 if config.enable_chunked_prefill else max(config.max_model_len, 2048)
        self.budget = config.max_num_batched_tokens or default_budget
        self._pending_swap_out: list = []
        # speculative decoding: extra slots a decode writes (its drafts), per sequence (vLLM's lookahead slots)
        self.lookahead: Callable[[Sequence], int] = lambda seq: 0

    def add(self, seq: Sequence):
        self.waiting.append(seq)

    def add_running(self, seq: Sequence):
        """A sequence that arrives with its blocks already in place (a forked sample)."""
        seq.status = Status.RUNNING
        self.running.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> ScheduledBatch:
        self._release_padding_if_done()  # nobody left running (finished, or all preempted): free the padding
        swap_in = self._swap_in()
        if self.config.batching == "continuous":
            if self.config.enable_chunked_prefill:
                batch = self._schedule_chunked()
            else:
                batch = self._admit(ScheduledBatch("prefill"), self.budget) if not self.swapped else ScheduledBatch("prefill")
                batch = batch if batch else self._schedule_decode()
        else:
            batch = self._schedule_static()
        batch.swap_in, batch.swap_out = swap_in, batch.swap_out + self._pending_swap_out
        self._pending_swap_out = []
        return batch

    def _swap_in(self) -> list:
        """Swapped-out sequences come back first (FCFS), as soon as their blocks and one more fit."""
        pairs, bm = [], self.block_manager
        while self.swapped and len(self.running) < self.config.max_num_seqs:
            seq = self.swapped[0]
            if len(seq.swap_table) + 1 > bm.num_free:
                break
            self.swapped.popleft()
            pairs += bm.swap_in(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
        return pairs

    def _schedule_static(self) -> ScheduledBatch:
        if self.running or self.padding or self.swapped:
            batch = self._schedule_decode()
            if batch or self.running or self.swapped:
                return batch
            self._release_padding_if_done()  # every member was preempted: the batch is over
        if self._batch_may_form():
            return self._admit(ScheduledBatch("prefill"), float("inf"))  # the whole batch, at once
        return ScheduledBatch("prefill")

    def _batch_may_form(self) -> bool:
        if self.config.batching == "static" or not self.waiting:
            return True
        waited = self.clock() - self.waiting[0].metrics.arrival_time
        return len(self.waiting) >= self.config.max_num_seqs or waited >= self.config.batch_window_s

    def _admit(self, batch: ScheduledBatch, budget) -> ScheduledBatch:
        """Move waiting sequences to running while seats, blocks and the token budget allow."""
        while self.waiting and not self.swapped and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not self.block_manager.can_allocate(seq, len(seq) + 1):
                break
            chunked = self.config.enable_chunked_prefill
            if not chunked and batch and len(seq) > budget:
                break
            if chunked and budget < 1:
                break
            self.waiting.popleft()
            hits = self.block_manager.allocate_prompt(seq)  # prefix-cache hits need no computing
            seq.metrics.num_cached_tokens += hits
            seq.status = Status.RUNNING
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = self.clock()
            self.running.append(seq)
            end = min(len(seq), seq.num_computed + budget) if chunked else len(seq)
            batch.add(seq, seq.num_computed, end)
            budget -= end - seq.num_computed
        return batch

    def _ensure_slot(self, batch: ScheduledBatch, seq: Sequence, start: int, end: int) -> bool:
        """Private blocks for positions start..end-1 (growing the table, copying shared blocks), preempting
        the newest sequences if needed. False if seq itself was preempted."""
        bm = self.block_manager
        while bm.write_cost(seq, start, end) > bm.num_free:
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        batch.copies += bm.prepare_write(seq, start, end)
        return True

    def _schedule_decode(self) -> ScheduledBatch:
        batch = ScheduledBatch("decode")
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue
            extra = self.lookahead(seq)
            if extra and self.block_manager.write_cost(seq, len(seq) - 1, len(seq) + extra) > self.block_manager.num_free:
                extra = 0       # no room for drafts: this sequence decodes plainly rather than preempting another
            if self._ensure_slot(batch, seq, len(seq) - 1, len(seq) + extra):
                batch.add(seq, len(seq) - 1)
                batch.lookahead[seq.seq_id] = extra
        batch.padding = list(self.padding)
        return batch

    def _schedule_chunked(self) -> ScheduledBatch:
        batch, budget = ScheduledBatch("mixed"), self.budget
        for seq in list(self.running):                      # decodes first: they never wait for a prompt
            if seq.status is Status.RUNNING and seq.num_computed == len(seq) - 1 and budget > 0:
                if self._ensure_slot(batch, seq, len(seq) - 1, len(seq)):
                    batch.add(seq, len(seq) - 1)
                    budget -= 1
        for seq in list(self.running):                      # then the rest of prompts already begun
            if seq.status is Status.RUNNING and seq.num_computed < len(seq) - 1 and budget > 0:
                end = min(len(seq), seq.num_computed + budget)
                batch.add(seq, seq.num_computed, end)
                budget -= end - seq.num_computed
        return self._admit(batch, budget)                   # then new prompts, chunked to the budget

    def _preempt(self, seq: Sequence):
        """preemption_mode "swap": move the sequence's K/V to the swap space (if it has room) and resume it
        later where it stopped. "recompute" (or a full swap space): drop its K/V and queue it first; its
        prefill rebuilds them (vLLM v0's two modes; recompute is cheaper for short sequences)."""
        self.running.remove(seq)
        seq.metrics.num_preemptions += 1
        if self.config.preemption_mode == "swap" and self.block_manager.can_swap_out(seq):
            self._pending_swap_out += self.block_manager.swap_out(seq)
            seq.status = Status.SWAPPED
            self.swapped.append(seq)
            return
        self.block_manager.free_seq(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    # ------------------------------------------------------------------ update
    def update(self, batch: ScheduledBatch, ids: list, is_finished: Callable[[Sequence], bool]):
        """Record what was computed; append each completed sequence's new token (ids[i] is None for a
        partial prompt chunk; a list for a speculative step, appended one by one until the sequence
        finishes); finish those that are done. A speculative sequence that goes on gives back the blocks
        that only its rejected drafts used (its end was set to the verified tokens)."""
        now = self.clock()
        for seq, end, tok in zip(batch.seqs, batch.ends, ids):
            seq.num_computed = end
            if tok is None:
                self.block_manager.mark_computed(seq)
                continue
            done = False
            for t in (tok if isinstance(tok, list) else [tok]):
                seq.output_ids.append(t)
                if seq.metrics.first_token_time is None:
                    seq.metrics.first_token_time = now
                seq.metrics.token_times.append(now)
                done = is_finished(seq)
                if done:
                    break
            self.block_manager.mark_computed(seq)   # full blocks become reusable prefixes
            if done:
                self.finish(seq, pad=self.config.batching != "continuous")
            elif isinstance(tok, list):
                self.block_manager.truncate(seq, len(seq))
        self._release_padding_if_done()

    def _release_padding_if_done(self):
        if self.padding and not self.running:       # the static batch is over: release its padding
            for seq in self.padding:
                self.block_manager.free_seq(seq)
            self.padding = []

    def finish(self, seq: Sequence, pad: bool = False):
        """Done (or aborted). With pad, the sequence keeps its blocks as padding until its batch ends."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:  # (a sample still waiting to be forked is in no queue)
            self.waiting.remove(seq)
        elif seq.status is Status.SWAPPED:
            self.swapped.remove(seq)
            self.block_manager.free_swap(seq)
        if pad and seq.block_table:
            self.padding.append(seq)
        else:
            self.block_manager.free_seq(seq)
        seq.status = Status.FINISHED
        seq.metrics.finished_time = self.clock()
        if not pad:
            self._release_padding_if_done()
