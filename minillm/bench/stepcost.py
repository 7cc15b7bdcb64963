"""`python -m minillm bench stepcost`: is the simulated clock right? Its prediction beside the wall clock.

The serving lessons time their replays by StepCost (bench/step_cost.py), calibrated here first. This bench checks
it against the wall clock in the same run: (1) decode steps at batch 1, 4 and 16 (each row 48 tokens into its
sequence), the cost model's prediction beside the measured median of `repeats` steps; (2) notebook 05's workload
(16 requests, Poisson arrivals at the cost model's capacity, max_num_seqs 4) replayed with static and continuous
batching on the wall clock (the median of `runs` replays, interleaved) and on the simulated clock: the
continuous / static throughput ratio on each. Goals (issue 41): every step within 25%, the two ratios within 25%
of each other.
"""
from __future__ import annotations

import statistics
import time


def decode_medians(model, tok, batch_sizes, context: int = 48, repeats: int = 15) -> dict:
    """Measured median seconds of a decode step at each batch size (its own engine, warmed up)."""
    from ..config import EngineConfig
    from ..core.sampling import SamplingParams
    from ..engine.engine import LLMEngine
    out = {}
    engine = LLMEngine.from_model(model, tok, EngineConfig(max_model_len=256, max_num_seqs=max(batch_sizes)))
    for b in [batch_sizes[0], *batch_sizes]:                      # the first batch size twice: warm-up
        for i in range(b):
            engine.add_request([1] + [3 + (7 * i + j) % 4000 for j in range(context - 1)],
                               SamplingParams(temperature=0, max_tokens=repeats + 2, ignore_eos=True))
        engine.step()                                              # the prefill
        times = []
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
        engine.pop_finished()
        out[b] = statistics.median(times[:repeats])
    return out


def notebook05_workload(cost, tok):
    """Notebook 05's serving workload, built as it builds it (its capacity from the cost model)."""
    from ..workload import make_workload
    S, prompt_median, out_median = 4, 24, 6
    capacity = S / (cost.seconds(S, S * prompt_median) + out_median * cost.seconds(S, S))
    return make_workload(16, tok.vocab_size, rate=capacity, prompt_median=prompt_median, output_median=out_median,
                         output_sigma=1.0, max_len=256, seed=0)


def bench_stepcost(model="shakespeare", batch_sizes=(1, 4, 16), runs: int = 5, **options) -> dict:
    from ..formats.loader import load
    from .replay import replay
    from .step_cost import StepCost
    net, tok = load(model)
    cost = StepCost.calibrate(net, tok, **options)
    measured = decode_medians(net, tok, batch_sizes)
    steps = {b: {"measured_ms": measured[b] * 1e3, "predicted_ms": cost.seconds(b, b) * 1e3,
                 "error": cost.seconds(b, b) / measured[b] - 1} for b in batch_sizes}
    wl = notebook05_workload(cost, tok)
    common = dict(max_model_len=256, max_num_seqs=4, **options)
    modes = ("static", "continuous")
    wall = {m: [] for m in modes}
    replay(net, tok, wl[:2], **common)                              # warm-up
    for _ in range(runs):                                           # interleaved: the machine's drift hits both
        for m in modes:
            wall[m].append(replay(net, tok, wl, batching=m, **common).throughput)
    sim = {m: replay(net, tok, wl, batching=m, step_cost=cost, **common).throughput for m in modes}
    ratio_wall = statistics.median(wall["continuous"]) / statistics.median(wall["static"])
    ratio_sim = sim["continuous"] / sim["static"]
    return {"cost": cost.describe(), "steps": steps,
            "throughput_wall": {m: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                                for m, v in wall.items()},
            "throughput_simulated": sim, "continuous_over_static_wall": ratio_wall,
            "continuous_over_static_simulated": ratio_sim, "ratio_agreement": ratio_sim / ratio_wall - 1}


def add_parser(sub):
    """`bench stepcost`: its options, and run_cli to run it."""
    p = sub.add_parser("stepcost", help="the simulated clock's step cost against the wall clock (batch 1, 4, 16; "
                                        "notebook 05's continuous / static ratio)")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--runs", type=int, default=5, help="wall-clock replays of each batching mode (median)")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    res = bench_stepcost(a.model, runs=a.runs)
    print(f"cost model: {res['cost']}")
    for b, s in res["steps"].items():
        print(f"decode step, batch {b:>2}: measured {s['measured_ms']:6.3f} ms, predicted {s['predicted_ms']:6.3f} ms "
              f"({s['error']:+.0%})")
    w, sim = res["throughput_wall"], res["throughput_simulated"]
    for m in w:
        print(f"{m:<10} wall clock {w[m]['median']:6.0f} tok/s (min {w[m]['min']:.0f}, max {w[m]['max']:.0f}); "
              f"simulated {sim[m]:6.0f} tok/s")
    print(f"continuous / static: wall clock {res['continuous_over_static_wall']:.2f}x, simulated "
          f"{res['continuous_over_static_simulated']:.2f}x ({res['ratio_agreement']:+.0%})")
    return res
