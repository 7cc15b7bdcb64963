"""Timed comparisons a lesson can trust: every setting warmed up, the settings interleaved, median and spread.

A laptop's speed drifts while a notebook runs (another program wakes, the CPU's clock changes, caches and JIT
compilations fill on first use). Timing setting A five times and then B five times puts the drift between them;
the first thing timed in a process also pays for everything the process loads on first use (the first engine
of notebook 07 once read 6.6x slower than the second). So `interleaved`:

1. calls every setting `warmup` times first, unmeasured (compiles, caches, the first engine's loading);
2. then runs `repeats` rounds, each calling every setting once, the order rotating from round to round, so a
   slow moment lands on all settings alike and none is always first;
3. keeps every sample: `Timing` reports each setting's median with its min and max, and a ratio between two
   settings as the median of the per-round ratios (each round's pair ran side by side) with their min and max.

A run is a function of no arguments. It may return its own seconds as a number (e.g. the decode seconds an engine's
trace recorded, leaving out setup it should not be charged for); if it returns anything else (None, an array, an
engine's outputs) its call is timed by the clock.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class Timing:
    samples: dict            # label -> [seconds of each measured round]

    def median(self, label: str) -> float:
        return statistics.median(self.samples[label])

    def spread(self, label: str) -> tuple:
        """(min, max) seconds over the rounds."""
        return min(self.samples[label]), max(self.samples[label])

    def ratios(self, num: str, den: str) -> list:
        """Per round: num's seconds / den's seconds (rounds ran the pair side by side)."""
        return [a / b for a, b in zip(self.samples[num], self.samples[den])]

    def ratio(self, num: str, den: str) -> float:
        """The median per-round ratio of seconds: > 1 when num is slower."""
        return statistics.median(self.ratios(num, den))

    def speedup(self, fast: str, slow: str) -> tuple:
        """How many times faster `fast` ran than `slow`: (median, min, max) over the rounds."""
        r = [1 / x for x in self.ratios(fast, slow)]
        return statistics.median(r), min(r), max(r)

    def text(self, label: str, scale: float = 1e3, unit: str = "ms", digits: int = 2) -> str:
        """e.g. "4.12 ms (3.98-4.40, 5 rounds)"."""
        lo, hi = self.spread(label)
        f = f"{{:.{digits}f}}"
        return (f"{f.format(self.median(label) * scale)} {unit} ({f.format(lo * scale)}-{f.format(hi * scale)}, "
                f"{len(self.samples[label])} rounds)")

    def speedup_text(self, fast: str, slow: str) -> str:
        """e.g. "1.42x (1.30-1.51 over 5 rounds)": how many times faster `fast` ran than `slow`."""
        m, lo, hi = self.speedup(fast, slow)
        return f"{m:.2f}x ({lo:.2f}-{hi:.2f} over {len(self.samples[fast])} rounds)"


def interleaved(runs: dict, repeats: int = 5, warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Warm every run up, then `repeats` rounds of every run once, the order rotating. -> Timing."""
    if not runs:
        raise ValueError("runs must name at least one setting to time")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    labels = list(runs)
    for _ in range(warmup):
        for label in labels:
            runs[label]()
    samples = {label: [] for label in labels}
    for r in range(repeats):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            samples[label].append(_seconds(runs[label], clock))
    return Timing(samples)


def _seconds(run, clock) -> float:
    t0 = clock()
    own = run()
    t1 = clock()
    took = float(own) if isinstance(own, (int, float)) and not isinstance(own, bool) else t1 - t0
    if not took > 0:
        raise ValueError(f"a timed run took {took} s: return a positive number of seconds, or None to be timed")
    return took


def decode_run(llm, prompts, params, **generate_options) -> Callable[[], float]:
    """A run for `interleaved`: the engine serves `prompts` once and is charged its decode steps' seconds per decode
    token, from its own trace (building the engine and the prompts' prefill are not charged)."""
    def run() -> float:
        first = len(llm.engine.trace.steps)
        llm.generate(prompts, params, **generate_options)
        dec = [st for st in llm.engine.trace.steps[first:] if st.kind == "decode"]
        return sum(st.seconds for st in dec) / sum(st.num_decode_tokens for st in dec)
    return run
