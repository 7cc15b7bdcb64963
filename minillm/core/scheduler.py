"""The scheduler: the queues, and the mechanism that turns a policy's choices into blocks and rows.

Who runs is the policy's call (minillm.core.policies); how is the scheduler's:
- a row always starts at the sequence's num_computed (the tokens whose K/V are really in the cache), so a step
  that failed, or a preempted sequence coming back, recomputes exactly what is missing;
- a sequence joins only if its whole prompt plus one token fits in free blocks (prefix-cache hits count as free);
- when a running sequence finds no free block, the order's victim (fcfs: the most recently admitted) is preempted:
  swapped out (preemption_mode "swap", if the swap space has room) or dropped and queued first to be recomputed;
- a decode row gets the draft slots the proposer asks for (vLLM's lookahead slots) only if they fit without
  preempting anyone; otherwise it decodes plainly this step;
- n > 1: only a request's first sample is prefilled; the others fork its blocks when its prompt is done.
- beam search (minillm.decoding.beam): extend() of a beam schedules all of its group's beams or none, and a preempted
  beam takes its whole group with it (the group starts over from its prompt).
update() appends the verified tokens, checks stops (minillm.core.detokenizer), finishes, frees and rolls back.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Callable, Optional

from ..config import EngineConfig
from .batch import ScheduledBatch, Verdict
from .block_manager import BlockManager
from .hooks import NoAdapters, NoEviction
from .order import FCFS
from .policies import SchedulingPolicy, batching_policy
from .sequence import Sequence, Status


class Scheduler:
    """Optional features arrive as objects (minillm.core.hooks), never as branches: `eviction` (which cached blocks
    leave after a step), `lora` (adapter slots, filled as sequences are admitted), `groups` (request_id ->
    BeamGroup, shared with the engine's beam step: a group runs and leaves whole)."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager, clock: Callable[[], float], stops,
                 policy: Optional[SchedulingPolicy] = None, slots: Optional[Callable[[Sequence], int]] = None,
                 eviction: NoEviction = NoEviction(), lora: NoAdapters = NoAdapters(), groups: Optional[dict] = None):
        self.config, self.block_manager, self.clock, self.stops = config, block_manager, clock, stops
        self.eviction, self.lora = eviction, lora
        self.policy = policy or batching_policy(config)
        self.order = getattr(self.policy, "order", None) or FCFS()   # who is preempted, who swaps in (core/order.py)
        self.slots = slots or (lambda seq: 0)     # draft slots the proposer wants past a decode's newest token
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.padding: list[Sequence] = []         # static batching: finished, still holding their batch slot
        self.swapped: deque[Sequence] = deque()   # preempted by swapping, oldest first
        self.pending_forks: dict[int, list[Sequence]] = {}   # parent seq_id -> samples waiting for its prompt
        self.groups: dict = dict(groups or {})   # request_id -> BeamGroup (minillm.decoding.beam); the scheduler's own
        self.expect_arrivals = True               # schedule()'s argument: False when every request is known
        default_budget = 512 if config.enable_chunked_prefill else max(config.max_model_len, 2048)
        self.budget = config.max_num_batched_tokens or default_budget
        self._swap_out: list = []

    def add(self, seqs: list[Sequence]):
        """A request's samples: the first waits to be prefilled, the others to fork it (copy-on-write)."""
        self.waiting.append(seqs[0])
        if len(seqs) > 1:
            self.pending_forks[seqs[0].seq_id] = list(seqs[1:])

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def live_ids(self) -> tuple[set, set]:
        """Ids of the running and of the swapped-out sequences (a proposer keeps state for these only)."""
        return {s.seq_id for s in self.running}, {s.seq_id for s in self.swapped}

    # ------------------------------------------------------------------ the mechanism policies use
    def admit(self, batch: ScheduledBatch, seq: Sequence, budget, chunk: bool = False) -> int:
        budget = budget if chunk else math.inf                # unchunked: the whole prompt in one row
        bm, most = self.block_manager, self.eviction.chunk   # most: tokens a row may compute (eviction's chunk)
        first = min(len(seq), most)
        if len(self.running) >= self.config.max_num_seqs or not bm.can_allocate(seq, first + 1):
            return 0
        if not self.lora.admit(seq, self):
            return 0                                          # every adapter slot is in use: it waits
        self.waiting.remove(seq)
        hits = self.eviction.allocate_prompt(bm, seq)         # eviction: the first chunk's blocks only
        seq.metrics.num_cached_tokens += hits                      # prefix-cache hits need no computing
        seq.status = Status.RUNNING
        if seq.metrics.first_scheduled_time is None:
            seq.metrics.first_scheduled_time = self.clock()
        self.running.append(seq)
        end = int(min(len(seq), seq.num_computed + budget, seq.num_computed + most))   # chunked prefill, eviction
        self.eviction.admitted(bm, seq, end)
        batch.add(seq, seq.num_computed, end)
        return end - seq.num_computed

    def extend(self, batch: ScheduledBatch, seq: Sequence, budget=float("inf")) -> int:
        if seq.request_id in self.groups:                     # a beam group runs whole or waits (minillm.decoding.beam)
            return self.groups[seq.request_id].extend(self, batch, budget)
        return self.extend_one(batch, seq, budget)

    def extend_one(self, batch: ScheduledBatch, seq: Sequence, budget=float("inf")) -> int:
        start = seq.num_computed
        end = int(min(len(seq), start + budget, start + self.eviction.chunk))
        if end <= start:
            return 0
        extra, bm = 0, self.block_manager
        if start == len(seq) - 1:                             # a decode: the drafts' slots, if they fit
            extra = int(min(self.slots(seq), budget - 1))
            if extra and bm.write_cost(seq, start, end + extra) > bm.num_free:
                extra = 0
        if not self._make_room(batch, seq, start, end + extra):
            return 0
        batch.add(seq, start, end, extra)
        return end - start + extra

    def _make_room(self, batch: ScheduledBatch, seq: Sequence, start: int, end: int) -> bool:
        """Private blocks for positions start .. end - 1 (growing the table, copying shared blocks), preempting the
        newest running sequences if needed. False if seq itself was preempted."""
        bm = self.block_manager
        while bm.write_cost(seq, start, end) > bm.num_free:
            victim = self.order.victim(self)      # fcfs: the newest running sequence
            pending, saved = {d: s for s, d in batch.copies}, len(self._swap_out)
            gone = self.preempt(victim)           # [victim], or a whole beam group
            # a victim swapped out after its row asked for a copy-on-write copy: the copy is dropped below, so the
            # swap-out reads the copy's source (the block still holding those K/V), not the unfilled copy
            self._swap_out[saved:] = [(pending.get(d, d), w) for d, w in self._swap_out[saved:]]
            batch.rows = [r for r in batch.rows if r.seq not in gone]
            owned = {b for r in batch.rows for b in r.seq.block_table}
            batch.copies = [(s, d) for s, d in batch.copies if d in owned]   # none into a block just given back
            if seq in gone:
                return False
        batch.copies += bm.prepare_write(seq, start, end)
        return True

    def preempt(self, seq: Sequence) -> list:
        """preemption_mode "swap": move the sequence's K/V to the swap space (if it has room) and resume it later
        where it stopped. "recompute" (or a full swap space): drop its K/V and queue it first; its prefill rebuilds
        them (vLLM v0's two modes; recompute is cheaper for short sequences). A beam's whole group leaves and starts
        over from its prompt (minillm.decoding.beam). -> the sequences that left running."""
        if seq.request_id in self.groups:
            return self.groups[seq.request_id].restart(self, seq)
        self.running.remove(seq)
        seq.metrics.num_preemptions += 1
        if self.config.preemption_mode == "swap" and self.block_manager.can_swap_out(seq):
            self._swap_out += self.block_manager.swap_out(seq)
            seq.status = Status.SWAPPED
            self.swapped.append(seq)
            return [seq]
        self.block_manager.free_seq(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        return [seq]

    def add_padding(self, batch: ScheduledBatch):
        """Static batching: finished sequences recompute their last written position and write nothing (a real
        row of compute, as in FasterTransformer). That is num_computed - 1: usually len(seq) - 2, but tokens a
        guided pattern forced in the last step (jump-forward) were appended without being computed."""
        for seq in self.padding:
            batch.add(seq, seq.num_computed - 1, seq.num_computed, writes=False)

    def release_padding(self):
        for seq in self.padding:
            self.block_manager.free_seq(seq)
        self.padding = []

    # ------------------------------------------------------------------ schedule
    def schedule(self, expect_arrivals: bool = True) -> ScheduledBatch:
        """expect_arrivals False: every request is known (LLM.generate), so no batching window waits for more."""
        self.expect_arrivals = expect_arrivals
        if self.padding and not self.running:        # nobody left running: the static batch is over
            self.release_padding()
        self.order.refresh(self)                     # levels, counters, the radix tree: before any choice
        swap_in = self._swap_in()
        batch = self.policy.schedule(self)
        batch.swap_in, batch.swap_out, self._swap_out = swap_in, self._swap_out, []
        for i, row in enumerate(batch.rows):
            if row.completes:
                batch.forks += [(i, c) for c in self.pending_forks.get(row.seq.seq_id, []) if not c.is_finished]
        return batch

    def _swap_in(self) -> list:
        """Swapped-out sequences come back first (fcfs; another order brings back the best ranked unless a waiting
        request outranks it), as soon as their blocks and one more fit."""
        pairs, bm = [], self.block_manager
        while self.swapped and len(self.running) < self.config.max_num_seqs:
            seq = self.order.next_swap_in(self)      # fcfs: the oldest; other orders: the best ranked, if no
            if seq is None or len(seq.swap_table) + 1 > bm.num_free:   # waiting request outranks it
                break
            self.swapped.remove(seq)
            pairs += bm.swap_in(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
        return pairs

    def rollback(self, batch: ScheduledBatch):
        """The step failed. Rows changed nothing that counts (num_computed moves only in update), but if the batch's
        copies and swaps were not all carried out, the blocks they were to fill hold nothing yet: the sequences
        that own them start over (recompute)."""
        if batch.moved:
            return
        filled = {d for _, d in batch.copies} | {d for _, d in batch.swap_in}
        saved = {s for _, s in batch.swap_out}
        lost = [s for s in self.running if filled & set(s.block_table)]
        lost += [s for s in self.swapped if saved & set(s.swap_table)]
        for seq in lost:
            if seq.status is Status.RUNNING:
                self.running.remove(seq)
                self.block_manager.free_seq(seq)
            else:
                self.swapped.remove(seq)
                self.block_manager.free_swap(seq)
            seq.num_computed, seq.status = 0, Status.WAITING
            self.waiting.appendleft(seq)

    def save(self, batch: ScheduledBatch) -> tuple:
        """What the step may change, for restore() if it fails (LLMEngine._transaction): the queues, the blocks, and
        every sequence update() may touch (the batch's, the samples waiting to fork them, the static padding)."""
        seqs = [r.seq for r in batch.rows] + [c for _, c in batch.forks] + self.padding
        seqs += [c for r in batch.rows for c in self.pending_forks.get(r.seq.seq_id, ())]
        queues = [(q, list(q)) for q in (self.running, self.waiting, self.swapped)]
        return ([(s, s.save()) for s in dict.fromkeys(seqs)], queues, list(self.padding),
                {k: list(v) for k, v in self.pending_forks.items()}, dict(self.groups), self.block_manager.save())

    def restore(self, saved: tuple):
        seqs, queues, self.padding, forks, groups, blocks = saved
        for s, state in seqs:
            s.restore(state)
        for q, items in queues:
            q.clear()
            q.extend(items)
        for now, before in [(self.pending_forks, forks), (self.groups, groups)]:
            now.clear()
            now.update(before)
        self.block_manager.restore(blocks)

    # ------------------------------------------------------------------ update
    def update(self, batch: ScheduledBatch, verdicts: list[Verdict]) -> list[Sequence]:
        """Record what the step computed and append what verification emitted (verdicts: one per row, then one per
        fork). -> the sequences that finished."""
        now, done = self.clock(), []
        rows = [(r.seq, r.end, r.completes, v) for r, v in zip(batch.rows, verdicts)
                if r.writes and not r.seq.is_finished]                  # (a beam pruned before the update)
        for (i, child), v in zip(batch.forks, verdicts[len(batch.rows):]):   # before a parent can finish and free
            parent, end = batch.rows[i].seq, batch.rows[i].end
            waiting = self.pending_forks[parent.seq_id]
            waiting.remove(child)
            if not waiting:
                del self.pending_forks[parent.seq_id]
            if child.is_finished:                                # aborted while waiting
                continue
            if verdicts[i].error is None:
                self.block_manager.fork(parent, child)           # shares the prompt's blocks (copy-on-write)
                child.metrics.first_scheduled_time = parent.metrics.first_scheduled_time
                child.status = Status.RUNNING
                self.running.append(child)
            rows.append((child, end, True, v if verdicts[i].error is None else verdicts[i]))
        for seq, end, completes, v in rows:
            if v.error is not None:
                self.finish(seq, "error", v.error)
            elif self._advance(seq, end + v.accepted, v.tokens if completes else [], now):
                self.finish(seq, pad=self.policy.pads)
            if seq.is_finished:
                done.append(seq)
        if self.padding and not self.running:
            self.release_padding()
        return done

    def _advance(self, seq: Sequence, computed: int, tokens: list, now: float) -> bool:
        """seq's K/V now reach `computed`; append tokens until a stop. -> finished?"""
        seq.num_computed = computed
        finished = False
        for t in tokens:
            seq.output_ids.append(t)
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            seq.metrics.token_times.append(now)
            try:
                finished = self.stops.check(seq)
            except Exception as e:                       # a tokenizer that cannot decode: this request's problem
                seq.finish_reason, seq.error = "error", f"{type(e).__name__}: {e}"
                return True
            if finished:
                break
        seq.num_computed = min(seq.num_computed, len(seq))
        self.block_manager.mark_computed(seq)            # full blocks become reusable prefixes
        if not finished:
            self.block_manager.truncate(seq, len(seq))   # blocks only rejected drafts used go back
            self.eviction.evict(self.block_manager, seq)   # kv_eviction: blocks out of the window (or the lightest)
        return finished

    def finish(self, seq: Sequence, reason: Optional[str] = None, error: Optional[str] = None, pad: bool = False):
        """Done, aborted or failed. With pad, the sequence keeps its blocks as padding until its batch ends."""
        if reason is not None:
            seq.finish_reason = reason
        if error is not None:
            seq.error = error
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:   # (a sample waiting to fork is in no queue)
            self.waiting.remove(seq)
        elif seq.status is Status.SWAPPED:
            self.swapped.remove(seq)
            self.block_manager.free_swap(seq)
        if pad and seq.block_table and seq.finish_reason != "error":
            self.padding.append(seq)
        else:
            self.block_manager.free_seq(seq)
        seq.status = Status.FINISHED
        seq.metrics.finished_time = self.clock()
        for child in self.pending_forks.pop(seq.seq_id, []):  # its samples never got their prompt
            if not child.is_finished:
                self.finish(child, seq.finish_reason, seq.error)
        if not pad and self.padding and not self.running:   # the static batch is over
            self.release_padding()
