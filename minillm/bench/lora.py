"""`python -m minillm bench lora`: several LoRA adapters in one batch against one merged model, speed and memory.

The workload: `seqs` greedy requests (prompts cut from the packaged held-out slice, `max_tokens` new tokens each,
ignore_eos for exact lengths). Three engines on the same base weights, all on the torch backend (enable_lora runs
there only, and a merged model on the same backend compares the LoRA op, not the backend):
    merged     the first adapter merged into a copy of the model (W + s B A), no adapter at run time
    lora x1    enable_lora, every request the first adapter (one group: no gather)
    lora mixed enable_lora, the requests cycling through the adapters (S-LoRA's case: rows grouped per adapter)
Generated tokens per second of each, measured in one process with the runs interleaved (merged, x1, mixed, merged,
...), median of `repeats`; the ratio mixed / merged is the goal (>= 0.7). Memory: what one more adapter costs
(its A and B) against what one more merged copy costs (the whole model), and the slot stacks enable_lora allocates.
"""
from __future__ import annotations

import os
import statistics
import time

SHIPPED = ("comedies", "tragedies", "histories")


def prompts_from_slice(tok, n: int, tokens: int) -> list:
    """n prompts of `tokens` token ids (BOS first), consecutive pieces of the packaged held-out slice."""
    from ..formats.loader import MODELS_DIR
    ids = tok.encode(open(os.path.join(MODELS_DIR, "val_slice.txt"), encoding="utf-8").read(), bos=False, eos=False)
    step = max(1, (len(ids) - tokens) // n)
    return [[tok.bos_id] + ids[i * step:i * step + tokens - 1] for i in range(n)]


def bench_lora(model: str = "shakespeare", adapters=SHIPPED, seqs: int = 32, prompt_tokens: int = 32,
               max_tokens: int = 64, repeats: int = 5, max_loras: int = 4) -> dict:
    import torch

    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    from ..formats.loader import load
    from ..formats.peft import load_adapter
    from ..lora.adapters import LoRAAdapter, merge_lora
    base, tok = load(model)
    ads = [a if isinstance(a, LoRAAdapter) else load_adapter(a, base.config) for a in adapters]
    prompts = prompts_from_slice(tok, seqs, prompt_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    common = dict(tokenizer=tok, backend="torch", max_num_seqs=seqs)
    runs = {"merged": (LLM(merge_lora(base, ads[0]), **common), None),
            "lora x1": (LLM(base, enable_lora=True, max_loras=max_loras, **common), [ads[0]] * seqs),
            "lora mixed": (LLM(base, enable_lora=True, max_loras=max_loras, **common),
                           [ads[i % len(ads)] for i in range(seqs)])}
    seconds = {k: [] for k in runs}
    outputs = {}
    for r in range(repeats + 1):                         # the first round warms up (not counted)
        for label, (llm, lora) in runs.items():
            t = time.perf_counter()
            outs = llm.generate(prompts, params, lora=lora)
            if r:
                seconds[label].append(time.perf_counter() - t)
            outputs[label] = [o.outputs[0].token_ids for o in outs]
    tokens = seqs * max_tokens
    res = {"model": model, "adapters": [a.name for a in ads], "seqs": seqs, "prompt_tokens": prompt_tokens,
           "max_tokens": max_tokens, "repeats": repeats, "threads": torch.get_num_threads(), "runs": {}}
    for label in runs:
        res["runs"][label] = {"tok_s_median": tokens / statistics.median(seconds[label]),
                              "tok_s_all": [tokens / s for s in seconds[label]]}
    ratios = [m / x for m, x in zip(seconds["merged"], seconds["lora mixed"])]      # per round, side by side
    x1 = [m / x for m, x in zip(seconds["merged"], seconds["lora x1"])]
    res["mixed_over_merged"], res["x1_over_merged"] = statistics.median(ratios), statistics.median(x1)
    res["mixed_over_merged_range"], res["x1_over_merged_range"] = (min(ratios), max(ratios)), (min(x1), max(x1))
    first = [i for i in range(seqs) if i % len(ads) == 0]    # the mixed batch's rows of the merged adapter
    res["greedy_equal_to_merged"] = sum(outputs["lora mixed"][i] == outputs["merged"][i] for i in first)
    res["greedy_compared"] = len(first)
    slots = runs["lora mixed"][0].engine.parts.lora
    res["memory"] = {"adapter_bytes": [a.nbytes for a in ads],
                     "merged_copy_bytes": sum(p.numel() * p.element_size() for p in base.parameters()),
                     "slot_stack_bytes": slots.nbytes, "max_loras": max_loras,
                     "adapter_loads": slots.loads, "adapter_evictions": slots.evictions}
    return res


def print_report(res: dict):
    print(f"{res['seqs']} sequences x {res['max_tokens']} new tokens (prompts {res['prompt_tokens']} tokens), greedy, "
          f"torch backend, {res['threads']} threads; median of {res['repeats']} interleaved rounds")
    for label, r in res["runs"].items():
        print(f"  {label:<11} {r['tok_s_median']:8.0f} tok/s  (min {min(r['tok_s_all']):.0f}, "
              f"max {max(r['tok_s_all']):.0f})")
    print(f"lora mixed ({len(res['adapters'])} adapters) / merged = {res['mixed_over_merged']:.2f}x; "
          f"lora x1 / merged = {res['x1_over_merged']:.2f}x (goal: mixed >= 0.7x)")
    print(f"greedy tokens of the mixed batch's {res['adapters'][0]} rows equal the merged model's: "
          f"{res['greedy_equal_to_merged']} of {res['greedy_compared']} sequences")
    m = res["memory"]
    per, copy, n = statistics.mean(m["adapter_bytes"]), m["merged_copy_bytes"], len(m["adapter_bytes"])
    print(f"memory: one adapter {per / 2**20:.2f} MiB (float32) vs one merged copy {copy / 2**20:.1f} MiB "
          f"({copy / per:.0f}x); slot stacks for max_loras={m['max_loras']} at max rank "
          f"{m['slot_stack_bytes'] / 2**20:.2f} MiB; base + {n} adapters "
          f"{(copy + sum(m['adapter_bytes'])) / 2**20:.1f} MiB vs {n} merged copies {n * copy / 2**20:.1f} MiB")


# ---------------------------------------------------------------------------- python -m minillm bench lora
def add_parser(sub):
    """`bench lora`: its options, and run_cli to run it."""
    p = sub.add_parser("lora", help="LoRA: several adapters in one batch against one merged model, tok/s and bytes")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--adapters", default="comedies,tragedies,histories", help="comma-separated names or directories")
    p.add_argument("--seqs", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="8 sequences, 8 tokens, 1 round: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    seqs, tokens, repeats = (8, 8, 1) if a.quick else (a.seqs, a.max_tokens, a.repeats)
    res = bench_lora(a.model, a.adapters.split(","), seqs, max_tokens=tokens, repeats=repeats)
    print_report(res)
    return res
