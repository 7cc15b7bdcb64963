"""`python -m minillm bench sched`: the scheduling orders (EngineConfig.scheduling_policy, minillm.scheduling.orders)
on one heavy-tailed trace at a stated utilisation, then two traces that need their own setting: a flooding client
(fairness) and multi-turn chats (the cache-aware order and the radix tree).

Utilisation is stated against the engine's capacity on this machine's cost model: a full batch's decode step shared
by its max_num_seqs requests, plus each request's prompt (capacity_rps). max_num_seqs is small (2 by default: two
seats, so that a couple of long requests hold every one of them: head-of-line blocking, the regime where the order
matters; with many seats a CPU engine shares its steps like a processor-sharing server, which no heavy tail upsets).
The same requests then arrive as a Poisson process at `utilisation` times that rate. Every order serves the same
tokens, so the throughput is the same, and what changes is who waits. A heavy tail makes one trace's mean JCT hang
on a few long requests, so the headline ratio is repeated on more traces (`seeds`) and their median reported.

Metrics per order: job completion time (JCT: arrival to last token) mean and p99, TTFT and TPOT p50/p99, goodput
under an SLO (DistServe, Zhong et al. 2024: requests per second that meet BOTH the TTFT and the TPOT target; the
targets are multiples of a full batch's decode step on this machine's cost model, stated in the output), and each
client's share of the service (VTC's measure: w_p per prompt token + w_q per output token) while every client sends.

Clocks: the simulated clock (bench/step_cost.py: the shakespeare model's step cost, calibrated here first) prices
every step; the tokens themselves are computed by a small stand-in model (random:tiny), since with ignore_eos the
schedule does not depend on their values, only on lengths. Then the main comparison is run for real: the model
itself on the wall clock, at the same arrival rate. Preemption swaps (FastServe moves a preempted job's KV cache to
host memory; recomputing it would charge the size-based orders a second prefill per preemption).
"""
from __future__ import annotations

import numpy as np

from ..core.block_manager import BlockManager
from ..core.sampling import SamplingParams
from ..core.sequence import Sequence
from ..formats.loader import load, random_model
from ..scheduling.radix import RadixTree
from ..workload import at_rate, by_request, heavy_tailed, merge, multi_turn_chat, pct, sched_metrics  # noqa: F401
from .replay import replay
from .step_cost import StepCost

ORDERS_COMPARED = ("fcfs", "sjf", "priority", "mlfq", "fair")
W_P, W_Q = 1.0, 2.0                  # VTC's service weights (minillm.scheduling.orders.VirtualTokenCounter)


def client_shares(outs, workload, w_p: float = W_P, w_q: float = W_Q) -> dict:
    """Each client's share of the service delivered while every client was still sending (from the last client's
    first arrival to the first client's last arrival): w_p per prompt token at its first token, w_q per output
    token when it came (VTC's measure of service)."""
    pairs = by_request(outs, workload)
    clients = sorted({r.client for r, _ in pairs}, key=str)
    first = max(min(r.arrival for r, _ in pairs if r.client == c) for c in clients)
    last = min(max(r.arrival for r, _ in pairs if r.client == c) for c in clients)
    served = dict.fromkeys(clients, 0.0)
    for r, o in pairs:
        times = o.metrics.token_times
        served[r.client] += w_p * len(r.prompt_ids) * (first <= times[0] <= last)
        served[r.client] += w_q * sum(1 for t in times if first <= t <= last)
    total = sum(served.values()) or 1.0
    return {str(c): served[c] / total for c in clients}


