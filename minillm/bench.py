"""`python -m minillm bench decode | batched | serve | quant | spec`: batch-1 decode speed; batched decode beside llama2.c's
run.c and against torch's own matmul FLOP/s; a serving workload under several settings. Warm-up excluded,
medians of several runs, every ratio measured side by side in one run."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics

import numpy as np
import torch

from .loader import load
from .runc import decode_loop
from .sampling import RunCSampler


def bench_decode(model: str, tokenizer=None, steps: int = 256, repeats: int = 5, threads: int | None = None,
                 backend: str = "torch", runc: str | None = None, prompt: str = "") -> dict:
    """Batch-1 greedy decode tok/s through `python -m minillm run`'s loop on this backend (compile time and
    warm-up excluded), beside llama2.c's run.c on the same file when `runc` names a binary you built
    (each run.c run its own process, alternated with ours)."""
    from .backends import backend_model
    net, tok = load(model, tokenizer)
    net = backend_model(net, backend)
    if threads:
        torch.set_num_threads(threads)
    if backend == "numba":       # as `run --backend numba`: numba's threads work, torch's would spin against them
        import numba
        if threads:
            numba.set_num_threads(threads)
        torch.set_num_threads(1)
    steps = min(steps, net.config.max_seq_len)
    greedy = RunCSampler(0.0, 0.9, 1)
    run = lambda n: decode_loop(net, tok, greedy, prompt, n, write=None, stop_at_bos=False)[1]
    run(min(8, steps))  # warm-up: compilation (numba), allocation, first-call costs
    tk = tokenizer or os.path.join(os.path.dirname(os.path.abspath(model)), "tokenizer.bin")
    rates, rc = [], []
    if backend == "numba":
        net.compiled_seconds, net.compiled_calls = 0.0, 0           # count the timed runs only
    for _ in range(repeats):
        rates.append(run(steps))
        if runc:
            rc.append(runc_tok_s(runc, model, tk, steps, prompt))
    res = {"bench": "decode", "model": str(model), "backend": backend, "steps": steps, "repeats": repeats,
           "threads": numba_threads() if backend == "numba" else torch.get_num_threads(),
           "tok_s_median": statistics.median(rates), "tok_s_min": min(rates), "tok_s_max": max(rates), "tok_s_all": rates,
           "params": net.config.num_params(), "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
           "cpus": os.cpu_count()}
    if runc:
        res.update(runc=runc, runc_tok_s_median=statistics.median(rc), runc_tok_s_all=rc,
                   over_runc=res["tok_s_median"] / statistics.median(rc))
    if backend == "numba":
        res["profile_us_per_token"] = numba_profile(net, 1e6 / statistics.mean(rates))
    return res


def numba_threads() -> int:
    import numba
    return numba.get_num_threads()


def numba_profile(net, us_per_token: float) -> dict:
    """Where a batch-1 numba decode step's time went, in microseconds per token: inside the compiled
    forward (as NumbaTransformer timed it during the runs just made), of which the matmuls (the same
    kernels on the same weights, timed alone) and the rest (attention, norms, RoPE, SwiGLU, K/V writes);
    and the Python decode loop around it (tensors, metadata, sampling), us_per_token - forward."""
    import time
    import numpy as np
    from .kernels.matmul import linear_cpu
    w, cfg = net.w, net.config
    forward = net.compiled_seconds / max(1, net.compiled_calls) * 1e6
    x = np.full((1, cfg.dim), 0.1, np.float32)                       # (1, C)
    h = np.full((1, cfg.hidden_dim), 0.1, np.float32)                # (1, F)
    outs = {k: np.empty((1, w[k].shape[-2]), np.float32) for k in ("wqkv", "wo", "w13", "w2", "wcls")}

    def matmuls(layers: bool):
        if not layers:
            return linear_cpu(x, w["wcls"], outs["wcls"])
        for l in range(cfg.n_layers):
            for k in ("wqkv", "wo", "w13"):
                linear_cpu(x, w[k][l], outs[k])
            linear_cpu(h, w["w2"][l], outs["w2"])

    timed = {}
    for name, layers in (("layer matmuls", True), ("classifier matmul", False)):
        matmuls(layers)
        t = time.perf_counter()
        for _ in range(20):
            matmuls(layers)
        timed[name] = (time.perf_counter() - t) / 20 * 1e6
    return {"compiled forward": forward, **{f"  {k}": v for k, v in timed.items()},
            "  attention, norms, RoPE, SwiGLU, K/V writes": forward - sum(timed.values()),
            "Python decode loop, tensors, sampling": us_per_token - forward, "total": us_per_token}


def runc_tok_s(runc: str, model: str, tokenizer: str, steps: int, prompt: str = "") -> float:
    """One run of a llama2.c run.c binary (built by the user, outside this repo), greedy from `prompt`;
    its own "achieved tok/s" line (stderr). run.c stops early if it samples BOS: give a prompt that
    keeps a random-weight model going."""
    import re
    import subprocess
    done = subprocess.run([runc, model, "-z", tokenizer, "-t", "0", "-n", str(steps), "-i", prompt],
                          capture_output=True, text=True, timeout=600)
    m = re.search(r"achieved tok/s: ([0-9.]+)", done.stderr)
    if done.returncode != 0 or not m:
        raise RuntimeError(f"{runc} failed (exit {done.returncode}): {done.stderr[-300:]}")
    return float(m.group(1))


def matmul_flops(cfg, batch: int, repeats: int = 5) -> float:
    """torch's own FLOP/s on the decode step's matmul shapes at this batch: (batch, in) @ (in, out) for
    every weight of one layer plus the classifier, timed back to back (median of repeats)."""
    import time
    C, Hd = cfg.dim, cfg.hidden_dim
    shapes = [(C, C), (C, cfg.kv_dim), (C, cfg.kv_dim), (C, C), (C, Hd), (C, Hd), (Hd, C)]
    mats = [(torch.randn(batch, i), torch.randn(i, o)) for i, o in shapes] * cfg.n_layers
    mats.append((torch.randn(batch, C), torch.randn(C, cfg.vocab_size)))
    flops = sum(2 * batch * w.shape[0] * w.shape[1] for _, w in mats)
    times = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        for x, w in mats:
            x @ w
        times.append(time.perf_counter() - t)
    return flops / statistics.median(times[1:])


def bench_batched(model: str, tokenizer=None, batch: int = 32, steps: int = 128, repeats: int = 3,
                  runc: str | None = None) -> dict:
    """Decode tokens/s of `batch` sequences through the engine (decode steps only, from the trace), beside
    llama2.c's run.c (batch 1, its own process) on the same file when `runc` names a binary; and the FLOP/s
    the batched steps achieve against torch's own matmuls on the same shapes."""
    from .llm import LLM
    from .sampling import SamplingParams
    net, tok = load(model, tokenizer)
    steps = min(steps, net.config.max_seq_len - 1)
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    rates, flop_rates = [], []
    for _ in range(repeats + 1):                     # the first run warms up
        llm = LLM(net, tokenizer=tok, max_num_seqs=batch, max_model_len=steps + 1)
        llm.generate([[1]] * batch, params)
        dec = [s for s in llm.engine.trace.steps if s.kind == "decode"]
        n_tok, secs = sum(s.num_decode_tokens for s in dec), sum(s.seconds for s in dec)
        ctx = steps // 2                             # mean context over the run, for attention FLOPs
        rates.append(n_tok / secs)
        flop_rates.append(n_tok * net.config.flops_per_token(ctx) / secs)
    rates, flop_rates = rates[1:], flop_rates[1:]
    res = {"bench": "batched", "model": str(model), "batch": batch, "steps": steps, "repeats": repeats,
           "threads": torch.get_num_threads(), "tok_s_median": statistics.median(rates), "tok_s_all": rates,
           "flop_s_median": statistics.median(flop_rates), "torch_matmul_flop_s": matmul_flops(net.config, batch)}
    res["flop_fraction"] = res["flop_s_median"] / res["torch_matmul_flop_s"]
    if runc:
        tk = tokenizer or os.path.join(os.path.dirname(os.path.abspath(model)), "tokenizer.bin")
        rc = [runc_tok_s(runc, model, tk, steps) for _ in range(repeats)]
        res.update(runc=runc, runc_tok_s_median=statistics.median(rc), runc_tok_s_all=rc,
                   batched_over_runc=res["tok_s_median"] / statistics.median(rc))
    return res


