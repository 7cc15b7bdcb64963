"""`python -m minillm bench spec`: speculative decoding, per proposer and gamma, beside plain decoding of
the same requests, all in one process.

Workload: held-out prompts (windows of the packaged val_slice.txt, BOS + 63 tokens), 128 new tokens each
(ignore_eos), at temperature 0 and 1 (a seed per request), served at batch 1 (max_num_seqs=1: one request
after another, the latency case speculation is for); then the best proposer at larger batches.

Measured per configuration, from the engine's own trace and counters (notation: p target, q draft):
    t1     the plain run's mean decode step: the target's one-token step, engine included (means throughout,
           so that t1, r and the measured ratio of summed step times are the same kind of number)
    alpha  mean over examined draft slots of sum_x min(p, q) (greedy: [x == argmax p])
    acceptance   accepted / drafted: below alpha, as drafts after a step's first rejection are never examined
    c      draft time per drafted token / t1
    r      mean (speculative step - its drafting) / t1: the target's forward over k + 1 tokens plus verification
    predicted    E(alpha, gamma) / (gamma c + r), E = (1 - alpha^(gamma+1)) / (1 - alpha)
    predicted_k  the same with the drafts actually made: mean over steps of E(alpha, k_step) / (mean k c + r)
                 (n-gram lookup drafts nothing when the context has no match; drafts are cut near max_tokens)
    measured     plain decode time / speculative decode time (sums of decode steps), and the wall-clock ratio
                 including the (identical) prefills
"""
from __future__ import annotations

import os
import statistics
import time

import torch

from ..formats.loader import MODELS_DIR, load
from ..spec_decode.config import expected_tokens, predicted_speedup
from .timing import interleaved

# (label, speculative dict or None, temperatures it runs at)
CONFIGS = [
    ("draft", {"method": "draft", "draft_backend": "numba"}, (1, 2, 4)),
    ("draft (torch)", {"method": "draft", "draft_backend": "torch"}, (2,)),
    ("ngram", {"method": "ngram"}, (2, 4, 8)),
    ("medusa", {"method": "medusa"}, (1, 3)),          # greedy only
]
QUICK = [("draft", {"method": "draft", "draft_backend": "numba"}, (2,)), ("ngram", {"method": "ngram"}, (4,)),
         ("medusa", {"method": "medusa"}, (2,))]


def held_out_prompts(tok, n: int, length: int = 64) -> list[list[int]]:
    """n prompts of `length` tokens (BOS first), spread over the held-out slice."""
    ids = tok.encode(open(os.path.join(MODELS_DIR, "val_slice.txt"), encoding="utf-8").read())
    stride = max(length, (len(ids) - length) // max(n, 1))
    if (n - 1) * stride + length - 1 > len(ids):
        raise ValueError(f"the held-out slice has {len(ids)} tokens: too few for {n} prompts of {length}")
    return [[1] + ids[i * stride:i * stride + length - 1] for i in range(n)]


def start_engine(model, tok, prompt: list, temperature: float, spec=None, batch: int = 1):
    """One LLM and a warm-up request on `prompt` (compiles, fills caches), so no timed run pays for them."""
    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    llm = LLM(model, tokenizer=tok, max_num_seqs=batch, speculative=spec)
    llm.generate([prompt], SamplingParams(temperature=temperature, max_tokens=8, ignore_eos=True, seed=99))
    return llm


def timed_run(llm, prompts, temperature: float, max_tokens: int) -> dict:
    """Every prompt through a warmed engine (a seed per request): -> times and counters from its trace."""
    from ..core.sampling import SamplingParams
    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=i)
              for i in range(len(prompts))]
    eng = llm.engine
    eng.trace.steps.clear()
    for k in eng.spec_stats:
        eng.spec_stats[k] = 0
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    dec = [s for s in eng.trace.steps if s.kind == "decode"]
    return {"wall": wall, "decode_seconds": sum(s.seconds for s in dec),
            "step_mean": statistics.mean(s.seconds for s in dec),
            "tokens": sum(len(o.outputs[0].token_ids) for o in outs), "outputs": [o.outputs[0].token_ids for o in outs],
            "steps": dec, "stats": dict(eng.spec_stats)}


