"""Serving workloads: who arrives when, with how long a prompt, wanting how many tokens.

Arrivals are a Poisson process (exponential gaps at `rate` requests/s). Lengths are skewed the way chat
traffic is (many short requests, a long tail; cf. the ShareGPT statistics in the vLLM paper): drawn
from a log-normal with the given median and sigma, clipped to [lo, hi]. Output lengths are enforced
exactly with ignore_eos, so every policy serves the same number of tokens. The shared-prefix variant
gives every prompt the same system prompt (a fraction of its length), the case prefix caching serves.

For scheduling (bench sched, notebook 11): `heavy_tailed` draws output lengths from a bounded Pareto
(a few requests want hundreds of tokens, most want a handful: the regime where FCFS's head-of-line blocking
hurts and size-based orders pay, as in FastServe's evaluation), requests may carry a `client` and a `priority`,
`merge` interleaves several clients' workloads, and `multi_turn_chat` builds conversations whose every turn's
prompt repeats the one before (system prompt, earlier questions and answers), the case a radix cache serves.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np


@dataclass
class Request:
    arrival: float          # seconds after the start
    prompt_ids: list        # token ids, BOS first
    max_tokens: int
    client: Optional[str] = None    # who sent it (scheduling_policy "fair")
    priority: int = 0               # lower first (scheduling_policy "priority")


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


def pareto_lengths(rng, n: int, alpha: float, lo: int, hi: int) -> np.ndarray:
    """Bounded Pareto on [lo, hi] (inverse CDF): P(X > x) falls as x**-alpha; alpha near 1 is a heavy tail."""
    u = rng.random(n)
    x = lo / (1 - u * (1 - (lo / hi) ** alpha)) ** (1 / alpha)
    return np.clip(np.round(x), lo, hi).astype(int)


def heavy_tailed(n: int, vocab_size: int, rate: float = 1.0, prompt_median: float = 16, prompt_sigma: float = 0.5,
                 output_lo: int = 4, output_hi: int = 400, alpha: float = 1.0, max_len: int = 1024,
                 client: Optional[str] = None, priorities: tuple = (0,), seed: int = 0) -> list[Request]:
    """n requests arriving as a Poisson process at `rate` per second; log-normal prompts; bounded-Pareto outputs
    (alpha 1: about one request in 10 wants over 10x the shortest, one in 100 over 100x). priorities: each
    request's priority is drawn uniformly from these."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n)) if rate > 0 else np.zeros(n)
    prompts = lognormal_lengths(rng, n, prompt_median, prompt_sigma, 2, max_len // 2)
    outputs = pareto_lengths(rng, n, alpha, output_lo, output_hi)
    prio = rng.choice(np.asarray(priorities), n)
    return [Request(float(t), [1] + rng.integers(259, vocab_size, size=p - 1).tolist(), int(min(o, max_len - p)),
                    client, int(q)) for t, p, o, q in zip(arrivals, prompts, outputs, prio)]


def at_rate(workload: list[Request], rate: float) -> list[Request]:
    """The same requests with arrival times scaled so that they come at `rate` per second on average."""
    span = workload[-1].arrival - workload[0].arrival
    scale = (len(workload) - 1) / rate / span if span > 0 else 0.0
    return [replace(r, arrival=(r.arrival - workload[0].arrival) * scale) for r in workload]


def merge(*workloads: list[Request]) -> list[Request]:
    """Several clients' workloads as one trace, by arrival time."""
    return sorted((r for w in workloads for r in w), key=lambda r: r.arrival)


def multi_turn_chat(conversations: int, turns: int, vocab_size: int, rate: float = 1.0, think_s: float = 1.0,
                    system_len: int = 48, user_median: float = 12, answer_median: float = 16, max_len: int = 1024,
                    seed: int = 0) -> list[Request]:
    """Chat sessions: each starts at a Poisson arrival (rate per second) and sends `turns` turns, think_s seconds
    apart on average. Turn k's prompt is the shared system prompt, then every earlier question and answer, then
    its own question; its max_tokens is its answer's length (the answer the next turn quotes: a trace fixes it,
    so the prefix of the next turn is known whatever a model would generate)."""
    rng = np.random.default_rng(seed)
    system = [1] + rng.integers(259, vocab_size, size=system_len - 1).tolist()
    reqs = []
    for start in np.cumsum(rng.exponential(1.0 / rate, conversations)):
        history, t = list(system), float(start)
        for _ in range(turns):
            question = rng.integers(259, vocab_size, size=int(lognormal_lengths(rng, 1, user_median, 0.5, 2, 64)[0]))
            answer = rng.integers(259, vocab_size, size=int(lognormal_lengths(rng, 1, answer_median, 0.5, 2, 64)[0]))
            prompt = history + question.tolist()
            if len(prompt) + len(answer) > max_len:
                break
            reqs.append(Request(t, prompt, len(answer)))
            history = prompt + answer.tolist()
            t += float(rng.exponential(think_s))
    return sorted(reqs, key=lambda r: r.arrival)


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
