"""LoRA adapters trained on genre slices of the corpus: `python -m minillm train --preset lora --lora-slice GENRE`.

The shipped model is frozen; only each adapter's A and B train (Hu et al. 2021), rank 8, alpha 16, on all seven
linears of every layer (q, k, v, o, gate, up, down). All seven, not only q and v as the LoRA paper did: QLoRA
(Dettmers et al. 2023) found that adapting every linear is what matches full fine-tuning, and here the MLP holds
two thirds of a layer's weights; the cost is 311 k parameters per adapter (4% of the model), 0.6 MB in float16.

A slice is a First Folio genre (1623, the catalogue Heminges and Condell printed): comedies, histories, tragedies.
GENRES below gives each work's; Troilus and Cressida, printed between the histories and the tragedies, goes with the
tragedies (its Folio title is "The Tragedie of Troylus and Cressida"); Pericles and the poems are not in the Folio
and belong to no slice. An adapter learns text its base model has never seen, as a real fine-tune does: its genre's
share of the corpus's VAL_WORKS (twelfth_night and tempest, julius_caesar, richard_ii), which the base model never
trained on. Each of those works is cut in two at a line near its middle: the first halves train the adapter, the
second halves are its held-out text (split_work).

Why not the genre's training works: the base model has already fit them (loss ~2.7 on them against 3.5-3.9 on unseen
plays), so an adapter trained on them mostly learns them harder. Measured (the card of commit 80a3244): 300 steps
of batch 8 x 256 on the genre's training works, dropout 0.1, moved the held-out loss of the genre's unseen plays by
-0.0082 (tragedies), -0.0143 (histories) and +0.0076 (comedies), a few thousandths of a nat either way, while
dividing the base's logits by a temperature of 1.1-1.2 alone lowered it by 0.03-0.08: the base is overconfident on
unseen plays, which text it has fit cannot teach.

    python -m minillm train --preset lora --lora-slice comedies --init-from minillm/models/shakespeare.bin \
        --out runs/lora-comedies --threads 1
    python -m minillm train --preset lora --ship runs/lora-comedies runs/lora-tragedies runs/lora-histories

--ship measures the table (held-out loss of the base and of each adapter on each genre's held-out halves), copies
the adapters into minillm/models/lora/<genre>/ (PEFT format, float16), writes small held-out text slices beside
them (val_<genre>.txt, for tests and the notebook, which have no corpus), and records everything in card.json
("lora") and MODEL_CARD.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from typing import Optional

import numpy as np
import torch

from ..atomic import copy_replacing, open_replacing
from ..formats.llama2c import load_bin
from ..formats.peft import HF_NAME, LORA_DIR, load_adapter, save_adapter
from ..lora.adapters import MODULES, LoRAAdapter, attach_lora, lora_linears
from ..progress import progress
from ..threads import auto_threads, use_threads
from .train import TrainConfig, eval_windows, evaluate, get_batch, lr_at

SLICES = ("comedies", "tragedies", "histories")
GENRES = {   # the First Folio's catalogue (see the module doc); works not listed are in no slice
    **{w: "comedies" for w in ("tempest", "two_gentlemen_of_verona", "merry_wives_of_windsor", "measure_for_measure",
                               "comedy_of_errors", "much_ado_about_nothing", "loves_labours_lost",
                               "midsummer_nights_dream", "merchant_of_venice", "as_you_like_it", "taming_of_the_shrew",
                               "alls_well_that_ends_well", "twelfth_night", "winters_tale")},
    **{w: "histories" for w in ("john", "richard_ii", "henry_iv_part_1", "henry_iv_part_2", "henry_v",
                                "henry_vi_part_1", "henry_vi_part_2", "henry_vi_part_3", "richard_iii", "henry_viii")},
    **{w: "tragedies" for w in ("troilus_and_cressida", "coriolanus", "tragedy_of_titus_andronicus",
                                "romeo_and_juliet", "timon_of_athens", "julius_caesar", "macbeth", "hamlet", "lear",
                                "othello", "antony_and_cleopatra", "cymbeline")},
}
SLICE_CHARS = 8000           # the shipped held-out slice of each genre (val_<genre>.txt)
EVAL_LEN = 256               # held-out windows, as the model card's val loss


# ---------------------------------------------------------------------------- data
def genre_works(genre: str) -> tuple[list, list]:
    """(train works, held-out works) of a genre, from the corpus (minillm.training.data)."""
    from .data import build_corpus
    if genre not in SLICES:
        raise ValueError(f"--lora-slice must be one of {SLICES}, got {genre!r}")
    corpus = build_corpus()
    return ([w for w in corpus.train if GENRES.get(w.name) == genre],
            [w for w in corpus.val if GENRES.get(w.name) == genre])


def split_work(text: str) -> tuple[str, str]:
    """A work cut at the first line break past its middle -> (first half: trains an adapter, second half: held out)."""
    cut = text.index("\n", len(text) // 2) + 1
    return text[:cut], text[cut:]


def genre_texts(genre: str) -> tuple[list, list]:
    """(training texts, held-out texts) of a genre: the first and second halves of its unseen works (VAL_WORKS)."""
    halves = [split_work(w.text) for w in genre_works(genre)[1]]
    return [a for a, _ in halves], [b for _, b in halves]


def genre_tokens(genre: str, tokenizer, cache: Optional[str] = None) -> tuple[np.ndarray, np.ndarray]:
    """(train ids, held-out ids) of a genre (genre_texts), each text encoded with BOS before it; cached in `cache`."""
    paths = [os.path.join(cache, f"lora_{genre}_halves_{s}.npy") for s in ("train", "val")] if cache else []
    if paths and all(os.path.exists(p) for p in paths):
        return np.load(paths[0]), np.load(paths[1])
    train, val = (np.asarray([i for t in texts for i in tokenizer.encode(t, bos=True, eos=False)], dtype=np.uint16)
                  for texts in genre_texts(genre))
    if paths:
        os.makedirs(cache, exist_ok=True)
        for path, ids in zip(paths, (train, val)):
            with open_replacing(path) as f:
                np.save(f, ids)
    return train, val


def heldout_slice(genre: str, chars: int = SLICE_CHARS) -> str:
    """`chars` characters of the genre's held-out halves, from a third of the way in, starting and ending on a line:
    what val_<genre>.txt ships."""
    text = "".join(genre_texts(genre)[1])
    start = text.index("\n", len(text) // 3) + 1
    return text[start:text.rindex("\n", start, start + chars) + 1]


# ---------------------------------------------------------------------------- the model being trained
def lora_model(base, rank: int, alpha: float, modules=MODULES, seed: int = 0, dropout: float = 0.0):
    """The frozen base with one trainable adapter slot (slot 0, used by every row). A is initialised as PEFT does
    (Kaiming-uniform, as nn.Linear's weights), B as zeros, so training starts from the base model exactly.
    dropout: the base's own dropout, on while training (see train_lora). -> (model, trainable parameters)."""
    model = attach_lora(base, 1, rank, modules)
    for p in model.parameters():
        p.requires_grad_(False)
    for m in model.modules():                      # residual and attention dropout, as the base trained with
        if isinstance(m, torch.nn.Dropout):
            m.p = dropout
        elif hasattr(m, "dropout") and isinstance(m.dropout, float):
            m.dropout = dropout
    g, params = torch.Generator().manual_seed(seed), []
    for lin in lora_linears(model).values():
        bound = 1 / math.sqrt(lin.in_features)
        with torch.no_grad():
            lin.A.copy_((torch.rand(lin.A.shape, generator=g) * 2 - 1) * bound)          # (1, r, K)
        lin.use_slot(0, rank, alpha / rank)
        params += [lin.A.requires_grad_(True), lin.Bt.requires_grad_(True)]
    model.lora_context.set(0)                                                            # every row: slot 0
    return model, params


def adapter_of(model, name: str, rank: int, alpha: float, base_model: str = "shakespeare") -> LoRAAdapter:
    """Slot 0 of a lora_model as a LoRAAdapter (copies, float32)."""
    weights = {key: tuple(w.detach().float().contiguous().clone() for w in lin.slot_weights(0))
               for key, lin in lora_linears(model).items()}
    return LoRAAdapter(name, rank, float(alpha), weights, base_model=base_model)


def train_lora(base_path: str, genre: str, out_dir: str, tc: TrainConfig, rank: int = 8, alpha: float = 16.0,
               data_dir: Optional[str] = None, label_smoothing: float = 0.0, log=print) -> dict:
    """Train one adapter on a genre's training halves (genre_texts); the held-out loss is logged every eval_every
    steps (for the record: the final adapter is kept, none is chosen by held-out loss). Writes out_dir/adapter/
    (PEFT), log.jsonl and summary.json. -> the summary."""
    from ..formats.loader import MODELS_DIR
    from ..llama.tokenizer import Tokenizer
    tok = Tokenizer.load(os.path.join(MODELS_DIR, "tokenizer.bin"))
    train_ids, val_ids = genre_tokens(genre, tok, data_dir)
    base = load_bin(base_path).eval()
    torch.manual_seed(tc.seed)                    # dropout's masks: the same run gives the same adapter
    model, params = lora_model(base, rank, alpha, seed=tc.seed, dropout=tc.dropout)
    model.train()                                 # dropout on (evaluate() turns it off and back)
    opt = torch.optim.AdamW(params, lr=tc.lr, betas=(0.9, 0.95), weight_decay=tc.weight_decay)
    rng, (vx, vy) = np.random.default_rng(tc.seed), eval_windows(val_ids, tc.eval_windows, tc.seq_len)
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "log.jsonl")
    records = [{"step": 0, "val_loss": round(evaluate(model, vx, vy), 4)}]           # the base model's
    log(f"lora {genre}: {len(train_ids):,} training tokens; the base model's held-out loss {records[0]['val_loss']}")
    t0, step, stop = time.perf_counter(), 0, "max_steps"
    bar = progress(tc.max_steps, 0, f"lora {genre}")
    while step < tc.max_steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        x, y = get_batch(train_ids, tc.batch_size, tc.seq_len, rng)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(),   # (B*T, V) vs (B*T,)
                                                 label_smoothing=label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        opt.step()
        step += 1
        bar.update(1)
        out_of_time = tc.time_limit_s is not None and time.perf_counter() - t0 >= tc.time_limit_s
        if step % tc.eval_every == 0 or step == tc.max_steps or out_of_time:
            records.append({"step": step, "train_loss": round(loss.item(), 4),
                            "val_loss": round(evaluate(model, vx, vy), 4), "lr": lr_at(step - 1, tc),
                            "seconds": round(time.perf_counter() - t0, 1)})
            log(f"lora {genre} step {step}: train {loss.item():.4f} held-out {records[-1]['val_loss']:.4f}")
            if out_of_time:
                stop = "time_limit"
                break
    bar.close()
    with open_replacing(log_path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    adapter = adapter_of(model, genre, rank, alpha)
    save_adapter(adapter, os.path.join(out_dir, "adapter"), base.config, dtype=torch.float16,
                 base_model="shakespeare")
    summary = {"slice": genre, "stop_reason": stop, "steps": step, "tokens": step * tc.batch_size * tc.seq_len,
               "seconds": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads(), "rank": rank,
               "alpha": alpha, "label_smoothing": label_smoothing, "target_modules": adapter.target_modules,
               "trainable_params": sum(p.numel() for p in params),
               "train_tokens_in_slice": int(len(train_ids)), "heldout_tokens": int(len(val_ids)),
               "train_config": {k: getattr(tc, k) for k in ("batch_size", "seq_len", "lr", "min_lr", "warmup_steps",
                                                            "max_steps", "dropout", "weight_decay", "grad_clip",
                                                            "seed")}}
    with open_replacing(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


# ---------------------------------------------------------------------------- measuring and shipping
@torch.no_grad()
def slice_losses(base, adapters: dict, texts: dict, tokenizer, seq_len: int = EVAL_LEN) -> dict:
    """Held-out loss (nats/token, every whole window of seq_len) of the base and of each adapter (merged) on each
    text. adapters: name -> LoRAAdapter; texts: slice -> str or token ids. -> {"base" | name: {slice: loss}}."""
    from ..lora.adapters import merge_lora
    windows = {}
    for s, t in texts.items():
        ids = np.asarray(tokenizer.encode(t, bos=True, eos=False) if isinstance(t, str) else t)
        windows[s] = eval_windows(ids, (len(ids) - 1) // seq_len, seq_len)
    models = {"base": base, **{n: merge_lora(base, a) for n, a in adapters.items()}}
    return {n: {s: round(evaluate(m, *windows[s]), 4) for s in texts} for n, m in models.items()}


@torch.no_grad()
def tempered_loss(model, text, tokenizer, temps=(1.0, 1.1, 1.2, 1.3), seq_len: int = EVAL_LEN) -> dict:
    """The model's held-out loss with its logits divided by T, at the best T of `temps` -> {"T", "loss"}: how much
    of a held-out loss is overconfidence alone (a baseline an adapter should beat). text: str or token ids."""
    ids = np.asarray(tokenizer.encode(text, bos=True, eos=False) if isinstance(text, str) else text)
    x, y = eval_windows(ids, (len(ids) - 1) // seq_len, seq_len)                     # (n, T) each
    total = torch.zeros(len(temps), dtype=torch.float64)
    for i in range(0, len(x), 16):
        logits = model(x[i:i + 16]).flatten(0, 1)                                     # (b*T, V)
        for j, t in enumerate(temps):
            total[j] += torch.nn.functional.cross_entropy(logits / t, y[i:i + 16].flatten(), reduction="sum")
    best = int(total.argmin())
    return {"T": temps[best], "loss": round(float(total[best]) / y.numel(), 4)}


def ship(run_dirs: list, dest: str = LORA_DIR, card_dir: Optional[str] = None, log=print) -> dict:
    """Measure the runs' adapters, copy them into dest (PEFT folders) with the held-out slices, and record the
    card entry (card.json "lora", MODEL_CARD.md's LoRA section). -> the entry."""
    from ..formats.loader import MODELS_DIR, load
    base, tok = load("shakespeare")
    card_dir = card_dir or MODELS_DIR
    summaries = [json.load(open(os.path.join(d, "summary.json"))) for d in run_dirs]
    adapters = {s["slice"]: load_adapter(os.path.join(d, "adapter"), base.config) for s, d in zip(summaries, run_dirs)}
    slices = {g: heldout_slice(g) for g in SLICES}
    works = {g: genre_tokens(g, tok)[1] for g in SLICES}                            # the held-out halves
    log("measuring the held-out halves (every 256-token window) ...")
    table = slice_losses(base, adapters, works, tok)
    table_slices = slice_losses(base, adapters, slices, tok)
    tempered = {g: tempered_loss(base, works[g], tok) for g in SLICES}
    os.makedirs(dest, exist_ok=True)
    for (g, a), d in zip(adapters.items(), run_dirs):
        shutil.copytree(os.path.join(d, "adapter"), os.path.join(dest, g), dirs_exist_ok=True,
                        copy_function=copy_replacing)
    for g, text in slices.items():
        with open_replacing(os.path.join(dest, f"val_{g}.txt"), "w", encoding="utf-8") as f:
            f.write(text)
    entry = {"adapters": {s["slice"]: dict(s, file_bytes=os.path.getsize(os.path.join(dest, s["slice"],
                                                                                      "adapter_model.safetensors")),
                                           adapter_bytes_fp32=adapters[s["slice"]].nbytes)
                          for s in summaries},
             "heldout_works": {g: [w.name for w in genre_works(g)[1]] for g in SLICES},
             "heldout_tokens": {g: len(ids) for g, ids in works.items()},
             "table": table, "slice_tokens": {g: len(tok.encode(t, bos=True, eos=False)) for g, t in slices.items()},
             "table_slices": table_slices, "base_tempered": tempered,
             "model_bytes_fp32": sum(p.numel() * 4 for p in base.parameters())}
    write_card_entry(entry, card_dir)
    return entry


def write_card_entry(entry: dict, card_dir: str):
    """card.json's "lora" (read again just before writing: other entries may have changed) and MODEL_CARD.md's
    section between its markers (appended the first time)."""
    path = os.path.join(card_dir, "card.json")
    card = json.load(open(path))
    card["lora"] = entry
    with open_replacing(path, "w") as f:
        json.dump(card, f, indent=2)
        f.write("\n")
    md = os.path.join(card_dir, "MODEL_CARD.md")
    text, section = open(md).read(), "\n".join(card_lines(entry)) + "\n"
    begin, end = "<!-- lora: written by minillm.training.lora -->", "<!-- /lora -->"
    if begin in text:
        text = text[:text.index(begin)] + text[text.index(end) + len(end) + 1:]
    with open_replacing(md, "w") as f:
        f.write(text.rstrip("\n") + "\n\n" + begin + "\n" + section + end + "\n")


def card_lines(entry: dict) -> list:
    """MODEL_CARD.md's LoRA section (markdown lines) from the card entry."""
    ads, t, ts = entry["adapters"], entry["table"], entry["table_slices"]
    first = next(iter(ads.values()))
    tc = first["train_config"]
    held = "; ".join(f"{g}: " + ", ".join(w) for g, w in entry["heldout_works"].items())
    lines = ["## LoRA adapters: `comedies`, `tragedies`, `histories`", "",
             f"Three adapters on the frozen `shakespeare` model, one per First Folio genre, in PEFT's format under "
             f"`lora/<genre>/` (rank {first['rank']}, alpha {first['alpha']:g}, on "
             f"{', '.join(HF_NAME[m] for m in first['target_modules'])} of every layer: "
             f"{first['trainable_params']:,} parameters each, stored in float16). Each learns text the base model "
             f"never saw: the first halves of its genre's held-out works ({held}), cut at a line near the middle; the "
             "second halves are held out. `minillm.training.lora` has the genre table and why not the genre's "
             "training works (the base has fit them).", "",
             "Held-out loss (nats/token, every 256-token window of the second halves; lower is better):", "",
             "| model | " + " | ".join(f"{g} ({entry['heldout_tokens'][g]:,} tokens)" for g in SLICES) + " |",
             "|---|" + "---|" * len(SLICES)]
    for name, row in t.items():
        label = "base (shakespeare)" if name == "base" else f"+ {name} adapter"
        lines.append(f"| {label} | " + " | ".join(f"**{row[g]:.4f}**" if g == name else f"{row[g]:.4f}"
                                                   for g in SLICES) + " |")
    lowered = [g for g in ads if t[g][g] < t["base"][g]]
    tt = entry["base_tempered"]
    lines += ["", (f"{len(lowered)} of {len(ads)} adapters lower their own genre's held-out loss: " if lowered else
                   "No adapter lowers its own genre's held-out loss: ")
              + "; ".join(f"{g} {t['base'][g]:.4f} -> {t[g][g]:.4f} ({t[g][g] - t['base'][g]:+.4f})" for g in ads)
              + ". A baseline: dividing the base model's logits by the best temperature alone gives "
              + "; ".join(f"{g} {tt[g]['loss']:.4f} at T = {tt[g]['T']:g}" for g in SLICES)
              + " (the base is overconfident on plays it has not seen). "
              + ("Each genre's text is lowest under its own adapter: what an adapter learns beyond the temperature is "
                 "its plays' own names, words and forms, which carry from the first half of a play to the second."
                 if all(min(ads, key=lambda n: t[n][g]) == g for g in ads) else
                 "Not every genre's text is lowest under its own adapter: " + ", ".join(
                     f"{g} under {min(ads, key=lambda n: t[n][g])}" for g in ads) + "."),
              "", "On the shipped slices (`lora/val_<genre>.txt`, "
              + ", ".join(f"{entry['slice_tokens'][g]:,}" for g in SLICES) + " tokens) the same table is: "
              + "; ".join(f"{n}: " + ", ".join(f"{ts[n][g]:.4f}" for g in SLICES) for n in ts)
              + " (tests/test_lora_shipped.py checks it).", "",
              f"Training: {tc['max_steps']} steps of batch {tc['batch_size']} x {tc['seq_len']} tokens, AdamW lr "
              f"{tc['lr']:g} (warm-up {tc['warmup_steps']}, cosine to {tc['min_lr']:g}, no weight decay), the base "
              f"model's dropout {tc['dropout']:g} on as it trained; each adapter's training tokens: "
              + ", ".join(f"{g} {a['train_tokens_in_slice']:,}" for g, a in ads.items()) + "; "
              + ", ".join(f"{g} {a['steps']} steps in {a['seconds'] / 60:.1f} min" for g, a in ads.items())
              + f" on {first['threads']} thread(s) of a shared 2-core machine. File sizes: "
              + ", ".join(f"{g} {a['file_bytes'] / 1e3:.0f} kB" for g, a in ads.items())
              + f"; an adapter in float32 is {first['adapter_bytes_fp32'] / 2**20:.2f} MiB against "
              f"{entry['model_bytes_fp32'] / 2**20:.1f} MiB for a merged copy of the model.", "",
              "```bash"]
    for g, a in ads.items():
        c = a["train_config"]
        lines.append(f"python -m minillm train --preset lora --lora-slice {g} --init-from "
                     f"minillm/models/shakespeare.bin --out runs/lora-{g} --max-steps {c['max_steps']} "
                     f"--batch-size {c['batch_size']} --seq-len {c['seq_len']} --lr {c['lr']:g} "
                     f"--min-lr {c['min_lr']:g} --warmup-steps {c['warmup_steps']} "
                     f"--dropout {c['dropout']:g} --lora-rank {a['rank']} --lora-alpha {a['alpha']:g} "
                     f"--seed {c['seed']} --threads {a['threads']}")
    lines += ["python -m minillm train --preset lora --ship " + " ".join(f"runs/lora-{g}" for g in ads), "```"]
    return lines


# ---------------------------------------------------------------------------- the command
def wants_lora(argv: list) -> bool:
    """Is this `python -m minillm train` command line the LoRA preset?"""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset")
    return pre.parse_known_args(argv)[0].preset == "lora"


def main(argv: list) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm train --preset lora", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=["lora"], required=True)
    ap.add_argument("--lora-slice", choices=SLICES, help="the genre whose training halves the adapter learns")
    ap.add_argument("--init-from", default=None, help="the frozen base model (.bin); default: the shipped one")
    ap.add_argument("--out", help="run folder: adapter/ (PEFT), log.jsonl, summary.json")
    ap.add_argument("--data-dir", default=None, help="cache for the genre's token streams")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--lora-alpha", type=float, default=16.0)
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ship", nargs="+", metavar="RUN", help="measure these runs and ship their adapters with the card")
    defaults = dict(batch_size=8, seq_len=256, lr=1e-3, min_lr=1e-4, warmup_steps=3, max_steps=30, dropout=0.1,
                    weight_decay=0.0, grad_clip=1.0, eval_every=5, eval_windows=32, seed=0, time_limit_s=None)
    for name, value in defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=float if isinstance(value, float) or value is None else int,
                        default=value)
    a = ap.parse_args(argv)
    use_threads(a.threads) if a.threads is not None else auto_threads()
    if a.ship:
        entry = ship(a.ship)
        print("\n".join(card_lines(entry)))
        return 0
    if not (a.lora_slice and a.out):
        ap.error("training needs --lora-slice and --out (or --ship RUN ...)")
    from ..formats.loader import MODELS_DIR
    tc = TrainConfig(out_dir=a.out, **{k: getattr(a, k) for k in defaults})
    summary = train_lora(a.init_from or os.path.join(MODELS_DIR, "shakespeare.bin"), a.lora_slice, a.out, tc,
                         a.lora_rank, a.lora_alpha, a.data_dir, a.label_smoothing)
    print(json.dumps({k: v for k, v in summary.items() if k != "train_config"}))
    return 0