def run_once(model, tok, prompts, temperature: float, max_tokens: int, spec=None, batch: int = 1) -> dict:
    """One LLM, warmed up, then every prompt once."""
    return timed_run(start_engine(model, tok, prompts[0], temperature, spec, batch), prompts, temperature, max_tokens)


def interleaved_runs(engines: dict, prompts, temperature: float, max_tokens: int, repeats: int) -> dict:
    """Rounds of every (warmed) engine serving the same prompts, the order rotating from round to round, so drift
    on a busy machine lands on all alike: -> {key: [one timed_run per round]}."""
    runs = {k: [] for k in engines}

    def one(k):
        def go():
            runs[k].append(timed_run(engines[k], prompts, temperature, max_tokens))
            return runs[k][-1]["decode_seconds"]
        return go
    interleaved({k: one(k) for k in engines}, repeats=repeats, warmup=0)
    return runs


def _median_row(rounds: list) -> dict:
    """Rows of one configuration, one per round (each against that round's plain run): the median of every number,
    with the measured speedup's min and max beside it."""
    row = {k: (statistics.median(r[k] for r in rounds) if isinstance(v, float) else v) for k, v in rounds[0].items()}
    row["measured_min"], row["measured_max"] = (f(r["measured"] for r in rounds) for f in (min, max))
    row["same_as_plain"] = all(r["same_as_plain"] for r in rounds)
    row["rounds"] = len(rounds)
    return row


def analyse(label: str, gamma: int, run: dict, plain: dict) -> dict:
    st, t1 = run["stats"], plain["step_mean"]
    alpha = st["alpha_sum"] / st["examined"] if st["examined"] else 0.0
    ks = [len(e["drafted"]) for s in run["steps"] for e in s.spec]                       # drafts per sequence-step
    k_mean = sum(ks) / max(len(ks), 1)
    c = (st["draft_seconds"] / st["drafted"] / t1) if st["drafted"] else 0.0
    rows_per_step = st["rows"] / max(st["steps"], 1)
    r = (statistics.mean(s.seconds - s.draft_seconds for s in run["steps"]) / rows_per_step / t1
         if batch_of(run) == 1 else float("nan"))
    e_k = sum(expected_tokens(alpha, k) for k in ks) / max(len(ks), 1)
    return {"proposer": label, "gamma": gamma, "alpha": alpha, "c": c, "r": r, "k_mean": k_mean,
            "acceptance": st["accepted"] / st["drafted"] if st["drafted"] else 0.0,
            "tokens_per_step": st["emitted"] / max(st["rows"], 1), "expected_tokens": expected_tokens(alpha, gamma),
            "predicted": predicted_speedup(alpha, gamma, c, r), "predicted_k": e_k / (k_mean * c + r),
            "measured": plain["decode_seconds"] / run["decode_seconds"], "wall_speedup": plain["wall"] / run["wall"],
            "same_as_plain": run["outputs"] == plain["outputs"]}


def _rows_per_step(run: dict) -> float:
    """Sequences decoding together in a mean decode step (the batch the sweep reached)."""
    return statistics.mean(len(s.seq_ids) for s in run["steps"]) if run["steps"] else 0.0


def batch_of(run: dict) -> int:
    return max((len(s.seq_ids) for s in run["steps"]), default=1)


