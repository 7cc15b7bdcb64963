"""`python -m minillm bench peers`: minillm beside its peers on the same weights, greedy decode at several batch
sizes. The engine on its default backend ("minillm") and on torch ("minillm-torch"), Hugging Face transformers'
`generate` on the same weights converted in memory ("hf", its logits checked equal to minillm's first), and
llama2.c's run.c at batch 1 ("runc", with --runc: it has no batching).

One subprocess per engine per measurement (`python -m minillm.bench.peers --worker ENGINE ...`), so no engine's
thread pools, allocator or caches warm or slow the next; engines interleaved within each repeat, so a machine
that gets busier mid-run slows all of them alike. Rate = decode tokens / decode seconds (the tokens after the
first, which the prompt's forward already produced); import, load, conversion and a warm-up run excluded.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ENGINES = ("minillm", "minillm-torch", "hf")
PROMPT = "To be, or not to be"    # every engine starts from these token ids (run.c from this text: the same ids)
CHECK_TEXT = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer"
# HF against minillm, float32 both: the same math in a different association order (HF's rotate_half against
# interleaved pairs, SDPA against our attention) differs by ~1e-5 on logits of size ~20 (the shipped model);
# a conversion mistake (a missing RoPE permutation, a swapped weight) is off by 1e-2 or more.
LOGITS_ATOL = LOGITS_RTOL = 1e-4
QUICK = dict(batches=(1, 4), steps=16, repeats=1)


# ---------------------------------------------------------------------------- Hugging Face, in memory
def to_hf(net):
    """The same weights as a transformers model of the net's family (LlamaForCausalLM, Qwen2ForCausalLM or
    Qwen3ForCausalLM; float32, eval), built from what minillm.formats.hf_export would write: its config.json and
    its HF-named state (q/k rows back in HF's half-split RoPE layout)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..formats.hf_export import hf_config, hf_state_dict
    state, _ = hf_state_dict(net)
    tied = "lm_head.weight" not in state
    c = hf_config(net, tied, torch.float32, bos_id=1, stop_ids=[2], provenance={})
    for key in ("architectures", "minillm_export", "torch_dtype"):
        c.pop(key)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(c.pop("model_type"), pad_token_id=0, **c))
    hf = hf.to(torch.float32).eval()
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    hf.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    return hf


def check_hf_logits(net, hf, ids: list[int]) -> float:
    """HF's logits equal minillm's at every position of `ids` within LOGITS_ATOL + LOGITS_RTOL * |logit|, or a
    RuntimeError: a speed comparison is only worth something on the same function. -> the max |difference|."""
    import torch
    x = torch.tensor([ids])                                        # (1, T)
    with torch.no_grad():
        ours, theirs = net(x), hf(x).logits                         # (1, T, V) each
    diff = (ours - theirs).abs()
    bad = diff > LOGITS_ATOL + LOGITS_RTOL * theirs.abs()
    if bad.any():
        pos = int(bad.any(-1)[0].nonzero()[0])
        raise RuntimeError(f"HF transformers' logits differ from minillm's on the same weights: max |diff| "
                           f"{diff.max().item():.3g} (first at position {pos} of {len(ids)}), tolerance "
                           f"{LOGITS_ATOL:g} + {LOGITS_RTOL:g} x |logit|; the in-memory conversion is wrong")
    return diff.max().item()


# ---------------------------------------------------------------------------- one engine, in its own process
def prompt_ids(tok) -> list[int]:
    return tok.encode(PROMPT)


