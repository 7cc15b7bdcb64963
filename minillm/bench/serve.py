"""Replay a workload against the engine and measure it: `python -m minillm bench serve`.

Requests join at their arrival times on the engine's clock (a SkipClock: when nothing runs, time
jumps to the next arrival, so nothing sleeps). Reported per run: throughput, tokens per model step,
TTFT and TPOT (p50, p99), KV waste, peak concurrent sequences, preemptions, prefix-cache hits.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..config import EngineConfig
from ..core.sampling import SamplingParams
from ..engine.engine import LLMEngine
from ..formats.loader import load
from .step_cost import SimClock, StepCost
from .workload import Request, SkipClock, make_workload


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
           step_cost: StepCost | None = None, **options):
    """Serve `workload` on a fresh engine with these EngineConfig options -> ServeResult
    (with return_engine=True: (ServeResult, the engine, for its trace, and the finished RequestOutputs)).
    step_cost: time by this cost model (a simulated clock; the tokens are still computed) instead of the wall clock."""
    clock = SkipClock() if step_cost is None else SimClock()
    engine = LLMEngine.from_model(model, tokenizer, EngineConfig(**options), clock=clock)
    if step_cost is not None:
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
                               arrival_time=r.arrival)
            i += 1
        ran = engine.trace.count
        engine.step()
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


@dataclass
class RequestMemory:
    request_id: str
    tokens: int              # prompt + generated: what the cache must hold at the end
    allocated_bytes: int     # whole blocks reserved for it (block_size = max_model_len: the contiguous cache)
    used_bytes: int          # the slots holding its tokens

    @property
    def wasted_bytes(self) -> int:
        return self.allocated_bytes - self.used_bytes


def memory_by_request(outputs, block_size: int, bytes_per_token: int) -> list[RequestMemory]:
    """KV bytes each finished request held at its end (its peak), one sample per request: whole blocks
    reserved vs slots filled. The last token's K/V is never written (nothing reads it), so a sequence
    of n tokens fills n - 1 slots."""
    rows = []
    for o in outputs:
        n = len(o.prompt_token_ids) + len(o.outputs[0].token_ids) - 1
        blocks = -(-n // block_size)
        rows.append(RequestMemory(o.request_id, n, blocks * block_size * bytes_per_token, n * bytes_per_token))
    return rows


def bench_serve(model: str, tokenizer=None, n: int = 64, rate: float = 50.0, kv_cache_bytes: int | None = None,
                max_model_len: int | None = None, max_num_seqs: int = 64, prompt_median: float | None = None,
                output_median: float | None = None, simulated: bool = False) -> dict:
    """The same skewed workload under each setting, side by side in one process; ratios between them.
    Defaults: lengths scale with max_model_len (prompt median 15%, output median 12.5% of it, log-normal
    sigma 0.8, so at 1024 about ShareGPT's scale as the vLLM paper reports it: prompts ~160, outputs
    ~130 tokens, a tail to 512); the KV budget holds 16 full-length sequences (the contiguous cache's
    concurrency), so paged concurrency is bounded by max_num_seqs or by memory, whichever binds first; arrivals
    at `rate` per second saturate the engine, so throughput measures the policy, not the arrival rate.
    simulated: time every setting with one StepCost calibrated here first (bench/step_cost.py) instead of the
    wall clock, so a busy machine changes the scale of the numbers but not their ratios."""
    net, tok = load(model, tokenizer)
    L = max_model_len or net.config.max_seq_len
    kv = kv_cache_bytes or 16 * L * net.config.kv_bytes_per_token(4)
    pm, om = prompt_median or 0.15 * L, output_median or 0.125 * L
    lengths = dict(prompt_median=pm, prompt_sigma=0.8, output_median=om, output_sigma=0.8, max_len=L)
    wl = make_workload(n, net.config.vocab_size, rate=rate, seed=0, **lengths)
    shared = make_workload(n, net.config.vocab_size, rate=rate, shared_prefix=0.8, seed=1, **lengths)
    common = dict(max_model_len=L, kv_cache_bytes=kv, max_num_seqs=max_num_seqs)
    runs = [("continuous", wl, dict()), ("static", wl, dict(batching="static")),
            ("continuous, chunked prefill", wl, dict(enable_chunked_prefill=True, max_num_batched_tokens=256)),
            ("continuous, contiguous cache", wl, dict(block_size=L)),
            ("shared prefix, no caching", shared, dict()),
            ("shared prefix, prefix caching", shared, dict(enable_prefix_caching=True))]
    cost = StepCost.calibrate(net, tok) if simulated else None     # one cost model for every setting
    res = {label: replay(net, tok, w, label, step_cost=cost, **common, **opt).as_dict() for label, w, opt in runs}
    ratios = {"continuous / static throughput": res["continuous"]["throughput"] / res["static"]["throughput"],
              "paged KV waste (block 16)": res["continuous"]["kv_waste"],
              "contiguous KV waste": res["continuous, contiguous cache"]["kv_waste"],
              "paged / contiguous peak concurrency":
                  res["continuous"]["peak_running"] / max(1, res["continuous, contiguous cache"]["peak_running"]),
              "TTFT p50, no caching / prefix caching":
                  res["shared prefix, no caching"]["ttft_p50"] / res["shared prefix, prefix caching"]["ttft_p50"]}

    def mean(xs):
        return float(np.mean(xs))
    workload = {"prompt_tokens_mean": mean([len(r.prompt_ids) for r in wl]),
                "prompt_tokens_median": float(np.median([len(r.prompt_ids) for r in wl])),
                "output_tokens_mean": mean([r.max_tokens for r in wl]),
                "output_tokens_median": float(np.median([r.max_tokens for r in wl])),
                **lengths}
    return {"bench": "serve", "model": str(model), "clock": cost.describe() if cost else "wall",
            "requests": n, "rate": rate, "kv_cache_bytes": kv,
            "max_model_len": L, "max_num_seqs": max_num_seqs, "workload": workload, "runs": res, "ratios": ratios}