def bench_spec(model: str = "shakespeare", tokenizer=None, prompts: int = 32, max_tokens: int = 128,
               temperatures=(0.0, 1.0), configs=None, batches=(1, 4, 16), repeats: int = 3, log=print) -> dict:
    """Per temperature: the plain engine and one engine per (proposer, gamma), each warmed up, then `repeats`
    rounds in which every engine serves the same prompts, the order rotating. A row's numbers are medians over the
    rounds, each round's speedup taken against the plain run of the same round (measured_min, measured_max: the
    spread). The best row by median is then swept over batch sizes the same way."""
    net, tok = load(model, tokenizer)
    ps = held_out_prompts(tok, prompts)
    configs = configs or CONFIGS
    rows, plains = [], {}
    for T in temperatures:
        keys = [(label, g) for label, spec, gammas in configs for g in gammas
                if not (spec["method"] == "medusa" and T > 0)]                # Medusa is built greedy-only
        specs = {(label, g): {**spec, "gamma": g} for label, spec, gammas in configs for g in gammas}
        engines = {"plain": start_engine(net, tok, ps[0], T)}
        engines.update({k: start_engine(net, tok, ps[0], T, specs[k]) for k in keys})
        runs = interleaved_runs(engines, ps, T, max_tokens, repeats)
        plains[T] = runs["plain"]
        log(f"T={T:g}: plain decode step {statistics.median(p['step_mean'] for p in runs['plain']) * 1e3:.2f} ms")
        for label, g in keys:
            row = _median_row([analyse(label, g, run, plain) for run, plain in zip(runs[(label, g)], runs["plain"])])
            row["temperature"] = T
            rows.append(row)
            log(f"  {label:<14} gamma {g}: alpha {row['alpha']:.3f}  c {row['c']:.3f}  r {row['r']:.2f}  "
                f"predicted {row['predicted_k']:.2f}x  measured {row['measured']:.2f}x "
                f"({row['measured_min']:.2f}-{row['measured_max']:.2f})")
        del engines, runs
    best = max(rows, key=lambda r: r["measured"])
    sweep, T = [], best["temperature"]
    spec = {**next(s for lab, s, _ in configs if lab == best["proposer"]), "gamma": best["gamma"]}
    for b in batches:                                                # does speculation still pay as the batch grows?
        pb = ps if b <= len(ps) else held_out_prompts(tok, b)        # at least b requests, so b of them run together
        engines = {"plain": start_engine(net, tok, pb[0], T, batch=b),
                   "spec": start_engine(net, tok, pb[0], T, spec, b)}
        runs = interleaved_runs(engines, pb, T, max_tokens, repeats)
        speedups = [p["decode_seconds"] / s["decode_seconds"] for p, s in zip(runs["plain"], runs["spec"])]
        med = {k: {f: statistics.median(r[f] for r in runs[k]) for f in ("decode_seconds", "step_mean", "tokens")}
               for k in runs}
        sweep.append({"batch": b, "plain_tok_s": med["plain"]["tokens"] / med["plain"]["decode_seconds"],
                      "spec_tok_s": med["spec"]["tokens"] / med["spec"]["decode_seconds"],
                      "speedup": statistics.median(speedups), "speedup_min": min(speedups),
                      "speedup_max": max(speedups),
                      # the speedup's two factors: tokens each sequence gains per step, over the step's cost
                      "tokens_per_step": statistics.median(r["stats"]["emitted"] / max(r["stats"]["rows"], 1)
                                                           for r in runs["spec"]),
                      "plain_step_ms": med["plain"]["step_mean"] * 1e3, "spec_step_ms": med["spec"]["step_mean"] * 1e3,
                      "plain_rows_per_step": _rows_per_step(runs["plain"][0]),
                      "spec_rows_per_step": _rows_per_step(runs["spec"][0])})
        log(f"  batch {b}: {best['proposer']} gamma {best['gamma']} at T={T:g}: {sweep[-1]['speedup']:.2f}x "
            f"({min(speedups):.2f}-{max(speedups):.2f})")
    return {"bench": "spec", "model": str(model), "prompts": prompts, "prompt_tokens": len(ps[0]),
            "max_tokens": max_tokens, "threads": torch.get_num_threads(), "repeats": repeats,
            "t1_ms": {str(T): statistics.median(p["step_mean"] for p in ps_) * 1e3 for T, ps_ in plains.items()},
            "rows": rows,
            "best": {k: best[k] for k in ("proposer", "gamma", "temperature", "measured", "measured_min",
                                          "measured_max", "wall_speedup")},
            "batch_sweep": sweep,
            "goals": {"within_15pct": all(abs(r["measured"] / r["predicted_k"] - 1) <= 0.15 for r in rows),
                      "best_at_least_2x": best["measured"] >= 2.0}}


