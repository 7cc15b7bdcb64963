"""`python -m minillm bench cluster`: data-parallel routing policies, and prefill/decode disaggregation against
colocated engines, on the simulated clock (then, without --quick, for real in separate processes).

Clocks: the simulated clock (minillm.bench.step_cost: the model's step cost, calibrated here first) prices every
step of every engine, each engine on its own clock (minillm.cluster.replica); the tokens are computed by a small
stand-in model (random:tiny with one layer), since with ignore_eos the schedule depends on lengths only, not on the
tokens' values. Workloads are sized from the cost model (utilisation targets), so they keep their meaning on another
machine's scale.

1. Router (router_table): a trace of several system prompts x many users (system_prompt_workload), Poisson arrivals
   at `utilisation` of what the replicas serve without any prefix hit; every replica has prefix caching and a KV
   pool holding a few of the system prompts, not all. Per policy: throughput, TTFT / TPOT p50 p99, prefix-cache hit
   rate, requests per replica, and how the prefix-aware router decided.
2. Disaggregation (disagg_comparison): two colocated engines behind a least-loaded router (each runs prefills and
   decodes; also with chunked prefill, Sarathi's other answer to the same stall) against one prefill engine + one
   decode engine: the same engines, the same total KV memory, the same trace. Two traces, made to show each side:
     "long prompts interrupt decodes": short chats decoding while long prompts arrive; colocated, a long prefill
       stalls every decode of its engine for its whole step (the TPOT tail); disaggregated, the decode engine never
       runs a prompt. Disaggregation should win on TPOT p99.
     "short prompts, decode heavy": the prefill engine has little to do, the decode engine carries every decode
       (twice the rows per step of a colocated engine, and on a CPU a step's cost grows with its rows), and each
       request waits for its handover. Disaggregation should lose.
   Goodput: requests per second meeting both SLO limits (DistServe's measure), limits derived from the cost model
   and stated. The handover's bytes (formula == counted) and its copy time in one process are measured on the model
   itself; without --quick, the pair also runs as two processes with the K/V sent over a pipe, timed per handover.
"""
from __future__ import annotations

import numpy as np

from ..cluster.data_parallel import replay_routed, routed_metrics
from ..cluster.disagg_sim import Link, replay_disagg, timelines
from ..cluster.router import ROUTING_POLICIES
from ..config import EngineConfig
from ..engine.engine import LLMEngine
from ..formats.loader import load, random_model
from ..workload import Request, sched_metrics
from .step_cost import StepCost

ASSUMED_LINK = Link(50e-6, 2e9, "assumed: a pipe between two processes of one machine")


def stand_in(max_len: int):
    """The model that computes the simulated runs' tokens: random:tiny with one layer."""
    return random_model("tiny", max_seq_len=max_len, n_layers=1)


def _tokens(rng, vocab: int, n: int) -> list:
    return rng.integers(259, vocab, size=n).tolist()          # ordinary (non-byte, non-special) tokens


# ---------------------------------------------------------------------------- workloads
def system_prompt_workload(n: int, vocab: int, rate: float, num_prompts: int = 8, system_len: int = 256,
                           user_median: float = 24, output_median: float = 32, seed: int = 0) -> list:
    """n users' requests, Poisson arrivals at `rate` per second: each picks one of num_prompts system prompts
    (system_len tokens, BOS first) uniformly and adds its own question (log-normal, median user_median) and wants
    about output_median tokens (log-normal, sigma 0.5)."""
    rng = np.random.default_rng(seed)
    prompts = [[1] + _tokens(rng, vocab, system_len - 1) for _ in range(num_prompts)]
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    users = np.clip(np.round(rng.lognormal(np.log(user_median), 0.5, n)), 2, 4 * user_median).astype(int)
    outs = np.clip(np.round(rng.lognormal(np.log(output_median), 0.5, n)), 1, 4 * output_median).astype(int)
    return [Request(float(t), prompts[rng.integers(num_prompts)] + _tokens(rng, vocab, int(u)), int(o))
            for t, u, o in zip(arrivals, users, outs)]


def mixed_workload(n: int, vocab: int, classes: list, max_len: int = 1024, seed: int = 0) -> list:
    """Poisson arrivals of several classes merged: classes = [(rate per second, prompt tokens, output tokens)], each
    request's lengths drawn within +-20% of its class's (the prompt cut to leave room for the output in max_len)."""
    rng = np.random.default_rng(seed)
    total = sum(c[0] for c in classes)
    arrivals = np.cumsum(rng.exponential(1.0 / total, n))
    which = rng.choice(len(classes), n, p=[c[0] / total for c in classes])
    reqs = []
    for t, k in zip(arrivals, which):
        _, p, o = classes[k]
        o = max(2, int(o * rng.uniform(0.8, 1.2)))
        p = min(max(2, int(p * rng.uniform(0.8, 1.2))), max_len - o)
        reqs.append(Request(float(t), [1] + _tokens(rng, vocab, p - 1), o))
    return reqs


