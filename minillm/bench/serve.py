"""`python -m minillm bench serve`: one workload under several engine settings, side by side (each run a
replay, bench/replay.py), and the KV memory each finished request held (memory_by_request)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.loader import load
from ..workload import make_workload
from .replay import ServeResult, replay  # noqa: F401  (replay's home is bench/replay.py; imported from here too)
from .step_cost import StepCost


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