def prefix_hit_rates(workload, capacity_tokens: int, block_size: int) -> dict:
    """The two prefix-cache structures on one trace, requests one after another with the same capacity: the block
    manager's hash chain (whole blocks only) and a radix tree (any token). -> the share of prompt tokens found."""
    bm = BlockManager(capacity_tokens // block_size, block_size, enable_prefix_caching=True)
    tree = RadixTree(capacity_tokens)
    hits = {"block hashes": 0, "radix tree": 0}
    params = SamplingParams(max_tokens=1)
    for i, r in enumerate(workload):
        seq = Sequence(i, str(i), 0, r.prompt_ids, params, 0, 0.0)
        if -(-len(seq) // block_size) <= bm.num_blocks:
            hits["block hashes"] += bm.allocate_prompt(seq)
            seq.num_computed = len(seq)
            bm.mark_computed(seq)
            bm.free_seq(seq)
        hits["radix tree"] += tree.match(r.prompt_ids[:-1])           # the last token is always computed
        tree.insert(r.prompt_ids)
    total = sum(len(r.prompt_ids) for r in workload)
    return {k: v / total for k, v in hits.items()}


# ---------------------------------------------------------------------------- the bench
def capacity_rps(workload, cost: StepCost, max_num_seqs: int) -> float:
    """Requests per second the engine serves at full batch on this cost model: each request's prompt tokens, plus
    its output tokens at one decode step of a full batch shared by max_num_seqs requests."""
    prompt = float(np.mean([len(r.prompt_ids) for r in workload]))
    output = float(np.mean([r.max_tokens for r in workload]))
    return 1.0 / (prompt * cost.token_s + output * cost.seconds(max_num_seqs, max_num_seqs) / max_num_seqs)


def main_trace(n: int, vocab: int, max_len: int, seed: int = 0, alpha: float = 0.8, output_hi: int = 400) -> list:
    """bench sched's heavy-tailed trace (arrivals at 1/s: scale them with workload.at_rate): two clients (A sends
    3 requests for B's 1), one request in 5 urgent (priority 0, the rest 1), short prompts, bounded-Pareto outputs."""
    a = heavy_tailed(n * 3 // 4, vocab, 1.0, prompt_median=8, output_lo=2, output_hi=output_hi, alpha=alpha,
                     max_len=max_len, client="A", priorities=(0, 1, 1, 1, 1), seed=seed)
    b = heavy_tailed(n - n * 3 // 4, vocab, 1.0 / 3, prompt_median=8, output_lo=2, output_hi=output_hi, alpha=alpha,
                     max_len=max_len, client="B", priorities=(0, 1, 1, 1, 1), seed=seed + 1)
    return merge(a, b)


def mean_jct(outs) -> float:
    return float(np.mean([o.metrics.finished_time - o.metrics.arrival_time for o in outs]))


def bench_sched(model: str = "shakespeare", tokenizer=None, n: int = 300, utilisation: float = 0.85,
                max_num_seqs: int = 2, seeds: int = 3, real: bool = True, quick: bool = False, seed: int = 0) -> dict:
    """The comparisons; quick: fewer requests and one trace (a smoke test under 15 s)."""
    net, tok = load(model, tokenizer)
    L = net.config.max_seq_len
    cost = StepCost.calibrate(net, tok)
    stand_in = random_model("tiny", max_seq_len=L)
    V = min(stand_in[0].config.vocab_size, net.config.vocab_size)
    per_token = stand_in[0].config.kv_bytes_per_token(4)
    common = dict(max_model_len=L, max_num_seqs=max_num_seqs, preemption_mode="swap", swap_bytes=per_token * L * 64)
    step = cost.seconds(max_num_seqs, max_num_seqs)                    # one decode step of a full batch
    slo = {"ttft_s": 25 * step, "tpot_s": 3 * step, "definition": "TTFT <= 25 and TPOT <= 3 full-batch decode steps"}

    # 1. one heavy-tailed trace at the utilisation, every order
    n_main = 32 if quick else n
    base = main_trace(n_main, V, L, seed)
    capacity = capacity_rps(base, cost, max_num_seqs)
    trace = at_rate(base, utilisation * capacity)
    runs = {}
    for name in ORDERS_COMPARED:
        _, _, outs = replay(*stand_in, trace, name, return_engine=True, step_cost=cost, scheduling_policy=name,
                            **common)
        runs[name] = {**sched_metrics(outs, trace, slo["ttft_s"], slo["tpot_s"]),
                      "client_share": client_shares(outs, trace)}
    fcfs = runs["fcfs"]["jct_mean"]
    ratios = {f"mean JCT fcfs / {k}": fcfs / runs[k]["jct_mean"] for k in ("sjf", "mlfq")}
    by_seed = {k: [v] for k, v in ratios.items()}
    for s in range(1, 1 if quick else seeds):                          # the same workload, other draws
        other = main_trace(n_main, V, L, seed + 10 * s)
        other = at_rate(other, utilisation * capacity_rps(other, cost, max_num_seqs))
        jct = {name: mean_jct(replay(*stand_in, other, name, return_engine=True, step_cost=cost,
                                     scheduling_policy=name, **common)[2]) for name in ("fcfs", "sjf", "mlfq")}
        for k in ("sjf", "mlfq"):
            by_seed[f"mean JCT fcfs / {k}"].append(jct["fcfs"] / jct[k])

    # 2. fairness: client A floods (3x B's requests; together 3x what the engine serves, so B alone asks for more
    # than half of it and both stay backlogged: a fair order splits the service evenly), lighter-tailed lengths
    # (VTC orders admissions; it does not preempt, so a heavy tail would hand whole seats to whoever got them first)
    n_fair = 32 if quick else 160
    fair_a = heavy_tailed(n_fair * 3 // 4, V, 1.0, alpha=1.5, output_hi=64, max_len=L, client="A", seed=seed + 2)
    fair_b = heavy_tailed(n_fair // 4, V, 1.0 / 3, alpha=1.5, output_hi=64, max_len=L, client="B", seed=seed + 3)
    flood = merge(fair_a, fair_b)
    flood = at_rate(flood, 3 * capacity_rps(flood, cost, max_num_seqs))
    fairness = {}
    for name in ("fcfs", "fair"):
        _, _, outs = replay(*stand_in, flood, name, return_engine=True, step_cost=cost, scheduling_policy=name,
                            **common)
        fairness[name] = {"client_share": client_shares(outs, flood),
                          "jct_mean_by_client": {c: mean_jct([o for r, o in by_request(outs, flood) if r.client == c])
                                                 for c in ("A", "B")}}

    # 3. multi-turn chats: a pool holding a few conversations' context, fcfs against lpm; then the two structures
    chats = multi_turn_chat(6 if quick else 48, 4, V, rate=40.0, think_s=0.3, max_len=L, seed=seed)
    pool_tokens = 1024
    cache = dict(common, max_num_seqs=8, enable_prefix_caching=True, kv_cache_bytes=pool_tokens * per_token)
    prompt_tokens = sum(len(r.prompt_ids) for r in chats)
    prefix = {"requests": len(chats), "pool_tokens": pool_tokens, "engine": {}}
    for name in ("fcfs", "lpm"):
        res = replay(*stand_in, chats, name, step_cost=cost, scheduling_policy=name, **cache)
        prefix["engine"][name] = {"hit_rate": res.cached_tokens / prompt_tokens, "throughput": res.throughput,
                                  "ttft_p50": res.ttft_p50}
    prefix["structures"] = prefix_hit_rates(chats, pool_tokens, 16)

    # 4. for real: the model itself on the wall clock, the same arrival rate
    real_runs = {}
    if real:
        trace_real = trace[:8] if quick else trace
        for name in ("fcfs", "mlfq") if quick else ("fcfs", "sjf", "mlfq"):
            _, _, outs = replay(net, tok, trace_real, name, return_engine=True, scheduling_policy=name, **common)
            real_runs[name] = sched_metrics(outs, trace_real, slo["ttft_s"], slo["tpot_s"])
    lens = [r.max_tokens for r in trace]
    return {"bench": "sched", "model": str(model), "clock": cost.describe(), "stand_in": "random:tiny",
            "max_num_seqs": max_num_seqs, "capacity_rps": capacity, "utilisation": utilisation,
            "rate_rps": utilisation * capacity, "requests": len(trace), "slo": slo,
            "workload": {"output_alpha": 0.8, "output_hi": 400, "output_mean": float(np.mean(lens)),
                         "output_median": float(np.median(lens)), "output_max": int(max(lens)),
                         "prompt_mean": float(np.mean([len(r.prompt_ids) for r in trace]))},
            "runs": runs, "ratios": ratios, "ratios_by_seed": by_seed,
            "ratios_median": {k: float(np.median(v)) for k, v in by_seed.items()},
            "fairness": fairness, "prefix": prefix, "real": real_runs}


COLUMNS = [("jct_mean", "JCT mean", 1e3, ".0f"), ("jct_p99", "JCT p99", 1e3, ".0f"), ("ttft_p50", "TTFT50", 1e3, ".0f"),
           ("ttft_p99", "TTFT99", 1e3, ".0f"), ("tpot_p99", "TPOT99", 1e3, ".1f"), ("goodput", "goodput", 1, ".1f"),
           ("throughput", "tok/s", 1, ".0f"), ("preemptions", "preempt", 1, ".0f")]


def print_table(res: dict):
    w = res["workload"]
    print(f"{res['requests']} requests, outputs bounded Pareto (alpha {w['output_alpha']}, median "
          f"{w['output_median']:.0f}, mean {w['output_mean']:.0f}, max {w['output_max']}), prompts ~"
          f"{w['prompt_mean']:.0f} tokens; max_num_seqs {res['max_num_seqs']}; capacity {res['capacity_rps']:.1f} "
          f"req/s, arrivals at {res['utilisation']:.0%} of it ({res['rate_rps']:.1f} req/s)")
    print(f"simulated clock: {res['clock']}; tokens by a stand-in ({res['stand_in']}); SLO: {res['slo']['definition']}"
          f" ({res['slo']['ttft_s'] * 1e3:.0f} ms, {res['slo']['tpot_s'] * 1e3:.1f} ms)")
    for title, runs in (("simulated clock", res["runs"]), ("wall clock (the model itself)", res["real"])):
        if not runs:
            continue
        print(f"-- {title}; times in ms, goodput in requests/s meeting the SLO")
        print(f"{'order':<10}" + "".join(f"{h:>10}" for _, h, _, _ in COLUMNS))
        for name, r in runs.items():
            print(f"{name:<10}" + "".join(f"{r[k] * s:>10{f}}" for k, _, s, f in COLUMNS))
    for k, v in res["ratios"].items():
        seeds = res["ratios_by_seed"][k]
        print(f"{k}: {v:.2f}x" + (f" (on {len(seeds)} traces: " + ", ".join(f"{x:.2f}" for x in seeds) +
                                  f"; median {res['ratios_median'][k]:.2f}x)" if len(seeds) > 1 else ""))
    urgent = {k: r["jct_mean_by_priority"].get("0", 0.0) * 1e3 for k, r in res["runs"].items()}
    print("mean JCT of the urgent class (priority 0): " + ", ".join(f"{k} {v:.0f} ms" for k, v in urgent.items()))
    for name, f in res["fairness"].items():
        jct = f["jct_mean_by_client"]
        print(f"flooding client A (3x B's requests, together 3x capacity) under {name}: service share A "
              f"{f['client_share']['A']:.0%}, B {f['client_share']['B']:.0%}; mean JCT A {jct['A'] * 1e3:.0f} ms, "
              f"B {jct['B'] * 1e3:.0f} ms")
    p = res["prefix"]
    print(f"multi-turn chats ({p['requests']} requests, KV pool {p['pool_tokens']} tokens): prefix-cache hit rate "
          + ", ".join(f"{k} {v['hit_rate']:.0%} ({v['throughput']:.0f} tok/s)" for k, v in p["engine"].items())
          + "; one request at a time: " + ", ".join(f"{k} {v:.0%}" for k, v in p["structures"].items()))
