"""What each rank did and when: a timeline of compute and communication events, and the pipeline bubble read off it.

Every rank records (rank, kind, start, end, label) events while its group is recording (RankGroup.recording()):
kind "compute" for model work, or the collective's name ("all_reduce", "broadcast", "send", "recv", ...) for
communication. Times are time.perf_counter(), CLOCK_MONOTONIC on Linux: one clock for every process of the
machine, so the ranks' events line up on one axis (what notebook 12 draws).

The bubble: in a GPipe schedule (Huang et al. 2019) with p stages and m micro-batches of equal cost t, a step
lasts (m + p - 1) t and each stage computes for m t of it, so each stage idles (p - 1) / (m + p - 1) of the step.
`bubble` measures the same fraction from the events: 1 - (compute time) / (the step's span), per rank.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    rank: int
    kind: str        # "compute", or the collective: "broadcast", "all_reduce", "all_gather", "send", "recv"
    start: float     # time.perf_counter() seconds
    end: float
    label: str = ""  # e.g. "layer 3 attention", "micro-batch 2"

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Timeline:
    """One rank's events; recording is off until `enabled` (a span then costs about a microsecond)."""

    def __init__(self, rank: int):
        self.rank, self.enabled, self.events = rank, False, []

    @contextmanager
    def span(self, kind: str, label: str = ""):
        if not self.enabled:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.events.append(Event(self.rank, kind, t0, time.perf_counter(), label))

    def take(self) -> list:
        """The events so far, removed."""
        events, self.events = self.events, []
        return events


def gpipe_bubble(p: int, m: int) -> float:
    """The idle fraction of each stage in a GPipe step: (p - 1) / (m + p - 1), stages of equal cost."""
    return (p - 1) / (m + p - 1)


def bubble(events: list, window: tuple | None = None) -> dict:
    """Per rank: busy (compute) seconds, the window's seconds, and the idle fraction 1 - busy / window.
    window: (start, end); default the span of all the events (one step: first compute to last logits)."""
    if not events:
        return {}
    t0, t1 = window or (min(e.start for e in events), max(e.end for e in events))
    out = {}
    for rank in sorted({e.rank for e in events}):
        busy = sum(max(0.0, min(e.end, t1) - max(e.start, t0)) for e in events
                   if e.rank == rank and e.kind == "compute")
        out[rank] = {"busy_s": busy, "window_s": t1 - t0, "idle_fraction": 1.0 - busy / (t1 - t0)}
    return out
