"""Mixture of experts, measured: `python -m minillm bench moe` and the functions notebook 15 draws from.

- routing_on_text: which experts each token of a text chose, per layer, with the router's probabilities;
- load_per_step: tokens per expert per engine step, read from the MoE layers' counters around each step;
- compute_vs_params: parameters stored against parameters (and FLOPs) one token uses;
- expert_parallel_traffic: experts 0-1 on rank 0, 2-3 on rank 1 (expert parallelism, GShard): the bytes the
  all-to-all dispatch and combine move per token, counted from real routing decisions and from the formula;
- bench_moe: the val-loss table (the card's training runs, and dense vs MoE measured live on the held-out slice),
  load imbalance, and dense vs MoE decode tokens/s at batch 1 and 16 on the same backend (torch).
"""
from __future__ import annotations

import json
import math
import os
import statistics

import torch

from ..core.sampling import SamplingParams
from ..engine.llm import LLM
from ..formats.held_out import evaluate, held_out_windows
from ..formats.loader import MODELS_DIR, load
from ..moe.experts import compute_vs_params, expert_load, load_imbalance, moe_config, moe_layers, reset_stats


def _moe_of(model):
    if not moe_layers(model):
        raise ValueError("the model has no mixture-of-experts layers (load 'shakespeare-moe')")
    return moe_layers(model)


@torch.no_grad()
def routing_on_text(model, tok, text: str, max_tokens: int = 256) -> dict:
    """One forward over the text's first max_tokens tokens. -> pieces (T,) the tokens as text, experts (L, T, k)
    the experts each token chose (most probable first), probs (L, T, E) the router's softmax, load (L, E)."""
    layers = _moe_of(model)
    ids = tok.encode(text[:8 * max_tokens])[:max_tokens]       # encoding is the slow part: no more text than needed
    if not ids:
        raise ValueError("routing_on_text needs a text that encodes to at least one token")
    model(torch.tensor([ids]))                                                  # (1, T) -> logits, unused
    prev = [None] + ids[:-1]                                    # a piece after a token keeps its leading space
    return {"ids": ids, "pieces": [tok.decode([t], p) if p is not None else tok.decode([t]) for p, t in zip(prev, ids)],
            "experts": torch.stack([m.last.experts for m in layers]).tolist(),    # (L, T, k)
            "probs": torch.stack([m.last.probs for m in layers]).tolist(),        # (L, T, E)
            "load": torch.stack([m.last.counts for m in layers]).tolist()}        # (L, E)


