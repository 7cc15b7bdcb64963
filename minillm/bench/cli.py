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

from .decode import bench_batched, bench_decode
from .serve import bench_serve


def _write_json(res: dict, path) -> int:
    """--json: the bench's whole result, as printed, for plots and CI. -> the exit code 0."""
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm bench")
    sub = ap.add_subparsers(dest="what", required=True)
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
    sv.add_argument("--json", default=None)
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
    cl = sub.add_parser("cluster", help="data-parallel routing policies; prefill/decode disaggregation against "
                                        "colocated engines (simulated clock, then processes)")
    cl.add_argument("--model", default="shakespeare")
    cl.add_argument("--tokenizer", default=None)
    cl.add_argument("--section", choices=["router", "disagg", "all"], default="all")
    cl.add_argument("--no-real", action="store_true", help="skip the runs in separate processes (wall clock)")
    cl.add_argument("--quick", action="store_true", help="small traces, no processes: a smoke test")
    cl.add_argument("--json", default=None)
    pa = sub.add_parser("parallel", help="tensor (TP=2) and pipeline (PP=2) parallelism vs one rank: decode tok/s, "
                                         "bytes per token per collective, loopback bytes, the pipeline bubble")
    pa.add_argument("--model", default="shakespeare")
    pa.add_argument("--quick", action="store_true", help="8 decode steps, 1 repeat, short prompts: a smoke test")
    pa.add_argument("--json", default=None)
    b = sub.add_parser("batched", help="batched decode tok/s and FLOP/s, beside llama2.c's run.c (--runc)")
    b.add_argument("--model", required=True)
    b.add_argument("--tokenizer", default=None)
    b.add_argument("--batch", type=int, default=32)
    b.add_argument("--steps", type=int, default=128)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--runc", default=None, help="a run.c binary you built (e.g. llama2.c's `make runomp`)")
    b.add_argument("--quick", action="store_true", help="batch 4, 16 steps, 1 repeat: a smoke test")
    b.add_argument("--json", default=None)
    qb = sub.add_parser("quant", help="every quantization scheme: perplexity, bytes, batch-1 and batched decode")
    qb.add_argument("--model", default="shakespeare", help="e.g. shakespeare, or random:stories110M (weights >> L3)")
    qb.add_argument("--tokenizer", default=None)
    qb.add_argument("--steps", type=int, default=64)
    qb.add_argument("--batch", type=int, default=32)
    qb.add_argument("--repeats", type=int, default=3)
    qb.add_argument("--windows", type=int, default=25, help="held-out windows of 256 tokens for perplexity")
    qb.add_argument("--quick", action="store_true", help="4 windows, 8 steps, batch 4, 1 repeat: a smoke test")
    qb.add_argument("--json", default=None)
    gq = sub.add_parser("gptq", help="GPTQ beside round-to-nearest int4 and AWQ at g32 and g128: delta perplexity, "
                                     "quantization time")
    gq.add_argument("--model", default="shakespeare")
    gq.add_argument("--tokenizer", default=None)
    gq.add_argument("--windows", type=int, default=25, help="held-out windows of 256 tokens for perplexity")
    gq.add_argument("--quick", action="store_true",
                    help="1 window, g128 only, GPTQ on 256 calibration tokens, no AWQ or act-order: a smoke test")
    gq.add_argument("--json", default=None)
    lc = sub.add_parser("longctx", help="kv_eviction (StreamingLLM, H2O): perplexity against KV budget on 1024-token "
                                        "windows, KV bytes generating past the context")
    lc.add_argument("--model", default="shakespeare")
    lc.add_argument("--windows", type=int, default=4, help="held-out windows of the model's context (1024 tokens)")
    lc.add_argument("--quick", action="store_true", help="1 window, budgets 128 and 256, 150 tokens generated")
    lc.add_argument("--json", default=None)
    sp = sub.add_parser("spec",
                        help="speculative decoding: every proposer and gamma against plain decoding, batch 1 and up")
    sp.add_argument("--model", default="shakespeare")
    sp.add_argument("--tokenizer", default=None)
    sp.add_argument("--prompts", type=int, default=32)
    sp.add_argument("--max-tokens", type=int, default=128)
    sp.add_argument("--quick", action="store_true", help="4 prompts, 32 tokens, one gamma per proposer: a smoke test")
    sp.add_argument("--json", default=None)
    pe = sub.add_parser("peers", help="minillm beside HF transformers and run.c on the same weights, batch 1 and up")
    pe.add_argument("--model", default="shakespeare", help="registered name, random:<preset> or .bin file")
    pe.add_argument("--tokenizer", default=None)
    pe.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    pe.add_argument("--steps", type=int, default=64, help="new tokens per sequence")
    pe.add_argument("--repeats", type=int, default=5)
    pe.add_argument("--runc", default=None, help="a run.c binary you built, timed at batch 1 (it has no batching)")
    pe.add_argument("--quick", action="store_true", help="batches 1 and 4, 16 steps, 1 repeat: a smoke test")
    pe.add_argument("--json", default=None)
    spy = sub.add_parser("sparsity", help="magnitude and Wanda pruning: delta perplexity vs sparsity 10-70%% and 2:4; "
                                          "the 2:4 GEMV against dense at batch 1")
    spy.add_argument("--model", default="shakespeare")
    spy.add_argument("--tokenizer", default=None)
    spy.add_argument("--windows", type=int, default=25, help="held-out windows of 256 tokens (25: all of them)")
    spy.add_argument("--quick", action="store_true", help="2 windows, 50%% and 2:4 only, small GEMV: a smoke test")
    spy.add_argument("--json", default=None)
    gd = sub.add_parser("guided", help="structured output: validity, mask cost at batch 8, jump-forward, "
                                       "masks and times beside outlines-core")
    gd.add_argument("--model", default="shakespeare")
    gd.add_argument("--samples", type=int, default=500, help="samples per schema / regex at T = 1")
    gd.add_argument("--repeats", type=int, default=5, help="rounds of the mask-cost runs")
    gd.add_argument("--quick", action="store_true", help="4 samples each, 1 repeat, 24-token mask runs, 2 constraints "
                                                        "beside outlines-core: a smoke test")
    gd.add_argument("--json", default=None)
    lo = sub.add_parser("lora", help="LoRA: several adapters in one batch against one merged model, tok/s and bytes")
    lo.add_argument("--model", default="shakespeare")
    lo.add_argument("--adapters", default="comedies,tragedies,histories", help="comma-separated names or directories")
    lo.add_argument("--seqs", type=int, default=32)
    lo.add_argument("--max-tokens", type=int, default=64)
    lo.add_argument("--repeats", type=int, default=5)
    lo.add_argument("--quick", action="store_true", help="8 sequences, 8 tokens, 1 round: a smoke test")
    lo.add_argument("--json", default=None)
    mo = sub.add_parser("moe", help="mixture of experts: val loss against the dense baselines, expert load, active vs "
                                    "stored parameters, expert-parallel bytes, dense vs MoE decode at batch 1 and 16")
    mo.add_argument("--quick", action="store_true", help="2 windows, 8 decode steps, 1 repeat: a smoke test")
    mo.add_argument("--json", default=None)
    d = sub.add_parser("decode", help="batch-1 decode tok/s (median of several runs)")
    d.add_argument("--model", required=True, help="registered name, random:<preset>, .bin file or HF dir")
    d.add_argument("--tokenizer", default=None)
    d.add_argument("--steps", type=int, default=256, help="positions per run, as run.c's -n")
    d.add_argument("--repeats", type=int, default=5)
    d.add_argument("--threads", type=int, default=None, help="default: the cores free now (minillm/threads.py)")
    d.add_argument("--busy", action="store_true", help="idle, then beside a busy loop, each in its own process: "
                                                       "free-core threads against one thread per core")
    d.add_argument("--backend", default="auto", choices=["auto", "torch", "numba", "cuda"],
                   help="default auto: the engine's choice (numba on a CPU)")
    d.add_argument("--runc", default=None, help="a run.c binary you built, timed on the same file (-n steps, greedy)")
    d.add_argument("--prompt", default="",
                   help="the same prompt for both (default with --runc: 'To be, or not to be', since run.c stops at "
                        "BOS and a prompt keeps it going)")
    d.add_argument("--quick", action="store_true", help="3 runs of 64 steps: a smoke test")
    d.add_argument("--json", default=None, help="also write the result to this file")
    a = ap.parse_args(argv)
    if a.what == "serve":
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
        return _write_json(res, a.json)
    if a.what == "sched":
        from .sched import bench_sched, print_table
        res = bench_sched(a.model, a.tokenizer, a.requests, a.utilisation, a.max_num_seqs, a.seeds,
                          real=not a.no_real, quick=a.quick)
        print_table(res)
        return _write_json(res, a.json)
    if a.what == "cluster":
        from .cluster import bench_cluster, print_report
        res = bench_cluster(a.model, a.tokenizer, a.quick, not a.no_real,
                            ("router", "disagg") if a.section == "all" else (a.section,))
        print_report(res)
        return _write_json(res, a.json)
    if a.what == "parallel":
        from .parallel import bench_parallel, print_report
        res = bench_parallel(a.model, a.quick)
        print_report(res)
        return _write_json(res, a.json)
    if a.what == "quant":
        from .quant import bench_quant, print_table
        steps, batch, repeats, windows = (8, 4, 1, 4) if a.quick else (a.steps, a.batch, a.repeats, a.windows)
        res = bench_quant(a.model, a.tokenizer, steps, batch, repeats, windows)
        print_table(res)
        return _write_json(res, a.json)
    if a.what == "gptq":
        from .gptq import bench_gptq, gptq_schemes, print_table
        quick = [(label, q, dict(cfg, calibration_tokens=256) if q == "gptq" else cfg)
                 for label, q, cfg in gptq_schemes((128,), act_order=False) if q != "awq"]
        res = bench_gptq(a.model, a.tokenizer, 1 if a.quick else a.windows, quick if a.quick else None)
        print_table(res)
        return _write_json(res, a.json)
    if a.what == "longctx":
        from .longctx import BUDGETS, QUICK_BUDGETS, bench_longctx, print_table
        res = bench_longctx(a.model, 1 if a.quick else a.windows, QUICK_BUDGETS if a.quick else BUDGETS,
                            gen_tokens=150 if a.quick else 300)
        print_table(res)
        return _write_json(res, a.json)
    if a.what == "spec":
        from .spec import QUICK, bench_spec, print_table
        if a.quick:
            res = bench_spec(a.model, a.tokenizer, 4, 32, configs=QUICK, batches=(1, 4))
        else:
            res = bench_spec(a.model, a.tokenizer, a.prompts, a.max_tokens)
        print_table(res)
        return _write_json(res, a.json)
    if a.what == "sparsity":
        from .sparsity import bench_sparsity, print_report
        res = bench_sparsity(a.model, a.tokenizer, a.quick, a.windows)
        print_report(res)
        return _write_json(res, a.json)
    if a.what == "guided":
        from .guided import bench_guided, print_report
        res = bench_guided(a.model, 4 if a.quick else a.samples, 1 if a.quick else a.repeats, a.quick)
        print_report(res)
        return _write_json(res, a.json)
    if a.what == "lora":
        from .lora import bench_lora, print_report
        seqs, tokens, repeats = (8, 8, 1) if a.quick else (a.seqs, a.max_tokens, a.repeats)
        res = bench_lora(a.model, a.adapters.split(","), seqs, max_tokens=tokens, repeats=repeats)
        print_report(res)
        return _write_json(res, a.json)
    if a.what == "moe":
        from .moe import bench_moe, print_report
        res = bench_moe(a.quick)
        print_report(res)
        return _write_json(res, a.json)
    if a.what == "peers":
        from .peers import bench_peers, parse_batches, print_table
        res = bench_peers(a.model, a.tokenizer, parse_batches(a.batches), a.steps, a.repeats, a.runc, a.quick)
        print_table(res)
        return _write_json(res, a.json)
    if a.what == "batched":
        batch, steps, repeats = (4, 16, 1) if a.quick else (a.batch, a.steps, a.repeats)
        res = bench_batched(a.model, a.tokenizer, batch, steps, repeats, a.runc)
        print(f"batched decode, {batch} sequences: {res['tok_s_median']:.0f} tok/s median ({res['threads']} threads), "
              f"{res['flop_s_median'] / 1e9:.2f} GFLOP/s = {res['flop_fraction']:.0%} of torch's matmuls on the same "
              f"shapes ({res['torch_matmul_flop_s'] / 1e9:.2f} GFLOP/s)")
        if a.runc:
            print(f"run.c (batch 1): {res['runc_tok_s_median']:.0f} tok/s median; "
                  f"batched / run.c = {res['batched_over_runc']:.1f}x")
        return _write_json(res, a.json)
    steps, repeats = (64, 3) if a.quick else (a.steps, a.repeats)
    if a.busy:
        from .decode import bench_decode_busy
        res = bench_decode_busy(a.model, a.tokenizer, steps, repeats, a.backend)
        for label, r in res["runs"].items():
            print(f"{label:<20} {r['threads']} threads: {r['tok_s_median']:7.1f} tok/s median "
                  f"(min {r['tok_s_min']:.1f}, max {r['tok_s_max']:.1f})")
        for k, v in res["ratios"].items():
            print(f"{k}: {v:.2f}x")
        return _write_json(res, a.json)
    res = bench_decode(a.model, a.tokenizer, steps, repeats, a.threads, a.backend, a.runc, a.prompt)
    print(f"decode {res['model']} ({res['backend']}): {res['tok_s_median']:.1f} tok/s median over {repeats} runs "
          f"of {res['steps']} steps (min {res['tok_s_min']:.1f}, max {res['tok_s_max']:.1f}; {res['threads']} threads)")
    for part, us in res.get("profile_us_per_token", {}).items():
        print(f"  {part:<44} {us:8.0f} us/token")
    if a.runc:
        print(f"run.c: {res['runc_tok_s_median']:.1f} tok/s median (min {min(res['runc_tok_s_all']):.1f}, max "
              f"{max(res['runc_tok_s_all']):.1f}); {res['backend']} / run.c = {res['over_runc']:.2f}x")
    return _write_json(res, a.json)


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