def disagg_workloads(n: int, vocab: int, cost: StepCost, max_len: int, quick: bool = False) -> dict:
    """The two traces, their rates set from the cost model: a decode token costs at most a one-row step,
    cost.seconds(1, 1) (on a CPU a step's cost grows with its rows), a long prompt cost.seconds(1, its tokens).
    quick: the decode-heavy outputs a quarter as long. -> {name: trace}."""
    decode_s, long_len = cost.seconds(1, 1), int(0.8 * max_len)
    heavy_out = 32 if quick else 128
    interrupt = [(0.15 / (16 * decode_s), 16, 16),              # short chats: 15% of one engine's decode time
                 (0.4 / cost.seconds(1, long_len), long_len, 4)]   # long prompts: 40% of one engine's prefill time
    heavy = [(0.9 / (heavy_out * decode_s), 16, heavy_out)]      # decode heavy: 90% of one engine's decode time
    return {"long prompts interrupt decodes": mixed_workload(n, vocab, interrupt, max_len, seed=1),
            "short prompts, decode heavy": mixed_workload(n, vocab, heavy, max_len, seed=2)}


# ---------------------------------------------------------------------------- 1. the router
def router_table(model="shakespeare", tokenizer=None, n: int = 160, num_replicas: int = 4, utilisation: float = 0.9,
                 cost: StepCost = None, policies=ROUTING_POLICIES, quick: bool = False, real: bool = False) -> dict:
    """Every routing policy on one shared-prefix trace (simulated clock); real=True also runs round_robin and
    prefix_aware as processes on the wall clock (the model itself, 2 replicas, a short trace). One call: the
    notebook's router comparison table."""
    net, tok = load(model, tokenizer)
    cost = cost or StepCost.calibrate(net, tok, backend="torch")
    n, num_replicas, output = (24, 2, 12) if quick else (n, num_replicas, 32)
    system_len, user, max_num_seqs = 256, 24, 8
    pool_tokens = 1536                     # per replica: a few of the 8 system prompts beside its running requests
    L = 512
    sim_net, sim_tok = stand_in(L)
    V = min(sim_net.config.vocab_size, net.config.vocab_size)
    per_request = cost.token_s * (system_len + user) + output * cost.seconds(1, 1)   # no prefix hit
    rate = utilisation * num_replicas / per_request
    trace = system_prompt_workload(n, V, rate, 8, system_len, user, output)
    options = dict(max_model_len=L, max_num_seqs=max_num_seqs, enable_prefix_caching=True, backend="torch",
                   kv_cache_bytes=pool_tokens * sim_net.config.kv_bytes_per_token(4))
    rows = {}
    for policy in policies:
        run = replay_routed(sim_net, sim_tok, trace, policy, num_replicas, cost, **options)
        rows[policy] = routed_metrics(run)
    res = {"clock": cost.describe(), "stand_in": "random:tiny, 1 layer", "replicas": num_replicas,
           "requests": len(trace), "rate_rps": rate, "utilisation": utilisation,
           "workload": {"system_prompts": 8, "system_len": system_len, "user_median": user,
                        "output_median": output, "pool_tokens_per_replica": pool_tokens,
                        "max_num_seqs": max_num_seqs},
           "load_measure": "outstanding requests per replica (routed, not finished), as SGLang's router counts",
           "runs": rows, "real": {}}
    if real:
        res["real"] = _router_real(model, tokenizer, net, cost)
    return res


def _router_real(model, tokenizer, net, cost: StepCost) -> dict:
    """round_robin and prefix_aware for real: 2 replica processes of the model itself, 24 requests."""
    from ..cluster.processes import replay_routed_processes
    system_len, user, output = 128, 16, 16
    per_request = cost.token_s * (system_len + user) + output * cost.seconds(1, 1)
    trace = system_prompt_workload(24, net.config.vocab_size, 0.9 * 2 / per_request, 4, system_len, user, output,
                                   seed=3)
    bpt = net.config.kv_bytes_per_token(4)
    options = dict(max_model_len=256, max_num_seqs=8, enable_prefix_caching=True, kv_cache_bytes=640 * bpt)
    return {policy: routed_metrics(replay_routed_processes(model, tokenizer, trace, policy, 2, **options))
            for policy in ("round_robin", "prefix_aware")}


