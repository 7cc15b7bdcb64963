"""`python -m minillm bench decode | batched | peers | serve | sched | cluster | parallel | quant | gptq | sparsity |
longctx | spec | guided`: batch-1 decode speed; batched decode beside llama2.c's run.c and against torch's own matmul
FLOP/s; a serving workload under several settings; the scheduling orders on heavy-tailed traces; routers over
data-parallel replicas and prefill/decode disaggregation (`cluster`); tensor and pipeline parallelism (`parallel`);
quantization, GPTQ and pruning against perplexity; KV eviction against perplexity; structured output (validity, mask
cost, jump-forward, outlines-core); LoRA adapters batched against a merged model (`lora`); mixture of experts against
its dense baselines (`moe`).
Warm-up excluded, medians of several runs, every ratio measured side by side in one run."""
from __future__ import annotations

import argparse
import json

from ..atomic import open_replacing
from . import cluster, decode, gptq, guided, longctx, lora, moe, parallel, peers, sparsity, spec, stepcost
from .serve import bench_serve


def _write_json(res: dict, path) -> int:
    """--json: the bench's whole result, as printed, for plots and CI. -> the exit code 0."""
    if path:
        with open_replacing(path, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def main(argv: list[str]) -> int:
    """Each subcommand's add_parser adds its options and its handler (set_defaults(run=...)): the handler prints
    the bench's report and returns its result, which --json writes."""
    ap = argparse.ArgumentParser(prog="python -m minillm bench")
    sub = ap.add_subparsers(dest="what", required=True)
    for add_parser in SUBCOMMANDS:
        add_parser(sub)
    a = ap.parse_args(argv)
    return _write_json(a.run(a), a.json)


# ---------------------------------------------------------------------------- registered here, not in their modules
# serve and sched are registered here rather than in bench/serve.py and bench/sched.py, whose code is moving out to
# lower layers; quant here too, since bench/quant.py is at the ~400-line limit.
def add_serve_parser(sub):
    """`bench serve`: its options, and run_serve to run it."""
    sv = sub.add_parser("serve", help="a Poisson workload under several engine settings, side by side")
    sv.add_argument("--model", default="shakespeare")
    sv.add_argument("--tokenizer", default=None)
    sv.add_argument("--requests", type=int, default=64)
    sv.add_argument("--rate", type=float, default=50.0, help="arrivals per second (Poisson); the default saturates")
    sv.add_argument("--kv-cache-bytes", type=int, default=None)
    sv.add_argument("--max-model-len", type=int, default=None)
    sv.add_argument("--max-num-seqs", type=int, default=64)
    sv.add_argument("--prompt-median", type=float, default=None, help="tokens; default 15%% of max_model_len")
    sv.add_argument("--output-median", type=float, default=None, help="tokens; default 12.5%% of max_model_len")
    sv.add_argument("--simulated", action="store_true",
                    help="time by a per-step cost model calibrated here first, not the wall clock (busy machines)")
    sv.add_argument("--quick", action="store_true", help="12 requests, context 128: a smoke test")
    sv.add_argument("--score", action="store_true", help="the capstone: one goodput score for --options / --policy "
                    "on its fixed trace, KV budget, SLO and fixed cost model (bench/capstone.py)")
    sv.add_argument("--options", type=json.loads, default=None, metavar="JSON",
                    help='with --score: EngineConfig options over the plain engine, e.g. \'{"block_size": 16}\'')
    sv.add_argument("--policy", default=None, metavar="FILE.py", help="with --score: a file defining order() or "
                    "policy(config)")
    sv.add_argument("--machine", choices=("reference", "measured"), default="reference",
                    help="with --score: the shipped cost model (scores compare across laptops) or this machine's")
    sv.add_argument("--json", default=None)
    sv.set_defaults(run=run_serve)


def run_serve(a) -> dict:
    if a.score:
        from ..formats.loader import load
        from . import capstone
        net, tok = load(a.model, a.tokenizer)
        machine = capstone.REFERENCE if a.machine == "reference" else capstone.Machine.calibrate(net, tok)
        res = capstone.report(net, tok, a.options, a.policy, machine)
        capstone.print_report(res)
        return res
    if a.options or a.policy:
        raise SystemExit("bench serve: --options and --policy go with --score")
    n, L = (12, 128) if a.quick else (a.requests, a.max_model_len)
    res = bench_serve(a.model, a.tokenizer, n, a.rate, a.kv_cache_bytes, L, a.max_num_seqs, a.prompt_median,
                      a.output_median, a.simulated)
    w = res["workload"]
    print(f"{n} requests at {a.rate:g}/s, prompts {w['prompt_tokens_median']:.0f} median / "
          f"{w['prompt_tokens_mean']:.0f} mean tokens, outputs {w['output_tokens_median']:.0f} / "
          f"{w['output_tokens_mean']:.0f}; max_model_len {res['max_model_len']}, "
          f"KV {res['kv_cache_bytes'] / 2**20:.0f} MiB, max_num_seqs {res['max_num_seqs']}; clock: {res['clock']}")
    print_serve_table(res["runs"])
    for k, v in res["ratios"].items():
        print(f"{k}: {v:.1%}" if "waste" in k else f"{k}: {v:.2f}")
    return res


def add_sched_parser(sub):
    """`bench sched`: its options, and run_sched to run it."""
    sc = sub.add_parser("sched", help="scheduling orders (fcfs, sjf, priority, mlfq, fair, lpm) on heavy-tailed traces")
    sc.add_argument("--model", default="shakespeare")
    sc.add_argument("--tokenizer", default=None)
    sc.add_argument("--requests", type=int, default=300)
    sc.add_argument("--utilisation", type=float, default=0.85, help="arrival rate / the engine's measured capacity")
    sc.add_argument("--max-num-seqs", type=int, default=2, help="small, so that long requests can hold every seat")
    sc.add_argument("--seeds", type=int, default=3, help="traces the headline JCT ratios are repeated on")
    sc.add_argument("--no-real", action="store_true", help="skip the wall-clock runs")
    sc.add_argument("--quick", action="store_true", help="32 requests, 8 on the wall clock, one trace: a smoke test")
    sc.add_argument("--json", default=None)
    sc.set_defaults(run=run_sched)


def run_sched(a) -> dict:
    from .sched import bench_sched, print_table
    res = bench_sched(a.model, a.tokenizer, a.requests, a.utilisation, a.max_num_seqs, a.seeds,
                      real=not a.no_real, quick=a.quick)
    print_table(res)
    return res


def add_quant_parser(sub):
    """`bench quant`: its options, and run_quant to run it."""
    qb = sub.add_parser("quant", help="every quantization scheme: perplexity, bytes, batch-1 and batched decode")
    qb.add_argument("--model", default="shakespeare", help="e.g. shakespeare, or random:stories110M (weights >> L3)")
    qb.add_argument("--tokenizer", default=None)
    qb.add_argument("--steps", type=int, default=64)
    qb.add_argument("--batch", type=int, default=32)
    qb.add_argument("--repeats", type=int, default=3)
    qb.add_argument("--windows", type=int, default=25, help="held-out windows of 256 tokens for perplexity")
    qb.add_argument("--quick", action="store_true", help="4 windows, 8 steps, batch 4, 1 repeat: a smoke test")
    qb.add_argument("--json", default=None)
    qb.set_defaults(run=run_quant)


def run_quant(a) -> dict:
    from .quant import bench_quant, print_table
    steps, batch, repeats, windows = (8, 4, 1, 4) if a.quick else (a.steps, a.batch, a.repeats, a.windows)
    res = bench_quant(a.model, a.tokenizer, steps, batch, repeats, windows)
    print_table(res)
    return res


# the subcommands, in the order `bench --help` lists them
SUBCOMMANDS = (add_serve_parser, add_sched_parser, cluster.add_parser, parallel.add_parser, decode.add_batched_parser,
               add_quant_parser, gptq.add_parser, longctx.add_parser, spec.add_parser, peers.add_parser,
               sparsity.add_parser, guided.add_parser, lora.add_parser, moe.add_parser, decode.add_parser,
               stepcost.add_parser)


# bench serve's table: (key, header, unit scale, format); headers carry the units, the table stays under 120 columns
SERVE_COLUMNS = [("throughput", "tok/s", 1, ".0f"), ("tokens_per_step", "tok/step", 1, ".1f"),
                 ("ttft_p50", "TTFT50 ms", 1e3, ".0f"), ("ttft_p99", "TTFT99 ms", 1e3, ".0f"),
                 ("tpot_p50", "TPOT50 ms", 1e3, ".1f"), ("tpot_p99", "TPOT99 ms", 1e3, ".1f"),
                 ("kv_waste", "waste %", 100, ".1f"), ("peak_running", "peak seqs", 1, ".0f"),
                 ("preemptions", "preempt", 1, ".0f"), ("cached_tokens", "cached", 1, ".0f")]


def print_serve_table(runs: dict):
    width = max(len(label) for label in runs) + 1
    print(f"{'setting':<{width}}" + "".join(f"{h:>10}" for _, h, _, _ in SERVE_COLUMNS))
    for label, r in runs.items():
        print(f"{label:<{width}}" + "".join(f"{r[k] * scale:>10{fmt}}" for k, _, scale, fmt in SERVE_COLUMNS))
