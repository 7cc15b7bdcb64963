"""Replay a workload against a fresh engine and measure it (what `bench serve` and the serving lessons run).

Requests join at their arrival times on the engine's clock: a SkipClock (wall-clock time; when nothing runs,
time jumps to the next arrival, so nothing sleeps), or with `step_cost` a SimClock that advances by a cost
model's price for each model call (bench/step_cost.py). Reported per run: throughput, tokens per model step,
TTFT and TPOT (p50, p99), KV waste, peak concurrent sequences, preemptions, prefix-cache hits.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np

from ..config import EngineConfig
from ..core.sampling import SamplingParams
from ..engine.engine import LLMEngine
from ..workload import Request, SimClock, SkipClock


@dataclass
class ServeResult:
    label: str
    requests: int
    output_tokens: int
    seconds: float
    throughput: float            # output tokens per second
    tokens_per_step: float       # prefill + decode tokens per model call
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float              # seconds per output token after the first
    tpot_p99: float
    kv_waste: float              # reserved but unfilled KV bytes / reserved, averaged over steps
    peak_running: int
    preemptions: int
    cached_tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


def replay(model, tokenizer, workload: list[Request], label: str = "", return_engine: bool = False,
           step_cost: Optional[Callable] = None, policy=None, **options):
    """Serve `workload` on a fresh engine with these EngineConfig options -> ServeResult
    (with return_engine=True: (ServeResult, the engine, for its trace, and the finished RequestOutputs)).
    step_cost: time by this cost model, batch -> seconds (a StepCost; a simulated clock: the tokens are still
    computed) instead of the wall clock. policy: a scheduling policy object (the engine's seam) instead of the one
    the options name. A request's client and priority go with it (its priority only where the order reads one)."""
    clock = SkipClock() if step_cost is None else SimClock()
    engine = LLMEngine.from_model(model, tokenizer, EngineConfig(**options), clock=clock,
                                  **({"policy": policy} if policy is not None else {}))
    prioritised = getattr(engine.scheduler.order, "uses_priority", False)
    if step_cost is not None:
        if hasattr(step_cost, "bind"):                  # a cost that prices this engine's bytes (bench/capstone.py)
            step_cost.bind(engine)
        run = engine.runner.run

        def run_and_advance(batch, drafts):             # the model call takes the modelled time, not the wall's
            out = run(batch, drafts)
            clock.advance(step_cost(batch))
            return out
        engine.runner.run = run_and_advance
    pending = sorted(workload, key=lambda r: r.arrival)
    outs, i = [], 0
    while i < len(pending) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests() and i < len(pending):
            clock.skip_to(pending[i].arrival)        # idle: jump to the next arrival
        while i < len(pending) and pending[i].arrival <= clock():
            r = pending[i]
            engine.add_request(r.prompt_ids, SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True),
                               arrival_time=r.arrival, client=getattr(r, "client", None),
                               priority=getattr(r, "priority", 0) if prioritised else 0)
            i += 1
        ran = engine.trace.count
        engine.advance()
        if step_cost is not None and engine.trace.count == ran:    # no model call: on a simulated clock time
            clock.skip_to(_next_event(engine, pending[i:], clock()))   # would stand still; go to what comes next
        outs += engine.pop_finished()
    steps = engine.trace.steps
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) / (len(o.token_ids) - 1)
            for o in outs if len(o.token_ids) > 1]
    n_out = sum(len(c.token_ids) for o in outs for c in o.outputs)
    span = max(o.metrics.finished_time for o in outs) - min(r.arrival for r in workload)
    used = [s.kv_bytes_used for s in steps if s.kv_bytes_used]
    waste = float(np.mean([1 - s.kv_bytes_filled / s.kv_bytes_used for s in steps if s.kv_bytes_used])) if used else 0.0

    def pct(xs, q):
        return float(np.percentile(xs, q)) if xs else 0.0
    res = ServeResult(label, len(outs), n_out, span, n_out / span,
                      float(np.mean([s.num_prefill_tokens + s.num_decode_tokens for s in steps])),
                      pct(ttft, 50), pct(ttft, 99), pct(tpot, 50), pct(tpot, 99), waste,
                      max(len(s.seq_ids) for s in steps), sum(o.metrics.num_preemptions for o in outs),
                      sum(o.metrics.num_cached_tokens for o in outs))
    return (res, engine, outs) if return_engine else res


def _next_event(engine, to_come: list[Request], now: float) -> float:
    """When the scheduler will next have something to do: the next arrival, or the end of a dynamic batching
    window over the oldest waiting request (a little later than now if neither is ahead)."""
    events = [r.arrival for r in to_come[:1]]
    waiting = engine.scheduler.waiting
    if waiting and engine.config.batching == "dynamic":
        events.append(waiting[0].metrics.arrival_time + engine.config.batch_window_s)
    ahead = [t for t in events if t > now]
    return min(ahead) if ahead else now + 1e-3


def explorer_replay(model, tokenizer, workload: list[Request], max_model_len: int = 256, block_size: int = 16,
                    kv_sequences: float = 4.0, batching: str = "continuous", token_budget: int = 0):
    """One setting of notebook 05's serving explorer: replay `workload` on a fresh engine (wall clock) -> (its
    trace's steps, a line of its numbers). minillm.viz.serving_explorer calls it (through a partial) for every
    change of its controls and draws the steps; viz itself never runs a workload."""
    per_seq = max_model_len * model.config.kv_bytes_per_token(4)
    opts = dict(block_size=block_size, max_model_len=max_model_len, kv_cache_bytes=int(kv_sequences * per_seq),
                batching=batching, trace=True)
    if token_budget and batching == "continuous":       # chunked prefill is a continuous-batching policy
        opts.update(enable_chunked_prefill=True, max_num_batched_tokens=token_budget)
    res, engine, _ = replay(model, tokenizer, workload, batching, return_engine=True, **opts)
    line = (f"{res.throughput:.0f} tokens/s, TTFT p50 {res.ttft_p50 * 1e3:.0f} ms (wall clock), "
            f"KV waste {res.kv_waste:.1%}, peak {res.peak_running} sequences, {res.preemptions} preemptions")
    return engine.trace.steps, line