def print_table(res: dict):
    """One line per (temperature, proposer, gamma), 80 columns wide: alpha, accepted / drafted, the costs c and
    r, tokens per target step, the predicted (with the drafts made) and measured decode speedups."""
    print(f"{res['model']}: {res['prompts']} held-out prompts of {res['prompt_tokens']} tokens, "
          f"{res['max_tokens']} new, batch 1, {res['threads']} threads; medians of {res['repeats']} interleaved "
          "rounds; plain decode step " + ", ".join(f"{v:.2f} ms at T={k}" for k, v in res["t1_ms"].items()))
    cols = [("alpha", "alpha"), ("acceptance", "acc/dr"), ("c", "c"), ("r", "r"), ("tokens_per_step", "tok/st"),
            ("predicted_k", "pred"), ("measured", "meas")]
    print(f"{'T':>3} {'proposer':<14}{'gamma':>5}" + "".join(f"{h:>7}" for _, h in cols) + f"{'range':>11}  same")
    for r in res["rows"]:
        print(f"{r['temperature']:>3g} {r['proposer']:<14}{r['gamma']:>5}" +
              "".join(f"{r.get(c, float('nan')):>7.2f}" for c, _ in cols) +
              f"{r['measured_min']:>6.2f}-{r['measured_max']:<4.2f}"
              f"  {r['same_as_plain'] if r['temperature'] == 0 else '-'}")
    print("acc/dr: accepted / drafted; tok/st: tokens per target step; pred: predicted speedup (drafts made); "
          "meas: measured (median); range: its min-max over the rounds")
    b = res["best"]
    print(f"the best configuration ({b['proposer']} gamma {b['gamma']}, T={b['temperature']:g}) as the batch grows:")
    for s in res["batch_sweep"]:
        print(f"batch {s['batch']:>3}: plain {s['plain_tok_s']:8.0f} tok/s, speculative {s['spec_tok_s']:8.0f} tok/s, "
              f"{s['speedup']:.2f}x ({s['speedup_min']:.2f}-{s['speedup_max']:.2f})")
    b, g = res["best"], res["goals"]
    print(f"best: {b['proposer']} gamma {b['gamma']} at T={b['temperature']:g}: {b['measured']:.2f}x decode "
          f"({b['measured_min']:.2f}-{b['measured_max']:.2f}), "
          f"{b['wall_speedup']:.2f}x wall-clock; goals: measured within 15% of predicted_k for every row: "
          f"{g['within_15pct']}; best >= 2x: {g['best_at_least_2x']}")


@torch.inference_mode()
def pass_cost(model, counts=(1, 2, 4, 8, 16), context: int = 64, repeats: int = 15) -> dict:
    """Why verification is nearly free at batch 1: seconds for one forward that scores n new tokens after
    `context` cached ones, for each n in counts (median of `repeats` rounds, the counts in turn). -> {n: seconds}."""
    from ..llama.attention import AttentionMetadata
    from ..llama.kv_cache import KVCache
    total = context + max(counts)
    kv = KVCache(model.config, num_blocks=total, block_size=1, dtype=next(model.parameters()).dtype)
    table = torch.arange(total)[None]                                              # (1, total)
    ids = torch.randint(3, model.config.vocab_size, (1, total), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(context)[None]
    model(ids[:, :context], pos, kv, AttentionMetadata.build(pos, table, torch.tensor([context]), 1))
    def scoring(n):
        pos = torch.arange(context, context + n)[None]                             # (1, n)
        attn = AttentionMetadata.build(pos, table, torch.tensor([context + n]), 1)
        return lambda: model(ids[:, context:context + n], pos, kv, attn)
    t = interleaved({n: scoring(n) for n in counts}, repeats=repeats, warmup=1)   # warmed, the counts in turn
    return {n: t.median(n) for n in counts}


# ---------------------------------------------------------------------------- python -m minillm bench spec
def add_parser(sub):
    """`bench spec`: its options, and run_cli to run it."""
    p = sub.add_parser("spec",
                       help="speculative decoding: every proposer and gamma against plain decoding, batch 1 and up")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per engine (medians and spread)")
    p.add_argument("--quick", action="store_true", help="4 prompts, 32 tokens, one gamma per proposer: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    if a.quick:
        res = bench_spec(a.model, a.tokenizer, 4, 32, configs=QUICK, batches=(1, 4), repeats=a.repeats)
    else:
        res = bench_spec(a.model, a.tokenizer, a.prompts, a.max_tokens, repeats=a.repeats)
    print_table(res)
    return res
