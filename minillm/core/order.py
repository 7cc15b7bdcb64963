"""A scheduling order's interface, and FCFS, the default order (EngineConfig.scheduling_policy="fcfs").

An order decides WHICH waiting request is admitted next, which running one is preempted, and in which order the
running ones get a step's token budget; a batching policy (minillm.core.policies) asks it who comes first. The
other orders (sjf, priority, mlfq, fair, lpm) are plug-ins: minillm.scheduling.orders.

The interface the batching policies and the scheduler call (a subclass overrides key(); fcfs overrides the rest):
    refresh(sched)         once per step, before anything is scheduled: update levels, counters, the tree
    admissible(sched)      waiting sequences in admission order (empty while a better-ranked one is swapped out)
    running(sched)         running sequences, best first (who gets the budget first)
    victim(sched)          the running sequence to preempt when blocks run out (the worst ranked)
    next_swap_in(sched)    the swapped-out sequence to bring back now, or None
    preempt(sched)         preemptive orders: preempt lower-ranked running sequences for a waiting one that outranks
                           them and cannot otherwise fit (seats or blocks)
"""
from __future__ import annotations

from typing import Optional

from ..kernels import cdiv
from .sequence import Sequence


class Order:
    name = "order"
    preemptive = False          # may a waiting request preempt a running one it outranks
    uses_priority = False       # does it read a request's priority= (the engine refuses priority= otherwise)

    def key(self, seq: Sequence) -> tuple:
        """Smaller runs first. Every key ends in (arrival time, seq id): ties go to the oldest."""
        raise NotImplementedError

    def tiebreak(self, seq: Sequence) -> tuple:
        return seq.metrics.arrival_time, seq.seq_id

    # ------------------------------------------------------------------ what the policies and scheduler call
    def refresh(self, sched):
        pass

    def admissible(self, sched) -> list:
        waiting = sorted(sched.waiting, key=self.key)
        if sched.swapped:                       # a preempted sequence that outranks them comes back first
            best = min(self.key(s) for s in sched.swapped)
            waiting = [s for s in waiting if self.key(s) < best]
        return waiting

    def running(self, sched) -> list:
        return sorted(sched.running, key=self.key)

    def victim(self, sched) -> Sequence:
        return max(sched.running, key=self.key)

    def next_swap_in(self, sched) -> Optional[Sequence]:
        best = min(sched.swapped, key=self.key)
        if sched.waiting and min(self.key(s) for s in sched.waiting) < self.key(best):
            return None                         # a waiting request outranks it: it goes first
        return best

    def preempt(self, sched):
        """Preemptive orders: walk the waiting sequences best first, counting the seats and blocks those that fit
        will take; for the first that does not fit, preempt the running sequences it outranks, worst first, as
        few as make it fit (none if even all of them would not)."""
        if not self.preemptive:
            return
        bm, seats = sched.block_manager, sched.config.max_num_seqs
        free_seats, free_blocks = seats - len(sched.running), bm.num_free
        for seq in self.admissible(sched):
            need = cdiv(len(seq) + 1, bm.block_size) - len(seq.block_table)       # its prompt plus one token
            if free_seats < 1 or need > free_blocks:
                lower = sorted((s for s in sched.running if self.key(s) > self.key(seq)), key=self.key, reverse=True)
                k = next((k for k in range(1, len(lower) + 1) if free_seats + k >= 1 and
                          need <= free_blocks + sum(len(s.block_table) for s in lower[:k])), None)
                if k is None:
                    return                      # it waits; so do those after it (admission stops at it too)
                for victim in lower[:k]:
                    free_seats, free_blocks = free_seats + 1, free_blocks + len(victim.block_table)
                    sched.preempt(victim)
            free_seats, free_blocks = free_seats - 1, free_blocks - need


class FCFS(Order):
    """Today's engine, unchanged: the deques' own order (a preempted sequence goes back to the front)."""
    name = "fcfs"

    def key(self, seq: Sequence) -> tuple:
        return self.tiebreak(seq)

    def admissible(self, sched) -> list:
        return list(sched.waiting) if not sched.swapped else []   # swapped sequences come back first

    def running(self, sched) -> list:
        return list(sched.running)

    def victim(self, sched) -> Sequence:
        return sched.running[-1]                                  # the most recently admitted

    def next_swap_in(self, sched) -> Optional[Sequence]:
        return sched.swapped[0]
