"""Shipping the mixture of experts: `python -m minillm.training.moe_ship --moe runs/moe ...` after the training runs
(minillm.training.moe). Copies the MoE run's experts into minillm/models/shakespeare-moe.safetensors, measures the
shipped file, and writes shakespeare-moe.json (every run's summary and log), card.json's entry and MODEL_CARD.md's
section (between markers, the rest of the card left alone). Every number in the section is read from the runs.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from ..atomic import copy_replacing, open_replacing, write_text_replacing
from ..formats.held_out import held_out_windows
from ..formats.loader import load
from ..formats.moe import load_moe
from ..moe.experts import compute_vs_params
from ..paths import MODELS_DIR
from .moe import MOE_PRESETS, routing_diagnostics
from .train import eval_windows, evaluate

RUN_LABELS = {"moe": "shakespeare-moe", "moe_noaux": "shakespeare-moe, --aux-loss 0",
              "ffn384": "dense FFN 384 (equal active)", "ffn768": "dense FFN 768 (all units)"}


def _summary(run_dir: str) -> dict:
    """A run's summary.json; its recipe (preset settings and overrides) filled in from the preset if not written."""
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    return {"recipe": dict(MOE_PRESETS[s["preset"]])} | s


def ship(runs: dict, data_dir: str, dest: str, compare: dict | None = None, command: str = "") -> dict:
    """Copy runs["moe"]'s experts into dest as shakespeare-moe.safetensors, measure the shipped file on the whole
    val split (256-token windows, as card.json's other models), and write shakespeare-moe.json (every run's
    summary and log), the card.json entry and MODEL_CARD.md's section. runs: label (RUN_LABELS) -> run folder."""
    shipped = os.path.join(dest, "shakespeare-moe.safetensors")
    copy_replacing(os.path.join(runs["moe"], "model.safetensors"), shipped)
    model = load_moe(shipped)
    val_ids = np.load(os.path.join(data_dir, "val.npy"))
    x, y = eval_windows(val_ids, (len(val_ids) - 1) // 256, 256)
    _, tok = load("shakespeare")
    sx, sy = held_out_windows(tok, 256, 4)
    summaries = {label: _summary(d) for label, d in runs.items()}
    moe = summaries["moe"]
    with open_replacing(os.path.join(dest, "shakespeare-moe.log.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in moe["log"])
    entry = {**compute_vs_params(model.config, model.layers[0].feed_forward.cfg),
             "moe": model.layers[0].feed_forward.cfg.to_dict(), "base": "shakespeare.bin",
             "file_bytes": os.path.getsize(shipped), "val_loss": evaluate(model, x, y),
             "val_slice_loss_4_windows": evaluate(model, sx, sy), "steps": moe["steps"], "tokens_seen": moe["tokens"],
             "train_seconds": moe["seconds"], "stop_reason": moe["stop_reason"], "aux_loss_coef": moe["aux_loss_coef"],
             "router_init": moe["recipe"]["router_init"],
             "val_imbalance": moe["val_imbalance"], "train_config": moe["train_config"],
             "commands": ["python -m minillm train " + " ".join(s["argv"]) for s in summaries.values()],
             "ship_command": command,
             "runs": {label: {k: s[k] for k in ("best_val_loss", "init_val_loss", "steps", "tokens", "seconds",
                                                "stop_reason", "aux_loss_coef", "trainable_params")}
                      | {"val_curve": [[r["step"], r["val_loss"]] for r in s["log"]]}
                      | ({"imbalance": s["val_imbalance"]} if "val_imbalance" in s else {})
                      for label, s in summaries.items()}}
    if compare:
        entry["init_by_partition"] = compare
        vx, vy = eval_windows(val_ids, compare["windows"], 256)               # compare_init's windows
        entry["routing_after_training"] = routing_diagnostics(model, vx, vy) | {"windows": compare["windows"]}
    with open_replacing(os.path.join(dest, "shakespeare-moe.json"), "w") as f:
        json.dump({"runs": summaries, **{k: v for k, v in entry.items() if k != "runs"}}, f, indent=2)
    card_path = os.path.join(dest, "card.json")
    card = json.load(open(card_path))
    card["models"]["shakespeare-moe"] = entry
    with open_replacing(card_path, "w") as f:
        json.dump(card, f, indent=2)
    write_card_section(os.path.join(dest, "MODEL_CARD.md"), entry, card["models"]["shakespeare"]["val_loss"])
    return entry


def card_section(e: dict, dense_val: float) -> list:
    r, tc, m = e["runs"], e["train_config"], e["moe"]
    lines = ["## Mixture of experts: `shakespeare-moe`", "",
             f"`shakespeare.bin` upcycled (Komatsuzaki et al. 2023): each FFN's 768 hidden units split into "
             f"{m['n_experts']} experts of {m['expert_hidden']} ({m['partition']}: grouped by co-activation on 4,096 "
             f"calibration tokens, minillm.moe.experts.cluster_partition), a router per layer (initialised "
             f"'{e['router_init']}', minillm.moe.experts.upcycle), top-{m['top_k']} routing (gates renormalised over "
             f"the chosen {m['top_k']}, as Mixtral, times {m['gate_scale']:g}), then experts and routers fine-tuned "
             "with every other weight frozen. "
             f"`shakespeare-moe.safetensors` ({e['file_bytes'] / 1e6:.2f} MB) holds only routers and experts in fp16; "
             "the rest is read from `shakespeare.bin` (checked by sha256). `LLM(\"shakespeare-moe\")` loads it; it "
             "runs on the torch backend (`auto` picks torch).", "",
             f"Parameters stored {e['params_total']:,}, active per token {e['params_active']:,} "
             f"({e['active_fraction']:.0%}); FLOPs per token {e['flops_per_token_active']:,} "
             f"({e['flops_fraction']:.0%} of running every expert).", "",
             f"Fine-tuning: {tc['max_steps']}-step schedule, batch {tc['batch_size']} x {tc['seq_len']}, lr "
             f"{tc['lr']:g} -> {tc['min_lr']:g} (warm-up {tc['warmup_steps']}), dropout {tc['dropout']:g}, "
             f"weight decay {tc['weight_decay']:g} on the matrices, 1 thread "
             "on a shared 2-core machine (wall times include other jobs); every run below saw the same batches "
             f"(one seed) and trained FFN weights only. Val loss on {tc['eval_windows']} fixed val windows of "
             f"{tc['seq_len']} tokens "
             f"(the shipped file on the whole val split: {e['val_loss']:.4f}; the dense target there: "
             f"{dense_val:.4f}). Load: max/mean tokens per expert on the val windows, mean over layers "
             f"(Switch load-balancing loss L = CE + c * mean over layers of E * sum_e f_e P_e).", "",
             "| run | trainable | aux loss c | val loss at start | best val loss | steps | tokens | minutes "
             "| why it stopped | load max/mean |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, s in r.items():
        imb = s.get("imbalance", {}).get("max_over_mean_avg")
        lines.append(f"| {RUN_LABELS.get(label, label)} | {s['trainable_params']:,} | {s['aux_loss_coef']:g} | "
                     f"{s['init_val_loss']:.4f} | {s['best_val_loss']:.4f} | {s['steps']} | {s['tokens']:,} | "
                     f"{s['seconds'] / 60:.1f} | {s['stop_reason']} | {'-' if imb is None else f'{imb:.2f}'} |")
    lines += ["", *verdict(e)]
    lines += ["", "```bash", *e["commands"], e.get("ship_command", ""), "```", ""]
    return lines


def exposure(moe: dict, dense: dict, m: dict) -> list:
    """The MoE-minus-dense gap at each evaluation, and both compared at equal tokens per hidden unit: an expert's
    units see k/E of the tokens, a dense unit all of them (so MoE step s meets dense step s * k / E)."""
    d = dict((s, v) for s, v in dense.get("val_curve", []))
    gaps = [(s, v - d[s]) for s, v in moe.get("val_curve", []) if s in d and s]
    if not gaps:
        return []
    lines = ["MoE minus dense-384 val loss by step: " + ", ".join(f"{s}: {g:+.4f}" for s, g in gaps) + "."]
    share = m["top_k"] / m["n_experts"]
    same = [(s, v, d[int(s * share)]) for s, v in moe["val_curve"] if s and int(s * share) in d and int(s * share)]
    if same:
        s, v, w = same[-1]
        lines.append(f"Each expert unit saw {share:.0%} of the tokens a dense unit saw: at equal tokens per unit "
                     f"(MoE step {s}, dense step {int(s * share)}) the MoE's val loss is {v:.4f} against {w:.4f}.")
    return lines


def verdict(e: dict) -> list:
    """The goal's sentence (MoE below the dense model at equal active parameters, or why not), from the numbers."""
    r = e["runs"]
    out = []
    if "ffn384" in r:
        gap = r["moe"]["best_val_loss"] - r["ffn384"]["best_val_loss"]
        out.append(f"Against the dense FFN of equal active parameters on the same tokens the MoE is "
                   f"{abs(gap):.4f} nats {'lower' if gap < 0 else 'HIGHER'} ({r['moe']['best_val_loss']:.4f} vs "
                   f"{r['ffn384']['best_val_loss']:.4f}).")
        out += exposure(r["moe"], r["ffn384"], e["moe"])
    c, d = e.get("init_by_partition"), e.get("routing_after_training")
    if c:
        out.append(f"Before training (top-2, {c['windows']} val windows; dense {c['dense']:.4f}): " + ", ".join(
            f"{k} {v:.4f}" for k, v in c.items() if "/" in k) + " (oracle: minillm.moe.experts.best_experts).")
    if d:
        out.append(f"After training, on the same windows: learned router {d['learned']:.4f}, oracle "
                   f"{d['oracle']:.4f}, every expert at weight 1 {d['all_experts']:.4f}, random top-2 "
                   f"{d['random']:.4f}.")
    if "moe_noaux" in r and "imbalance" in r["moe_noaux"]:
        a, b = r["moe"]["imbalance"], r["moe_noaux"]["imbalance"]
        out.append(f"Load imbalance with the aux loss: max/mean {a['max_over_mean_avg']:.2f}, CV {a['cv_avg']:.2f}; "
                   f"without: {b['max_over_mean_avg']:.2f}, CV {b['cv_avg']:.2f}.")
    return out


def write_card_section(path: str, entry: dict, dense_val: float):
    """MODEL_CARD.md gets (or has replaced) the section between the markers; the rest of the card is left alone."""
    begin, end = "<!-- shakespeare-moe -->", "<!-- /shakespeare-moe -->"
    text = open(path).read()
    section = "\n".join([begin, *card_section(entry, dense_val), end])
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    write_text_replacing(path, text)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm.training.moe_ship",
                                 description="ship the MoE run with its card entries (after the training runs)")
    ap.add_argument("--data", default="runs/data")
    ap.add_argument("--dest", default=MODELS_DIR)
    ap.add_argument("--compare-init", default=None, help="a JSON file `train --compare-init` printed")
    for label in RUN_LABELS:
        ap.add_argument("--" + label.replace("_", "-"), required=label == "moe", help="run folder")
    a = ap.parse_args(argv)
    runs = {label: getattr(a, label) for label in RUN_LABELS if getattr(a, label)}
    compare = json.load(open(a.compare_init)) if a.compare_init else None
    entry = ship(runs, a.data, a.dest, compare, "python -m minillm.training.moe_ship " + " ".join(argv))
    print("\n".join(card_section(entry, json.load(open(os.path.join(a.dest, "card.json")))["models"]["shakespeare"]
                                 ["val_loss"])))
    return 0


if __name__ == "__main__":
    import sys
    raise SystemExit(main(sys.argv[1:]))
