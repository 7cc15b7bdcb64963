"""Checkers for notebook 05_batching."""
from __future__ import annotations

from .common import checker


def _engine_static_steps(lengths, max_num_seqs) -> int:
    """Model calls the engine makes to serve these output lengths under static batching, all arriving at once."""
    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    llm = LLM("random:tiny", batching="static", max_num_seqs=max_num_seqs, max_model_len=64)
    llm.generate([[1, 300 + i] for i in range(len(lengths))],
                 [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths])
    return len(llm.engine.trace.steps)


@checker
def check_static_steps(fn):
    """fn(output_lengths: list[int], max_num_seqs) -> model calls to serve them with static batching"""
    for lengths, B in [([3, 1, 7, 2], 2), ([5], 4), ([1, 1, 9, 2, 4], 3), ([4, 4, 4], 1)]:
        want = _engine_static_steps(lengths, B)
        got = fn(list(lengths), B)
        assert got == want, f"lengths {lengths}, max_num_seqs {B}: got {got}, the engine made {want} model calls"
    return "matches the engine: each batch of max_num_seqs runs as long as its longest request"


@checker
def check_latency_metrics(fn):
    """fn(arrival_time, token_times: list) -> (ttft, tpot); tpot is None for a single token"""
    cases = [(0.5, [0.9, 1.0, 1.2, 1.3]), (2.0, [2.25]), (0.0, [0.1, 0.4])]
    for arrival, times in cases:
        ttft, tpot = fn(arrival, list(times))
        want_tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        assert abs(ttft - (times[0] - arrival)) < 1e-12, \
            f"arrival {arrival}, tokens at {times}: TTFT {ttft}, expected {times[0] - arrival}"
        assert (tpot is None) == (want_tpot is None) and (tpot is None or abs(tpot - want_tpot) < 1e-12), \
            f"tokens at {times}: TPOT {tpot}, expected {want_tpot}"
    return "TTFT = first token - arrival; TPOT = mean gap between later tokens (as minillm.bench.serve)"
