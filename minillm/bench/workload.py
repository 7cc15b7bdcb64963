"""Serving workloads: who arrives when, with how long a prompt, wanting how many tokens.

Arrivals are a Poisson process (exponential gaps at `rate` requests/s). Lengths are skewed the way chat
traffic is (many short requests, a long tail; cf. the ShareGPT statistics in the vLLM paper): drawn
from a log-normal with the given median and sigma, clipped to [lo, hi]. Output lengths are enforced
exactly with ignore_eos, so every policy serves the same number of tokens. The shared-prefix variant
gives every prompt the same system prompt (a fraction of its length), the case prefix caching serves.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Request:
    arrival: float          # seconds after the start
    prompt_ids: list        # token ids, BOS first
    max_tokens: int


def lognormal_lengths(rng, n: int, median: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), lo, hi).astype(int)


def make_workload(n: int, vocab_size: int, rate: float = 20.0, prompt_median: float = 64, prompt_sigma: float = 0.8,
                  output_median: float = 32, output_sigma: float = 1.0, max_len: int = 1024, shared_prefix: float = 0.0,
                  seed: int = 0) -> list[Request]:
    """n requests. shared_prefix in [0, 1): that fraction of every prompt is one common prefix."""
    if not 0 <= shared_prefix < 1:
        raise ValueError(f"shared_prefix must be in [0, 1), got {shared_prefix}")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n)) if rate > 0 else np.zeros(n)
    prompts = lognormal_lengths(rng, n, prompt_median, prompt_sigma, 2, max_len // 2)
    outputs = lognormal_lengths(rng, n, output_median, output_sigma, 1, max_len // 2)
    common = rng.integers(259, vocab_size, size=max_len).tolist()   # ordinary (non-byte, non-special) tokens
    reqs = []
    for t, p, o in zip(arrivals, prompts, outputs):
        k = int(round(shared_prefix * p))
        body = common[:k] + rng.integers(259, vocab_size, size=p - k).tolist()
        reqs.append(Request(float(t), [1] + body[:p - 1], int(min(o, max_len - p))))
    return reqs


class SkipClock:
    """Wall-clock time plus the idle gaps skipped: replaying arrivals needs no sleeping, and every
    busy second is a real, measured second."""

    def __init__(self):
        import time
        self._now = time.perf_counter
        self.start = self._now()
        self.skipped = 0.0

    def __call__(self) -> float:
        return self._now() - self.start + self.skipped

    def skip_to(self, t: float):
        if t > self():
            self.skipped += t - self()


class SimClock:
    """A clock that moves only when told: by a step's modelled cost, or to the next arrival when idle."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float):
        self.now += seconds

    def skip_to(self, t: float):
        self.now = max(self.now, t)