def _engine_runner(engine: str, net, tok, batches, steps: int):
    """-> (gen(batch, n) -> (decode tokens, decode seconds), info dict), everything slow done here."""
    import torch
    ids, longest = prompt_ids(tok), max(batches)
    if engine == "hf":
        from transformers import LogitsProcessor, LogitsProcessorList
        hf = to_hf(net)
        info = {"hf_logits_max_abs_diff": check_hf_logits(net, hf, tok.encode(CHECK_TEXT)[:net.config.max_seq_len])}

        class Stamps(LogitsProcessor):
            """Called once per new token, right after the forward that produced its logits."""
            def __init__(self):
                self.t = []

            def __call__(self, input_ids, scores):
                self.t.append(time.perf_counter())
                return scores

        def gen(batch: int, n: int):
            stamps, x = Stamps(), torch.tensor([ids] * batch)     # (B, P): identical prompts, identical lengths
            with torch.no_grad():
                out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                  min_new_tokens=n, logits_processor=LogitsProcessorList([stamps]),
                                  pad_token_id=0, eos_token_id=2)
            assert out.shape == (batch, len(ids) + n) and len(stamps.t) == n, (out.shape, len(stamps.t))
            return batch * (n - 1), stamps.t[-1] - stamps.t[0]     # tokens 2..n: n - 1 decode forwards
        return gen, info

    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    options = {} if engine == "minillm" else {"backend": "torch"}  # "minillm": whatever the default is
    llm = LLM(net, tokenizer=tok, max_num_seqs=longest, max_model_len=len(ids) + steps, **options)

    def gen(batch: int, n: int):
        trace = llm.engine.trace.steps
        before = len(trace)
        outs = llm.generate([ids] * batch, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        assert all(len(o.outputs[0].token_ids) == n for o in outs)
        run = trace[before:]
        first = next(i for i, s in enumerate(run) if s.kind == "decode")
        span = run[first:]                                          # first decode step's start to the last's end
        secs = span[-1].start + span[-1].seconds - span[0].start - sum(s.seconds for s in span if s.kind != "decode")
        return sum(s.num_decode_tokens for s in span if s.kind == "decode"), secs
    engine_ = llm.engine                                            # the backend "auto" resolved to, and why
    return gen, {"backend": getattr(engine_, "backend", llm.config.backend),
                 "backend_choice": getattr(engine_, "backend_choice", "")}


def worker_main(argv: list[str]) -> int:
    """`python -m minillm.bench.peers --worker ENGINE --model M --batches 1,8 --steps N --threads T`: load and
    prepare, print "ready", wait for "go" on stdin, then per batch a warm-up run and a timed one; prints one
    JSON line. stdout carries only this protocol (library prints go to stderr)."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m minillm.bench.peers")
    ap.add_argument("--worker", required=True, choices=ENGINES)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    a = ap.parse_args(argv)
    proto, sys.stdout = sys.stdout, sys.stderr
    try:
        return _work(a, proto)
    finally:
        sys.stdout = proto


def _work(a, proto) -> int:
    t0 = time.perf_counter()
    from ..formats.loader import load
    from ..threads import use_threads
    use_threads(a.threads)
    net, tok = load(a.model, a.tokenizer)
    batches = [int(b) for b in a.batches.split(",")]
    gen, info = _engine_runner(a.worker, net, tok, batches, a.steps)
    setup = time.perf_counter() - t0
    print("ready", file=proto, flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    runs = {}
    for b in batches:
        gen(b, min(a.steps, 8))                                     # warm-up: first-call costs, allocation
        n_tok, secs = gen(b, a.steps)
        runs[str(b)] = {"decode_tokens": n_tok, "decode_seconds": secs, "tok_s": n_tok / secs}
    import torch
    print(json.dumps({"engine": a.worker, "steps": a.steps, "prompt_tokens": len(prompt_ids(tok)),
                      "threads": torch.get_num_threads(), "setup_seconds": setup, "runs": runs, **info}),
          file=proto, flush=True)
    return 0


# ---------------------------------------------------------------------------- the parent: spawn, interleave, report
class Worker:
    """One engine's subprocess: started (imports, load, conversion), then released to measure."""

    def __init__(self, engine: str, model: str, tokenizer, batches, steps: int, threads: int):
        from ..paths import PACKAGE_DIR
        root = os.path.dirname(PACKAGE_DIR)                          # this minillm, wherever the caller's cwd is
        env = dict(os.environ, MINILLM_PROGRESS="0", OMP_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads),
                   PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        cmd = [sys.executable, "-m", "minillm.bench.peers", "--worker", engine, "--model", str(model),
               "--batches", ",".join(map(str, batches)), "--steps", str(steps), "--threads", str(threads)]
        cmd += ["--tokenizer", str(tokenizer)] if tokenizer else []
        self.what = f"peers worker {engine} (batch {','.join(map(str, batches))})"
        self.is_ready, self.err = False, tempfile.TemporaryFile("w+")   # stderr: a pipe left unread could block it
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env=env)

    def _fail(self):
        self.proc.kill()
        self.proc.wait()
        self.err.seek(0)
        tail = [line for line in self.err.read().splitlines() if line.strip()][-6:]
        raise RuntimeError(f"{self.what} failed (exit {self.proc.returncode}): " + " | ".join(tail))

    def ready(self):
        """Wait until it has loaded and prepared everything (it says "ready"); idempotent."""
        if not self.is_ready and self.proc.stdout.readline().strip() != "ready":
            self._fail()
        self.is_ready = True

    def measure(self) -> dict:
        """Release it ("go") and read its one JSON line; it exits after."""
        self.ready()
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if self.proc.wait() != 0 or not line:
            self._fail()
        self.err.close()
        return json.loads(line)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def parse_batches(text) -> tuple[int, ...]:
    try:
        batches = tuple(int(b) for b in str(text).split(","))
    except ValueError:
        batches = ()
    if not batches or min(batches) < 1:
        raise ValueError(f"--batches must be positive whole numbers separated by commas (e.g. 1,8,32), got {text!r}")
    return batches


