"""Decode benchmarks: batch-1 decode speed (beside llama2.c's run.c, with a per-token profile on numba) and
batched decode (against torch's own matmul FLOP/s on the same shapes, and beside run.c). Warm-up excluded,
medians of several runs, every ratio measured side by side in one run."""
from __future__ import annotations

import os
import platform
import statistics

import torch

from ..core.sampling import RunCSampler
from ..engine.runc import decode_loop
from ..formats.loader import load
from ..threads import auto_threads, check_threads, fair_threads, use_threads


def bench_decode(model: str, tokenizer=None, steps: int = 256, repeats: int = 5, threads: int | None = None,
                 backend: str = "auto", runc: str | None = None, prompt: str = "") -> dict:
    """Batch-1 greedy decode tok/s through `python -m minillm run`'s loop on this backend (compile time and
    warm-up excluded), beside llama2.c's run.c on the same file when `runc` names a binary you built
    (each run.c run its own process, alternated with ours)."""
    from ..backends.capabilities import backend_model, choose_backend
    from ..config import EngineConfig
    net, tok = load(model, tokenizer)
    files = runc_files(model, tokenizer, (net, tok)) if runc else None
    if runc:
        check_runc(runc, *files)                 # before any long measurement: a wrong --runc fails now
        prompt = prompt or RUNC_CHECK_PROMPT     # run.c with no prompt may sample BOS at once and print no rate
    backend, _ = choose_backend(EngineConfig(backend=backend), None, net)   # "auto": numba on a CPU
    net = backend_model(net, backend)
    if backend == "numba":       # as `run --backend numba`: numba's threads work, torch's would spin against them
        import numba
        n = check_threads(threads) if threads is not None else min(fair_threads(), numba.get_num_threads())
        numba.set_num_threads(n)
        torch.set_num_threads(1)
    elif threads is not None:
        use_threads(threads)
    else:
        auto_threads()          # the cores free now: a busy core makes a full-size pool spin-wait
    steps = min(steps, net.config.max_seq_len)
    greedy = RunCSampler(0.0, 0.9, 1)

    def run(n):
        return decode_loop(net, tok, greedy, prompt, n, write=None, stop_at_bos=False)[1]
    run(min(8, steps))  # warm-up: compilation (numba), allocation, first-call costs
    rates, rc = [], []
    if backend == "numba":
        net.compiled_seconds, net.compiled_calls = 0.0, 0           # count the timed runs only
    ours = numba_threads() if backend == "numba" else torch.get_num_threads()   # run.c's OpenMP gets as many
    for _ in range(repeats):
        rates.append(run(steps))
        if runc:
            rc.append(runc_tok_s(runc, *files, steps, prompt, ours))
    res = {"bench": "decode", "model": str(model), "backend": backend, "steps": steps, "repeats": repeats,
           "threads": numba_threads() if backend == "numba" else torch.get_num_threads(),
           "tok_s_median": statistics.median(rates), "tok_s_min": min(rates), "tok_s_max": max(rates),
           "tok_s_all": rates, "params": net.config.num_params(), "torch": torch.__version__,
           "machine": platform.processor() or platform.machine(),
           "cpus": os.cpu_count()}
    if runc:
        res.update(runc=runc, runc_tok_s_median=statistics.median(rc), runc_tok_s_all=rc,
                   over_runc=res["tok_s_median"] / statistics.median(rc))
    if backend == "numba":
        res["profile_us_per_token"] = numba_profile(net, statistics.mean(1e6 / r for r in rates))  # as compiled_seconds
    return res


def numba_threads() -> int:
    import numba
    return numba.get_num_threads()


