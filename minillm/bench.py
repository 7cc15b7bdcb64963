"""`python -m minillm bench decode`: batch-1 decode speed, warm-up excluded, median of several runs."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys

import torch

from .loader import load
from .runc import decode_loop
from .sampling import RunCSampler


def bench_decode(model: str, tokenizer=None, steps: int = 256, repeats: int = 5, threads: int | None = None) -> dict:
    net, tok = load(model, tokenizer)
    if threads:
        torch.set_num_threads(threads)
    steps = min(steps, net.config.max_seq_len)
    greedy = RunCSampler(0.0, 0.9, 1)
    run = lambda n: decode_loop(net, tok, greedy, "", n, write=None, stop_at_bos=False)[1]
    run(min(8, steps))  # warm-up: allocation, first-call costs
    rates = [run(steps) for _ in range(repeats)]
    return {"bench": "decode", "model": str(model), "steps": steps, "repeats": repeats,
            "threads": torch.get_num_threads(), "tok_s_median": statistics.median(rates),
            "tok_s_min": min(rates), "tok_s_max": max(rates), "tok_s_all": rates,
            "params": net.config.num_params(), "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm bench")
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("decode", help="batch-1 decode tok/s (median of several runs)")
    d.add_argument("--model", required=True, help="registered name, random:<preset>, .bin file or HF dir")
    d.add_argument("--tokenizer", default=None)
    d.add_argument("--steps", type=int, default=256, help="positions per run, as run.c's -n")
    d.add_argument("--repeats", type=int, default=5)
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--quick", action="store_true", help="3 runs of 64 steps: a smoke test")
    d.add_argument("--json", default=None, help="also write the result to this file")
    a = ap.parse_args(argv)
    steps, repeats = (64, 3) if a.quick else (a.steps, a.repeats)
    res = bench_decode(a.model, a.tokenizer, steps, repeats, a.threads)
    print(f"decode {res['model']}: {res['tok_s_median']:.1f} tok/s median over {repeats} runs of {res['steps']} steps "
          f"(min {res['tok_s_min']:.1f}, max {res['tok_s_max']:.1f}; {res['threads']} threads)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0