def load_per_step(llm: LLM, prompts, params: SamplingParams) -> list:
    """Run the prompts through the engine one step at a time; after each step, the expert counters' growth.
    -> per step {step, kind, tokens (scheduled), rows (rows the forward computed: padding of a prefill batch
    included, as the experts compute them), load (L, E) assignments per expert}."""
    engine = llm.engine
    model = engine.parts.model
    _moe_of(model)
    for p in prompts:
        engine.add_request(p, params)
    out, k = [], moe_config(model).top_k
    while engine.has_unfinished_requests():
        before = expert_load(model)                                             # (L, E)
        engine.step()
        grown = expert_load(model) - before                                     # (L, E)
        rec = engine.trace.steps[-1] if engine.trace.steps else None
        out.append({"step": len(out), "kind": rec.kind if rec else "",
                    "tokens": rec.num_prefill_tokens + rec.num_decode_tokens if rec else 0,
                    "rows": int(grown[0].sum()) // k, "load": grown.tolist()})
    return out


def expected_remote_ranks(n_experts: int, top_k: int, ranks: int) -> float:
    """Under uniform routing (k distinct experts of E, each subset equally likely), the expected number of OTHER
    ranks a token's experts live on, with E / ranks experts per rank: (ranks - 1) * (1 - C(E - m, k) / C(E, k))."""
    m = n_experts // ranks
    return (ranks - 1) * (1 - math.comb(n_experts - m, top_k) / math.comb(n_experts, top_k))


def expert_parallel_traffic(experts_per_layer, n_experts: int, dim: int, ranks: int = 2, bytes_per_elem: int = 2):
    """Expert parallelism simulated: expert e on rank e // (E / ranks) (experts 0-1 on rank 0, 2-3 on rank 1 for
    E = 4), the N tokens split in `ranks` contiguous slices (each rank holds its own sequences, as data-parallel
    attention does). Dispatch sends a token's hidden vector (dim x bytes_per_elem) once to every OTHER rank that
    holds one of its experts; combine sends that rank's gated sum back: the same bytes again (DeepEP's
    deduplicated all-to-all). experts_per_layer: (L, N, k) or a list of (N, k).
    -> bytes per token (dispatch + combine, all layers), counted and by the formula, and the remote fractions."""
    experts = torch.as_tensor(experts_per_layer)                                 # (L, N, k)
    L, N, k = experts.shape
    if n_experts % ranks:
        raise ValueError(f"n_experts={n_experts} experts do not split evenly over ranks={ranks}")
    where = experts // (n_experts // ranks)                                      # (L, N, k) rank of each expert
    home = (torch.arange(N) * ranks // N)[None, :, None]                         # (1, N, 1) rank holding the token
    remote = where != home                                                       # (L, N, k)
    sends = sum(((where == r) & remote).any(-1) for r in range(ranks))           # (L, N) other ranks to reach
    vector = dim * bytes_per_elem
    formula = 2 * L * vector * expected_remote_ranks(n_experts, k, ranks)
    return {"ranks": ranks, "tokens": N, "layers": L, "bytes_per_vector": vector,
            "remote_assignment_fraction": float(remote.float().mean()),
            "messages_per_token_layer": float(sends.float().mean()),
            "bytes_per_token": 2 * vector * float(sends.float().sum(0).mean()),   # dispatch + combine
            "bytes_per_token_formula": formula,
            "bytes_per_token_naive": 2 * vector * float(remote.float().sum((0, 2)).mean())}  # one per assignment


# ---------------------------------------------------------------------------- the bench
def _decode_tok_s(model, tok, batch: int, steps: int, repeats: int) -> float:
    """Decode tokens/s through the engine on the torch backend (prefill excluded: the trace's decode steps)."""
    rates = []
    for _ in range(repeats + 1):                                                 # the first warms up
        llm = LLM(model, tokenizer=tok, backend="torch", max_num_seqs=batch, max_model_len=steps + 8)
        llm.generate([[1]] * batch, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
        dec = [s for s in llm.engine.trace.steps if s.kind == "decode"]
        rates.append(sum(s.num_decode_tokens for s in dec) / sum(s.seconds for s in dec))
    return statistics.median(rates[1:])


def card_runs() -> dict:
    """The training runs the card recorded (minillm/models/shakespeare-moe.json), or {} before they exist."""
    path = os.path.join(MODELS_DIR, "shakespeare-moe.json")
    return json.load(open(path)).get("runs", {}) if os.path.exists(path) else {}


def bench_moe(quick: bool = False, batches=(1, 16)) -> dict:
    dense, tok = load("shakespeare")
    moe_model, _ = load("shakespeare-moe")
    x, y = held_out_windows(tok, 256, 2 if quick else 25)          # the packaged held-out slice (6,400 tokens)
    reset_stats(moe_model)
    losses = {"shakespeare": evaluate(dense, x, y), "shakespeare-moe": evaluate(moe_model, x, y)}
    load_ = expert_load(moe_model)                                               # (L, E), all held-out windows
    text = open(os.path.join(MODELS_DIR, "val_slice.txt")).read()
    route = routing_on_text(moe_model, tok, text, 256 if quick else 1024)
    cfg = moe_config(moe_model)
    steps, repeats = (8, 1) if quick else (64, 3)
    per_step = step_imbalance(moe_model, tok, x, max(batches), steps)
    speed = {}
    for b in batches:
        speed[b] = {"dense": _decode_tok_s(dense, tok, b, steps, repeats),
                    "moe": _decode_tok_s(moe_model, tok, b, steps, repeats)}
        speed[b]["moe_over_dense"] = speed[b]["moe"] / speed[b]["dense"]
    return {"bench": "moe", "windows": int(x.shape[0]), "val_loss_live": losses, "runs": card_runs(),
            "moe": cfg.to_dict(), "load": load_.tolist(), "imbalance": load_imbalance(load_),
            "compute": compute_vs_params(dense.config, cfg),
            "expert_parallel": expert_parallel_traffic(route["experts"], cfg.n_experts, dense.config.dim),
            "per_step": per_step, "decode_steps": steps, "repeats": repeats, "threads": torch.get_num_threads(),
            "decode_tok_s": speed}


def step_imbalance(model, tok, windows, batch: int, steps: int) -> dict:
    """`batch` prompts (15-token pieces of the windows (N, T), after BOS) decoded `steps` tokens through the engine:
    per decode step, how unevenly that step's tokens spread over the experts (max/mean, averaged over layers). A step
    of 16 tokens x 2 picks is a small sample, so per-step load is far less even than a long text's: what expert
    parallelism waits on."""
    ids = windows.reshape(-1).tolist()
    prompts = [[1] + ids[15 * i: 15 * i + 15] for i in range(batch)]
    llm = LLM(model, tokenizer=tok, backend="torch", max_num_seqs=batch, max_model_len=16 + steps)
    rows = load_per_step(llm, prompts, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    ratios = [load_imbalance(r["load"])["max_over_mean_avg"] for r in rows if r["kind"] == "decode"]
    return {"decode_steps": len(ratios), "tokens_per_step": batch, "max_over_mean_median": statistics.median(ratios),
            "max_over_mean_max": max(ratios)}


def print_report(res: dict):
    print(f"val loss (nats/token) on the packaged held-out slice, {res['windows']} windows of 256:")
    for name, v in res["val_loss_live"].items():
        print(f"  {name:<18}{v:8.4f}")
    if res["runs"]:
        print("training runs (minillm/models/shakespeare-moe.json; all from shakespeare.bin, FFN weights only, "
              "same tokens and schedule):")
        print(f"  {'run':<22}{'val':>8}{'at init':>9}{'steps':>7}{'tokens':>10}{'minutes':>9}{'max/mean':>10}")
        for name, r in res["runs"].items():
            imb = r.get("val_imbalance", {}).get("max_over_mean_avg")
            print(f"  {name:<22}{r['best_val_loss']:8.4f}{r['init_val_loss']:9.4f}{r['steps']:7d}{r['tokens']:10,d}"
                  f"{r['seconds'] / 60:9.1f}{'' if imb is None else f'{imb:10.2f}'}")
    imb, c, ep = res["imbalance"], res["compute"], res["expert_parallel"]
    print(f"expert load on the held-out windows: max/mean {imb['max_over_mean_avg']:.2f}, CV {imb['cv_avg']:.2f} "
          f"(mean over layers; 1.00 and 0.00 = balanced)")
    print(f"parameters: {c['params_total']:,} stored, {c['params_active']:,} active per token "
          f"({c['active_fraction']:.0%}); FLOPs/token {c['flops_per_token_active']:,} vs "
          f"{c['flops_per_token_all_experts']:,} with every expert ({c['flops_fraction']:.0%})")
    print(f"expert parallel, 2 ranks: {ep['bytes_per_token']:,.0f} bytes/token all-to-all (dispatch + combine, "
          f"{ep['layers']} layers, fp16) counted on {ep['tokens']} tokens; {ep['bytes_per_token_formula']:,.0f} by the "
          f"uniform-routing formula; {ep['bytes_per_token_naive']:,.0f} without deduplication")
    ps = res["per_step"]
    print(f"per engine step ({ps['tokens_per_step']} sequences decoding, {ps['decode_steps']} steps): max/mean tokens "
          f"per expert {ps['max_over_mean_median']:.2f} median, {ps['max_over_mean_max']:.2f} worst")
    print(f"decode tokens/s, both on the torch backend ({res['decode_steps']} steps, median of {res['repeats']}):")
    for b, r in res["decode_tok_s"].items():
        print(f"  batch {b:<3} dense {r['dense']:8.1f}   moe {r['moe']:8.1f}   moe/dense {r['moe_over_dense']:.2f}x")


# ---------------------------------------------------------------------------- python -m minillm bench moe
def add_parser(sub):
    """`bench moe`: its options, and run_cli to run it."""
    p = sub.add_parser("moe", help="mixture of experts: val loss against the dense baselines, expert load, active vs "
                                   "stored parameters, expert-parallel bytes, dense vs MoE decode at batch 1 and 16")
    p.add_argument("--quick", action="store_true", help="2 windows, 8 decode steps, 1 repeat: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    res = bench_moe(a.quick)
    print_report(res)
    return res