def numba_profile(net, us_per_token: float) -> dict:
    """Where a batch-1 numba decode step's time went, in microseconds per token: inside the compiled
    forward (as NumbaTransformer timed it during the runs just made), of which the matmuls (the same
    kernels on the same weights, timed alone) and the rest (attention, norms, RoPE, SwiGLU, K/V writes);
    and the Python decode loop around it (tensors, metadata, sampling), us_per_token - forward.
    An estimate: the matmuls timed alone run at another moment and in other caches than the step's (the layers'
    weights alone may fit the last-level cache, which in a step the classifier's stream empties), so on a
    shared, noisy machine "the rest" can come out far too large or below zero; the compiled forward and the
    total are measured as they ran."""
    import time

    import numpy as np

    from ..kernels.matmul import linear_cpu
    w, cfg = net.w, net.config
    forward = net.compiled_seconds / max(1, net.compiled_calls) * 1e6
    x = np.full((1, cfg.dim), 0.1, np.float32)                       # (1, C)
    h = np.full((1, cfg.hidden_dim), 0.1, np.float32)                # (1, F)
    outs = {k: np.empty((1, w[k].shape[-2]), np.float32) for k in ("wqkv", "wo", "w13", "w2", "wcls")}

    def matmuls(layers: bool):
        if not layers:
            return linear_cpu(x, w["wcls"], outs["wcls"])
        for li in range(cfg.n_layers):
            for k in ("wqkv", "wo", "w13"):
                linear_cpu(x, w[k][li], outs[k])
            linear_cpu(h, w["w2"][li], outs["w2"])

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


class RuncError(ValueError):
    """--runc names something that is not a working run.c binary: the user's mistake, so a ValueError (the CLI
    prints one `error: ...` line and exits 2). A run.c that passed the check and fails later is a RuntimeError."""


RUNC_CHECK_PROMPT = "To be, or not to be"   # run.c prints its rate only past position 1; a prompt gets it there