def bench_peers(model: str = "shakespeare", tokenizer=None, batches=(1, 8, 32), steps: int = 64, repeats: int = 5,
                runc: str | None = None, quick: bool = False) -> dict:
    """Greedy decode tok/s of every engine at every batch size: median, min and max over `repeats`, each
    measurement its own subprocess, engines interleaved (repeat r: batch b: minillm, torch, hf, run.c).
    quick: batches 1 and 4, 16 steps, 1 repeat, and one subprocess per engine for both batches, all started
    at once so that their imports (torch ~3 s, transformers ~4 s more here) overlap, then measured one at a
    time: a smoke test."""
    from ..formats.loader import load
    from ..threads import fair_threads
    from .decode import check_runc, runc_files, runc_tok_s
    if quick:
        batches, steps, repeats = QUICK["batches"], QUICK["steps"], QUICK["repeats"]
    batches = parse_batches(",".join(map(str, batches)))
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"--repeats must be a whole number >= 1, got {repeats!r}")
    threads = fair_threads()                        # one count for every engine, run.c's OpenMP included
    # quick: started before the checks below, which they overlap; killed if a check fails
    workers = [Worker(e, model, tokenizer, batches, steps, threads) for e in ENGINES] if quick else []
    rates = {e: {str(b): [] for b in batches} for e in ENGINES}
    rates["runc"] = {"1": []} if runc and 1 in batches else {}
    info = {}

    def record(w: Worker):
        out = w.measure()
        info.setdefault(out["engine"], {k: v for k, v in out.items() if k != "runs"})
        for b, r in out["runs"].items():
            rates[out["engine"]][b].append(r["tok_s"])

    try:
        net, tok = load(model, tokenizer)
        n_prompt, limit = len(prompt_ids(tok)), net.config.max_seq_len
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2 or n_prompt + steps > limit:
            raise ValueError(f"--steps must be a whole number from 2 to {limit - n_prompt} ({model}'s context "
                             f"max_seq_len={limit} less the prompt's {n_prompt} tokens), got {steps!r}")
        files = runc_files(model, tokenizer, (net, tok)) if runc else None
        if runc:
            check_runc(runc, *files)                # before any long measurement: a wrong --runc fails now
        del net
        for w in workers:                           # quick: every one loaded before any measures
            w.ready()
        for _ in range(repeats):
            for b in batches:
                for e in ENGINES:
                    if not quick:
                        workers.append(Worker(e, model, tokenizer, [b], steps, threads))
                        record(workers[-1])
                    elif b == batches[0]:       # quick: one worker per engine measures every batch
                        record(workers[ENGINES.index(e)])
                if "1" in rates["runc"] and b == 1:
                    rates["runc"]["1"].append(runc_tok_s(runc, *files, n_prompt + steps, PROMPT, threads))
    finally:
        for w in workers:
            w.kill()
    engines = {e: {b: {"tok_s_median": statistics.median(v), "tok_s_min": min(v), "tok_s_max": max(v),
                       "tok_s_all": v} for b, v in per.items()} for e, per in rates.items() if per}
    ratios = {f"minillm / hf, batch {b}": engines["minillm"][str(b)]["tok_s_median"] /
              engines["hf"][str(b)]["tok_s_median"] for b in batches}
    if "runc" in engines:
        ratios["minillm / run.c, batch 1"] = (engines["minillm"]["1"]["tok_s_median"] /
                                              engines["runc"]["1"]["tok_s_median"])
    import platform

    import torch
    return {"bench": "peers", "model": str(model), "batches": list(batches), "steps": steps, "prompt_tokens": n_prompt,
            "repeats": repeats, "quick": quick, "threads": threads, "runc": runc, "engines": engines,
            "ratios": ratios, "minillm_backend": info["minillm"].get("backend"),
            "minillm_backend_choice": info["minillm"].get("backend_choice"),
            "setup_seconds": {e: info[e]["setup_seconds"] for e in ENGINES},   # import, load, convert: not timed
            "hf_logits_max_abs_diff": info["hf"]["hf_logits_max_abs_diff"],
            "hf_logits_tolerance": {"atol": LOGITS_ATOL, "rtol": LOGITS_RTOL}, "torch": torch.__version__,
            "transformers": _version("transformers"), "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count()}


def _version(package: str) -> str:
    from importlib.metadata import version
    return version(package)


def print_table(res: dict):
    """Engines down, batch sizes across: median tok/s (min-max over the repeats); then the ratios."""
    names = {"minillm": f"minillm ({res['minillm_backend']}: default)", "minillm-torch": "minillm (torch)",
             "hf": "HF transformers", "runc": "llama2.c run.c"}
    runs = f"{res['repeats']} run{'s' if res['repeats'] > 1 else ''}"
    procs = "one process per engine (quick)" if res["quick"] else "one process each"
    print(f"peers: {res['model']}, greedy, {res['prompt_tokens']}-token prompt + {res['steps']} new tokens per "
          f"sequence, {res['threads']} threads; decode tok/s, median (min-max) of {runs}, {procs}; "
          f"HF logits = minillm's within {res['hf_logits_max_abs_diff']:.1g}")
    cols = [str(b) for b in res["batches"]]
    print(f"{'engine':<26}" + "".join(f"{'batch ' + b:>20}" for b in cols))
    for e, per in res["engines"].items():
        cells = [f"{per[b]['tok_s_median']:.0f} ({per[b]['tok_s_min']:.0f}-{per[b]['tok_s_max']:.0f})"
                 if b in per else "-" for b in cols]
        print(f"{names[e]:<26}" + "".join(f"{c:>20}" for c in cells))
    for k, v in res["ratios"].items():
        print(f"{k}: {v:.2f}x")


# ---------------------------------------------------------------------------- python -m minillm bench peers
def add_parser(sub):
    """`bench peers`: its options, and run_cli to run it."""
    p = sub.add_parser("peers", help="minillm beside HF transformers and run.c on the same weights, batch 1 and up")
    p.add_argument("--model", default="shakespeare", help="registered name, random:<preset> or .bin file")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    p.add_argument("--steps", type=int, default=64, help="new tokens per sequence")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--runc", default=None, help="a run.c binary you built, timed at batch 1 (it has no batching)")
    p.add_argument("--quick", action="store_true", help="batches 1 and 4, 16 steps, 1 repeat: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    res = bench_peers(a.model, a.tokenizer, parse_batches(a.batches), a.steps, a.repeats, a.runc, a.quick)
    print_table(res)
    return res


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
