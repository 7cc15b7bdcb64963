"""Replay a workload against the engine and measure it: `python -m minillm bench serve`.

Requests join at their arrival times on the engine's clock (a SkipClock: when nothing runs, time
jumps to the next arrival, so nothing sleeps). Reported per run: throughput, tokens per model step,
TTFT and TPOT (p50, p99), KV waste, peak concurrent sequences, preemptions, prefix-cache hits.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .config import EngineConfig
from .engine import LLMEngine
from .sampling import SamplingParams
from .workload import Request, SkipClock


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


def replay(model, tokenizer, workload: list[Request], label: str = "", return_engine: bool = False, **options):
    """Serve `workload` on a fresh engine with these EngineConfig options -> ServeResult
    (with return_engine=True: (ServeResult, the engine, for its trace, and the finished RequestOutputs))."""
    clock = SkipClock()
    engine = LLMEngine.from_model(model, tokenizer, EngineConfig(**options), clock=clock)
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
        engine.step()
        outs += engine.pop_finished()
    steps = engine.trace.steps
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) / (len(o.token_ids) - 1)
            for o in outs if len(o.token_ids) > 1]
    n_out = sum(len(c.token_ids) for o in outs for c in o.outputs)
    span = max(o.metrics.finished_time for o in outs) - min(r.arrival for r in workload)
    used = [s.kv_bytes_used for s in steps if s.kv_bytes_used]
    waste = float(np.mean([1 - s.kv_bytes_filled / s.kv_bytes_used for s in steps if s.kv_bytes_used])) if used else 0.0
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else 0.0
    res = ServeResult(label, len(outs), n_out, span, n_out / span,
                      float(np.mean([s.num_prefill_tokens + s.num_decode_tokens for s in steps])),
                      pct(ttft, 50), pct(ttft, 99), pct(tpot, 50), pct(tpot, 99), waste,
                      max(len(s.seq_ids) for s in steps), sum(o.metrics.num_preemptions for o in outs),
                      sum(o.metrics.num_cached_tokens for o in outs))
    return (res, engine, outs) if return_engine else res


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
