"""Several replicas on one simulated timeline: a discrete-event loop over their steps and the events between them.

Each replica (minillm.cluster.replica.SimReplica) has its own clock; an event (a request arriving at the router, a
KV handover landing at a decode engine) has a time. The loop always does the earliest thing next:

    t_event = the earliest pending event
    r       = the busy replica whose clock is furthest behind
    if t_event <= r's clock: deliver the event (an idle replica's clock first jumps to t_event)
    else:                    run one step of r (its clock moves by the step's modelled cost)

so a replica's steps run in parallel with the others' (their clocks interleave) and every event reaches a replica
at its time: a replica whose clock is ahead of an event is mid-step (that step began no later than the event,
since the loop stepped it as the furthest-behind), and the event waits for the step to end, as it would for real.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Optional

MAX_IDLE_STEPS = 100_000    # steps in a row without a model call anywhere: something can never be scheduled


class Timeline:
    """Pending events, earliest first: (time, callback(time))."""

    def __init__(self):
        self._heap: list = []
        self._order = itertools.count()             # ties in time: first pushed, first delivered

    def push(self, t: float, fn: Callable[[float], None]):
        heapq.heappush(self._heap, (t, next(self._order), fn))

    def next_time(self) -> Optional[float]:
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[float, Callable]:
        t, _, fn = heapq.heappop(self._heap)
        return t, fn

    def __bool__(self) -> bool:
        return bool(self._heap)


def simulate(replicas: list, timeline: Timeline, after_step: Callable, busy: Optional[Callable] = None):
    """Run until no event is pending and no replica is busy. after_step(replica, finished outputs) is called after
    every step (it may push events). busy(replica): whether it has work (default: replica.busy)."""
    busy = busy or (lambda r: r.busy)
    idle_steps = 0
    while True:
        working = [r for r in replicas if busy(r)]
        t = timeline.next_time()
        if not working and t is None:
            return
        r = min(working, key=lambda r: r.now()) if working else None
        if t is not None and (r is None or t <= r.now()):
            t, fn = timeline.pop()
            fn(t)
            continue
        calls = sum(x.engine.trace.count for x in replicas)
        after_step(r, r.step(t))
        idle_steps = idle_steps + 1 if sum(x.engine.trace.count for x in replicas) == calls else 0
        if idle_steps > MAX_IDLE_STEPS:
            raise RuntimeError(f"simulation stalled: {idle_steps} steps without a model call on any replica "
                               f"(replica {r.name!r} at t={r.now():.3f} s cannot schedule what it holds)")