def runc_files(model, tokenizer=None, loaded=None) -> tuple[str, str]:
    """(checkpoint .bin, tokenizer.bin) that run.c reads for `model`: a .bin file and `tokenizer` or the
    tokenizer.bin beside it; a registered model's own files; anything else (random:<preset>, a HF directory)
    written with save_bin and Tokenizer.save into a temporary folder removed when this process exits, from
    `loaded` = (net, tok) when the caller has it (else loaded here). run.c needs files; the engine does not."""
    import atexit
    import shutil
    import tempfile

    from ..formats.llama2c import save_bin
    from ..formats.loader import MODELS_DIR, REGISTRY
    if isinstance(tokenizer, (str, os.PathLike)) and (os.path.isdir(tokenizer) or str(tokenizer).endswith(".json")):
        raise ValueError(f"run.c reads a llama2.c tokenizer.bin, not {tokenizer}")
    tk = os.fspath(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else None
    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        return os.fspath(model), tk or os.path.join(os.path.dirname(os.path.abspath(model)), "tokenizer.bin")
    if isinstance(model, str) and model in REGISTRY:
        ck, reg_tk = REGISTRY[model]
        return os.path.join(MODELS_DIR, ck), tk or os.path.join(MODELS_DIR, reg_tk)
    net, tok = loaded if loaded is not None else load(model, tokenizer)
    if tk is None and not hasattr(tok, "save"):
        raise ValueError(f"run.c reads a llama2.c tokenizer.bin; {model}'s tokenizer is {type(tok).__name__}: "
                         f"pass --tokenizer a tokenizer.bin")
    folder = tempfile.mkdtemp(prefix="minillm-runc-")
    atexit.register(shutil.rmtree, folder, True)
    save_bin(net, os.path.join(folder, "model.bin"))
    if tk is None:
        tk = os.path.join(folder, "tokenizer.bin")
        tok.save(tk)
    return os.path.join(folder, "model.bin"), tk


def check_runc(runc: str, model_bin: str, tokenizer_bin: str, timeout: float = 60.0):
    """Up front, before any long measurement: `runc` is an executable file that runs a 4-position greedy
    generation on these files and prints run.c's "achieved tok/s" line. Else a RuncError naming the path and
    what was expected."""
    import subprocess
    want = "llama2.c's run.c binary that you built (e.g. `make runomp` in llama2.c)"
    if not os.path.exists(runc):
        raise RuncError(f"--runc {runc}: no such file; expected {want}")
    if not os.path.isfile(runc):
        raise RuncError(f"--runc {runc} is not a file; expected {want}")
    if not os.access(runc, os.X_OK):
        raise RuncError(f"--runc {runc} is not executable (chmod +x it); expected {want}")
    cmd = [runc, model_bin, "-z", tokenizer_bin, "-t", "0", "-n", "4", "-i", RUNC_CHECK_PROMPT]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except OSError as e:                                    # e.g. an executable text file without a #! line
        raise RuncError(f"--runc {runc} could not be started ({e.strerror}); expected {want}") from None
    except subprocess.TimeoutExpired:
        raise RuncError(f"--runc {runc} did not finish a 4-token run in {timeout:g} s; expected {want}") from None
    if "achieved tok/s" not in done.stderr:
        said = " ".join((done.stderr or done.stdout)[-200:].split())
        how = f"failed (exit {done.returncode})" if done.returncode else "exited 0 but is not run.c"
        raise RuncError(f"--runc {runc} {how}: a 4-token greedy run on {model_bin} printed no 'achieved tok/s' "
                        f"line on stderr (it said: {said!r}); expected {want}")


def runc_tok_s(runc: str, model: str, tokenizer: str, steps: int, prompt: str = "",
               threads: int | None = None) -> float:
    """One run of a llama2.c run.c binary (built by the user, outside this repo), greedy from `prompt`;
    its own "achieved tok/s" line (stderr). run.c stops early if it samples BOS: give a prompt that
    keeps a random-weight model going. threads: OMP_NUM_THREADS for an OpenMP build (default: as inherited)."""
    import re
    import subprocess
    env = dict(os.environ, OMP_NUM_THREADS=str(threads)) if threads else None
    done = subprocess.run([runc, model, "-z", tokenizer, "-t", "0", "-n", str(steps), "-i", prompt],
                          capture_output=True, text=True, timeout=600, env=env)
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
    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    net, tok = load(model, tokenizer)
    files = runc_files(model, tokenizer, (net, tok)) if runc else None
    if runc:
        check_runc(runc, *files)                 # before any long measurement: a wrong --runc fails now
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
        rc = [runc_tok_s(runc, *files, steps, RUNC_CHECK_PROMPT, torch.get_num_threads())   # a prompt: no BOS stop
              for _ in range(repeats)]
        res.update(runc=runc, runc_tok_s_median=statistics.median(rc), runc_tok_s_all=rc,
                   batched_over_runc=res["tok_s_median"] / statistics.median(rc))
    return res


def bench_decode_busy(model: str, tokenizer=None, steps: int = 64, repeats: int = 3, backend: str = "auto") -> dict:
    """Batch-1 decode idle and beside one busy loop (a CPU hog), each measurement its own `bench decode`
    process: with the default thread choice (the free cores) and with one thread per core (what torch
    would use on its own). Ratios busy / idle say how much of its speed decode keeps on a busy machine."""
    import json
    import subprocess
    import sys
    import tempfile

    from ..threads import num_cores

    def measure(threads):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            cmd = [sys.executable, "-m", "minillm", "bench", "decode", "--model", str(model), "--steps", str(steps),
                   "--repeats", str(repeats), "--backend", backend, "--json", out]
            cmd += ["--tokenizer", tokenizer] if tokenizer else []
            cmd += ["--threads", str(threads)] if threads else []
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            return json.load(open(out))
    cores, res = num_cores(), {}
    res["idle, free cores"] = measure(None)
    res["idle, one per core"] = measure(cores)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        res["busy, free cores"] = measure(None)
        res["busy, one per core"] = measure(cores)
    finally:
        hog.kill()
        hog.wait()
    rate = {k: v["tok_s_median"] for k, v in res.items()}
    return {"bench": "decode-busy", "model": str(model), "backend": backend, "cores": cores, "steps": steps,
            "repeats": repeats, "runs": {k: {"threads": v["threads"], "tok_s_median": v["tok_s_median"],
                                            "tok_s_min": v["tok_s_min"], "tok_s_max": v["tok_s_max"]}
                                        for k, v in res.items()},
            "ratios": {"busy / idle, free cores": rate["busy, free cores"] / rate["idle, free cores"],
                       "busy / idle, one per core": rate["busy, one per core"] / rate["idle, one per core"]}}


# ---------------------------------------------------------------------------- python -m minillm bench batched, decode
def add_batched_parser(sub):
    """`bench batched`: its options, and run_batched_cli to run it."""
    p = sub.add_parser("batched", help="batched decode tok/s and FLOP/s, beside llama2.c's run.c (--runc)")
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--runc", default=None, help="a run.c binary you built (e.g. llama2.c's `make runomp`)")
    p.add_argument("--quick", action="store_true", help="batch 4, 16 steps, 1 repeat: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_batched_cli)


def run_batched_cli(a) -> dict:
    batch, steps, repeats = (4, 16, 1) if a.quick else (a.batch, a.steps, a.repeats)
    res = bench_batched(a.model, a.tokenizer, batch, steps, repeats, a.runc)
    print(f"batched decode, {batch} sequences: {res['tok_s_median']:.0f} tok/s median ({res['threads']} threads), "
          f"{res['flop_s_median'] / 1e9:.2f} GFLOP/s = {res['flop_fraction']:.0%} of torch's matmuls on the same "
          f"shapes ({res['torch_matmul_flop_s'] / 1e9:.2f} GFLOP/s)")
    if a.runc:
        print(f"run.c (batch 1): {res['runc_tok_s_median']:.0f} tok/s median; "
              f"batched / run.c = {res['batched_over_runc']:.1f}x")
    return res


def add_parser(sub):
    """`bench decode`: its options, and run_cli to run it."""
    p = sub.add_parser("decode", help="batch-1 decode tok/s (median of several runs)")
    p.add_argument("--model", required=True, help="registered name, random:<preset>, .bin file or HF dir")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--steps", type=int, default=256, help="positions per run, as run.c's -n")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="default: the cores free now (minillm/threads.py)")
    p.add_argument("--busy", action="store_true", help="idle, then beside a busy loop, each in its own process: "
                                                       "free-core threads against one thread per core")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "numba", "cuda"],
                   help="default auto: the engine's choice (numba on a CPU)")
    p.add_argument("--runc", default=None, help="a run.c binary you built, timed on the same file (-n steps, greedy)")
    p.add_argument("--prompt", default="",
                   help="the same prompt for both (default with --runc: 'To be, or not to be', since run.c stops at "
                        "BOS and a prompt keeps it going)")
    p.add_argument("--quick", action="store_true", help="3 runs of 64 steps: a smoke test")
    p.add_argument("--json", default=None, help="also write the result to this file")
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    steps, repeats = (64, 3) if a.quick else (a.steps, a.repeats)
    if a.busy:
        res = bench_decode_busy(a.model, a.tokenizer, steps, repeats, a.backend)
        for label, r in res["runs"].items():
            print(f"{label:<20} {r['threads']} threads: {r['tok_s_median']:7.1f} tok/s median "
                  f"(min {r['tok_s_min']:.1f}, max {r['tok_s_max']:.1f})")
        for k, v in res["ratios"].items():
            print(f"{k}: {v:.2f}x")
        return res
    res = bench_decode(a.model, a.tokenizer, steps, repeats, a.threads, a.backend, a.runc, a.prompt)
    print(f"decode {res['model']} ({res['backend']}): {res['tok_s_median']:.1f} tok/s median over {repeats} runs "
          f"of {res['steps']} steps (min {res['tok_s_min']:.1f}, max {res['tok_s_max']:.1f}; {res['threads']} threads)")
    for part, us in res.get("profile_us_per_token", {}).items():
        print(f"  {part:<44} {us:8.0f} us/token")
    if a.runc:
        print(f"run.c: {res['runc_tok_s_median']:.1f} tok/s median (min {min(res['runc_tok_s_all']):.1f}, max "
              f"{max(res['runc_tok_s_all']):.1f}); {res['backend']} / run.c = {res['over_runc']:.2f}x")
    return res