def bench_serve(model: str, tokenizer=None, n: int = 64, rate: float = 50.0, kv_cache_bytes: int | None = None,
                max_model_len: int | None = None, max_num_seqs: int = 64, prompt_median: float | None = None,
                output_median: float | None = None) -> dict:
    """The same skewed workload under each setting, side by side in one process; ratios between them.
    Defaults: lengths scale with max_model_len (prompt median 15%, output median 12.5% of it, log-normal
    sigma 0.8, so at 1024 about ShareGPT's scale as the vLLM paper reports it: prompts ~160, outputs
    ~130 tokens, a tail to 512); the KV budget holds 16 full-length sequences (the contiguous cache's
    concurrency), so paged concurrency is bounded by max_num_seqs or by memory, whichever binds first; arrivals at `rate` per
    second saturate the engine, so throughput measures the policy, not the arrival rate."""
    from .bench_serve import replay
    from .workload import make_workload
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
            ("shared prefix, no caching", shared, dict()), ("shared prefix, prefix caching", shared, dict(enable_prefix_caching=True))]
    res = {label: replay(net, tok, w, label, **common, **opt).as_dict() for label, w, opt in runs}
    ratios = {"continuous / static throughput": res["continuous"]["throughput"] / res["static"]["throughput"],
              "paged KV waste (block 16)": res["continuous"]["kv_waste"],
              "contiguous KV waste": res["continuous, contiguous cache"]["kv_waste"],
              "paged / contiguous peak concurrency": res["continuous"]["peak_running"] / max(1, res["continuous, contiguous cache"]["peak_running"]),
              "TTFT p50, no caching / prefix caching": res["shared prefix, no caching"]["ttft_p50"] / res["shared prefix, prefix caching"]["ttft_p50"]}
    mean = lambda xs: float(np.mean(xs))
    workload = {"prompt_tokens_mean": mean([len(r.prompt_ids) for r in wl]), "prompt_tokens_median": float(np.median([len(r.prompt_ids) for r in wl])),
                "output_tokens_mean": mean([r.max_tokens for r in wl]), "output_tokens_median": float(np.median([r.max_tokens for r in wl])),
                **lengths}
    return {"bench": "serve", "model": str(model), "requests": n, "rate": rate, "kv_cache_bytes": kv, "max_model_len": L,
            "max_num_seqs": max_num_seqs, "workload": workload, "runs": res, "ratios": ratios}


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
    sv.add_argument("--quick", action="store_true", help="12 requests, context 128: a smoke test")
    sv.add_argument("--json", default=None)
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
    sp = sub.add_parser("spec", help="speculative decoding: every proposer and gamma against plain decoding, batch 1 and up")
    sp.add_argument("--model", default="shakespeare")
    sp.add_argument("--tokenizer", default=None)
    sp.add_argument("--prompts", type=int, default=32)
    sp.add_argument("--max-tokens", type=int, default=128)
    sp.add_argument("--quick", action="store_true", help="4 prompts, 32 tokens, one gamma per proposer: a smoke test")
    sp.add_argument("--json", default=None)
    d = sub.add_parser("decode", help="batch-1 decode tok/s (median of several runs)")
    d.add_argument("--model", required=True, help="registered name, random:<preset>, .bin file or HF dir")
    d.add_argument("--tokenizer", default=None)
    d.add_argument("--steps", type=int, default=256, help="positions per run, as run.c's -n")
    d.add_argument("--repeats", type=int, default=5)
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--backend", default="torch", choices=["torch", "numba"])
    d.add_argument("--runc", default=None, help="a run.c binary you built, timed on the same file (-n steps, greedy)")
    d.add_argument("--prompt", default="", help="the same prompt for both (run.c stops at BOS; a prompt keeps it going)")
    d.add_argument("--quick", action="store_true", help="3 runs of 64 steps: a smoke test")
    d.add_argument("--json", default=None, help="also write the result to this file")
    a = ap.parse_args(argv)
    if a.what == "serve":
        n, L = (12, 128) if a.quick else (a.requests, a.max_model_len)
        res = bench_serve(a.model, a.tokenizer, n, a.rate, a.kv_cache_bytes, L, a.max_num_seqs, a.prompt_median, a.output_median)
        w = res["workload"]
        print(f"{n} requests at {a.rate:g}/s, prompts {w['prompt_tokens_median']:.0f} median / {w['prompt_tokens_mean']:.0f} mean "
              f"tokens, outputs {w['output_tokens_median']:.0f} / {w['output_tokens_mean']:.0f}; max_model_len {res['max_model_len']}, "
              f"KV {res['kv_cache_bytes'] / 2**20:.0f} MiB, max_num_seqs {res['max_num_seqs']}")
        cols = ["throughput", "tokens_per_step", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "kv_waste", "peak_running", "preemptions", "cached_tokens"]
        print(f"{'setting':<32}" + "".join(f"{c:>16}" for c in cols))
        for label, r in res["runs"].items():
            print(f"{label:<32}" + "".join(f"{r[c]:>16.4g}" for c in cols))
        for k, v in res["ratios"].items():
            print(f"{k}: {v:.1%}" if "waste" in k else f"{k}: {v:.2f}")
        return _write_json(res, a.json)
    if a.what == "quant":
        from .bench_quant import bench_quant, print_table
        steps, batch, repeats, windows = (8, 4, 1, 4) if a.quick else (a.steps, a.batch, a.repeats, a.windows)
        res = bench_quant(a.model, a.tokenizer, steps, batch, repeats, windows)
        print_table(res)
        return _write_json(res, a.json)
    if a.what == "spec":
        from .bench_spec import QUICK, bench_spec, print_table
        if a.quick:
            res = bench_spec(a.model, a.tokenizer, 4, 32, configs=QUICK, batches=(1, 4))
        else:
            res = bench_spec(a.model, a.tokenizer, a.prompts, a.max_tokens)
        print_table(res)
        return _write_json(res, a.json)
    if a.what == "batched":
        batch, steps, repeats = (4, 16, 1) if a.quick else (a.batch, a.steps, a.repeats)
        res = bench_batched(a.model, a.tokenizer, batch, steps, repeats, a.runc)
        print(f"batched decode, {batch} sequences: {res['tok_s_median']:.0f} tok/s median ({res['threads']} threads), "
              f"{res['flop_s_median'] / 1e9:.2f} GFLOP/s = {res['flop_fraction']:.0%} of torch's matmuls on the same "
              f"shapes ({res['torch_matmul_flop_s'] / 1e9:.2f} GFLOP/s)")
        if a.runc:
            print(f"run.c (batch 1): {res['runc_tok_s_median']:.0f} tok/s median; batched / run.c = {res['batched_over_runc']:.1f}x")
        return _write_json(res, a.json)
    steps, repeats = (64, 3) if a.quick else (a.steps, a.repeats)
    res = bench_decode(a.model, a.tokenizer, steps, repeats, a.threads, a.backend, a.runc, a.prompt)
    print(f"decode {res['model']} ({a.backend}): {res['tok_s_median']:.1f} tok/s median over {repeats} runs of {res['steps']} "
          f"steps (min {res['tok_s_min']:.1f}, max {res['tok_s_max']:.1f}; {res['threads']} threads)")
    for part, us in res.get("profile_us_per_token", {}).items():
        print(f"  {part:<44} {us:8.0f} us/token")
    if a.runc:
        print(f"run.c: {res['runc_tok_s_median']:.1f} tok/s median (min {min(res['runc_tok_s_all']):.1f}, max "
              f"{max(res['runc_tok_s_all']):.1f}); {a.backend} / run.c = {res['over_runc']:.2f}x")
    return _write_json(res, a.json)