# ---------------------------------------------------------------------------- 2. disaggregation
def measure_handover(model="shakespeare", tokenizer=None, prompt_lens=(64, 256, 512), repeats: int = 3) -> dict:
    """The model itself, one process: each prompt prefilled by one engine and handed to another (DisaggregatedEngine).
    Per prompt: blocks, bytes counted, bytes by the formula (blocks x block bytes), and the copy's seconds (gather out
    + write in; median of `repeats`)."""
    from ..cluster.disagg import DisaggregatedEngine
    from ..cluster.kv_transfer import block_bytes
    from ..cluster.replica import trace_params
    net, tok = load(model, tokenizer)
    opts = EngineConfig(max_model_len=max(prompt_lens) + 8, max_num_seqs=4, backend="torch")
    rows = []
    for p in prompt_lens:
        copies = []
        for _ in range(repeats):
            pair = DisaggregatedEngine(LLMEngine.from_model(net, tok, opts), LLMEngine.from_model(net, tok, opts))
            pair.generate([[1] + list(range(300, 300 + p - 1))], trace_params(2))
            copies.append(pair.handovers[0].copy_s)
        h = pair.handovers[0]
        rows.append({"prompt_tokens": p, "blocks": h.blocks, "bytes": h.bytes,
                     "formula_bytes": h.blocks * block_bytes(pair.prefill), "copy_s": float(np.median(copies)),
                     "copy_gb_s": h.bytes / float(np.median(copies)) / 1e9})
    return {"block_bytes": block_bytes(pair.prefill), "block_size": opts.block_size, "rows": rows}


def _reason(colocated_run, disagg_run) -> str:
    """Why, from the engines' traces (simulated seconds): the longest step a decode could wait through, colocated
    (a prefill on its engine) and disaggregated (the decode engine's own), the rows per decode step, and how busy
    each disaggregated engine was."""
    def rows(engines):
        r = [len(s.seq_ids) for e in engines for s in e.trace.steps if s.kind == "decode"]
        return float(np.mean(r)) if r else 0.0

    def longest(engines, kind):
        return max((s.seconds for e in engines for s in e.trace.steps if s.kind == kind), default=0.0)
    decode = disagg_run.engines["decode"]
    span = max(o.metrics.finished_time for o in disagg_run.outputs) - disagg_run.workload[0].arrival
    busy = {k: v / span for k, v in disagg_run.busy_s.items()}
    stall = longest(colocated_run.engines, "prefill")
    return (f"colocated, the longest prefill step a decode waits through is {stall * 1e3:.0f} ms and a decode step "
            f"has {rows(colocated_run.engines):.1f} rows; disaggregated, the decode "
            f"engine never prefills (its longest step {longest([decode], 'decode') * 1e3:.0f} ms) but holds every "
            f"decode: {rows([decode]):.1f} rows per step; prefill engine busy {busy['prefill']:.0%}, decode engine "
            f"{busy['decode']:.0%}")


def disagg_comparison(model="shakespeare", tokenizer=None, n: int = 120, cost: StepCost = None, link: Link = None,
                      quick: bool = False, real: bool = False, timeline_requests: int = 12) -> dict:
    """Colocated (2 engines, least loaded; and with chunked prefill) against 1 prefill + 1 decode engine (and with a
    chunked-prefill prefill engine) on the two traces, simulated clock. One call: the notebook's comparison, with
    per-request timelines (the first timeline_requests requests of each trace, colocated and disaggregated).
    quick: 12 requests per trace, no chunked variants."""
    net, tok = load(model, tokenizer)
    cost = cost or StepCost.calibrate(net, tok, backend="torch")
    link = link or ASSUMED_LINK
    n, L = (12 if quick else n), net.config.max_seq_len
    sim_net, sim_tok = stand_in(L)
    V = min(sim_net.config.vocab_size, net.config.vocab_size)
    block_size, pool_tokens = 16, 8 * L
    options = dict(max_model_len=L, max_num_seqs=32, backend="torch", block_size=block_size,
                   kv_cache_bytes=pool_tokens * sim_net.config.kv_bytes_per_token(4))
    chunked = dict(enable_chunked_prefill=True, max_num_batched_tokens=64)
    link_block = block_size * net.config.kv_bytes_per_token(4)      # the link carries the real model's blocks
    out = {"clock": cost.describe(), "link": link.describe(), "stand_in": "random:tiny, 1 layer",
           "engines": "colocated: 2 engines, each prefill + decode, behind a least-loaded router; disaggregated: "
                      f"1 prefill + 1 decode engine; every engine a KV pool of {pool_tokens} tokens, max_num_seqs 32; "
                      "chunked prefill: 64 tokens per step",
           "workloads": {}}
    for name, trace in disagg_workloads(n, V, cost, L, quick).items():
        slo = {"ttft_s": 2 * cost.seconds(1, max(len(r.prompt_ids) for r in trace)), "tpot_s": 5 * cost.seconds(1, 1),
               "definition": "TTFT <= 2 x the longest prompt's prefill step, TPOT <= 5 one-row decode steps"}
        runs = {"colocated": replay_routed(sim_net, sim_tok, trace, "least_loaded", 2, cost, **options)}
        if not quick:
            runs["colocated, chunked prefill"] = replay_routed(sim_net, sim_tok, trace, "least_loaded", 2, cost,
                                                               **options, **chunked)
        runs["disaggregated"] = replay_disagg(sim_net, sim_tok, trace, cost, link, link_block_bytes=link_block,
                                              **options)
        if not quick:
            runs["disaggregated, chunked prefill engine"] = replay_disagg(
                sim_net, sim_tok, trace, cost, link, prefill_options=chunked, link_block_bytes=link_block, **options)
        metrics = {k: sched_metrics(r.outputs, r.workload, slo["ttft_s"], slo["tpot_s"]) for k, r in runs.items()}
        colo, dis = runs["colocated"], runs["disaggregated"]
        out["workloads"][name] = {
            "requests": len(trace), "slo": slo,
            "prompt_mean": float(np.mean([len(r.prompt_ids) for r in trace])),
            "output_mean": float(np.mean([r.max_tokens for r in trace])),
            "runs": metrics,
            "verdict": "wins" if metrics["disaggregated"]["tpot_p99"] < metrics["colocated"]["tpot_p99"] else "loses",
            "reason": _reason(colo, dis),
            "handover_bytes_modelled": sum(h.blocks for h in dis.handovers) * link_block,
            "handover_s_mean": float(np.mean([link(h.blocks * link_block) for h in dis.handovers])),
            "timelines": {"colocated": timelines(colo.outputs, [])[:timeline_requests],
                          "disaggregated": timelines(dis.outputs, dis.handovers)[:timeline_requests]}}
    out["handover"] = measure_handover(model, tokenizer, (32, 64) if quick else (64, 256, 512), 1 if quick else 3)
    out["real"] = _disagg_real(model, tokenizer, net) if real else {}
    return out


def _disagg_real(model, tokenizer, net) -> dict:
    """The pair as two processes of the model itself (the K/V over a pipe), beside two colocated replica processes,
    on one short trace; tokens compared (the numba backend's logits do not depend on the batch, bit for bit)."""
    from ..cluster.processes import disagg_processes, replay_routed_processes
    trace = mixed_workload(12, net.config.vocab_size, [(4.0, 16, 24), (1.0, 400, 4)], seed=5)
    options = dict(max_model_len=512, max_num_seqs=8)
    dis = disagg_processes(model, tokenizer, trace, **options)
    colo = replay_routed_processes(model, tokenizer, trace, "least_loaded", 2, **options)
    same = {o.request_id: o.token_ids for o in colo.outputs}
    t = dis["transfers"]
    return {"requests": len(trace), "tokens_equal": sum(same[o.request_id] == o.token_ids for o in dis["outputs"]),
            "transfers": len(t), "transfer_bytes_total": sum(x["bytes"] for x in t),
            "transfer_s_median": float(np.median([x["seconds"] for x in t])) if t else 0.0,
            "transfer_s_max": float(max(x["seconds"] for x in t)) if t else 0.0,
            "colocated": routed_metrics(colo), "disaggregated": sched_metrics(dis["outputs"], dis["workload"],
                                                                            float("inf"), float("inf"))}


# ---------------------------------------------------------------------------- the bench
def bench_cluster(model="shakespeare", tokenizer=None, quick: bool = False, real: bool = True,
                  sections=("router", "disagg")) -> dict:
    """Both sections, one cost model (calibrated once). quick: small traces, no processes (a smoke run)."""
    net, tok = load(model, tokenizer)
    cost = StepCost.calibrate(net, tok, backend="torch")
    res = {"bench": "cluster", "model": str(model), "clock": cost.describe()}
    if "router" in sections:
        res["router"] = router_table(model, tokenizer, cost=cost, quick=quick, real=real and not quick)
    if "disagg" in sections:
        res["disagg"] = disagg_comparison(model, tokenizer, cost=cost, quick=quick, real=real and not quick)
    return res


# (key, header, scale, format): headers carry the units (times in ms)
LATENCY = [("ttft_p50", "TTFT50", 1e3, ".0f"), ("ttft_p99", "TTFT99", 1e3, ".0f"), ("tpot_p50", "TPOT50", 1e3, ".1f"),
           ("tpot_p99", "TPOT99", 1e3, ".1f")]
ROUTER_COLUMNS = [("throughput", "tok/s", 1, ".0f")] + LATENCY + [("prefix_hit_rate", "hit %", 100, ".0f"),
                                                                   ("max_share", "max share", 100, ".0f")]
DISAGG_COLUMNS = LATENCY + [("goodput", "goodput", 1, ".2f"), ("slo_attained", "in SLO %", 100, ".0f"),
                            ("throughput", "tok/s", 1, ".0f")]


def _table(runs: dict, columns: list, first: str):
    width = max(len(first), *(len(k) for k in runs)) + 1
    print(f"{first:<{width}}" + "".join(f"{h:>10}" for _, h, _, _ in columns))
    for name, r in runs.items():
        print(f"{name:<{width}}" + "".join(f"{r[k] * s:>10{f}}" for k, _, s, f in columns))


def print_report(res: dict):
    print(f"simulated clock: {res['clock']}; times in ms")
    if "router" in res:
        r, w = res["router"], res["router"]["workload"]
        print(f"\n-- router: {r['requests']} requests on {r['replicas']} replicas at {r['rate_rps']:.1f} req/s "
              f"({r['utilisation']:.0%} of their capacity without prefix hits); {w['system_prompts']} system prompts "
              f"of {w['system_len']} tokens, questions ~{w['user_median']}, outputs ~{w['output_median']}; KV pool "
              f"{w['pool_tokens_per_replica']} tokens per replica; least_loaded counts {r['load_measure']}")
        _table(r["runs"], ROUTER_COLUMNS, "policy")
        for name, m in r["runs"].items():
            print(f"{name}: requests per replica {m['routed']}, decisions {m['decisions']}")
        if r["real"]:
            print("wall clock (2 replica processes of the model itself, 24 requests):")
            _table(r["real"], ROUTER_COLUMNS, "policy")
    if "disagg" in res:
        d = res["disagg"]
        print(f"\n-- disaggregation: {d['engines']}; link {d['link']}")
        for name, w in d["workloads"].items():
            print(f"{name} ({w['requests']} requests, prompts ~{w['prompt_mean']:.0f}, outputs ~{w['output_mean']:.0f} "
                  f"tokens; SLO TTFT <= {w['slo']['ttft_s'] * 1e3:.0f} ms, TPOT <= {w['slo']['tpot_s'] * 1e3:.1f} ms: "
                  f"{w['slo']['definition']})")
            _table(w["runs"], DISAGG_COLUMNS, "setting")
            print(f"  disaggregation {w['verdict']} on TPOT p99: {w['reason']}; handover "
                  f"{w['handover_s_mean'] * 1e3:.2f} ms mean on the link")
        h = d["handover"]
        print(f"handover in one process (the model itself, block {h['block_size']} tokens = {h['block_bytes']:,} "
              "bytes):")
        for row in h["rows"]:
            print(f"  prompt {row['prompt_tokens']:>4}: {row['blocks']} blocks, {row['bytes']:,} bytes (formula "
                  f"{row['formula_bytes']:,}), copy {row['copy_s'] * 1e3:.2f} ms ({row['copy_gb_s']:.1f} GB/s)")
        if d["real"]:
            x = d["real"]
            print(f"two processes, K/V over a pipe: {x['transfers']} handovers, {x['transfer_bytes_total']:,} bytes, "
                  f"median {x['transfer_s_median'] * 1e3:.2f} ms (max {x['transfer_s_max'] * 1e3:.2f}); tokens equal "
                  f"to colocated for {x['tokens_equal']} of {x['requests']}")


# ---------------------------------------------------------------------------- python -m minillm bench cluster
def add_parser(sub):
    """`bench cluster`: its options, and run_cli to run it."""
    p = sub.add_parser("cluster", help="data-parallel routing policies; prefill/decode disaggregation against "
                                       "colocated engines (simulated clock, then processes)")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--section", choices=["router", "disagg", "all"], default="all")
    p.add_argument("--no-real", action="store_true", help="skip the runs in separate processes (wall clock)")
    p.add_argument("--quick", action="store_true", help="small traces, no processes: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    res = bench_cluster(a.model, a.tokenizer, a.quick, not a.no_real,
                        ("router", "disagg") if a.section == "all" else (a.section,))
    print_report(res)
    return res
