"""Training and distillation on 2 CPU cores: `python -m minillm train`.

nanoGPT's recipe, small: random windows of the token stream, AdamW (weight decay on matrices only),
linear warm-up then cosine decay, gradient clipping, dropout, periodic validation on fixed windows,
early stopping after `patience` evaluations without improvement, and a resumable checkpoint (model,
optimizer, step, RNG states) so a run can span sessions. The best model is exported as a llama2.c
.bin; a log of (step, tokens, train/val loss, lr, seconds) is written beside it.

Distillation (Hinton et al. 2015): with a teacher, the loss is
    L_KD = T^2 * KL(p_teacher^T || q_student^T) + lambda * CE(q_student, data)
p^T, q^T being softmax(logits / T); the T^2 keeps the soft-target gradients on the scale of the CE's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..atomic import open_appending, open_replacing, write_replacing
from ..config import ModelConfig
from ..formats.held_out import evaluate  # noqa: F401  (the training loop's, and its old home)
from ..formats.llama2c import load_bin, save_bin
from ..formats.loader import load_checkpoint
from ..llama.transformer import Transformer
from ..progress import progress
from ..threads import auto_threads, use_threads


@dataclass
class TrainConfig:
    out_dir: str = "runs/model"
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 200
    max_steps: int = 20000          # the cosine schedule's length; early stopping usually ends sooner
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dropout: float = 0.1
    eval_every: int = 250
    eval_windows: int = 64          # fixed validation windows, so evaluations are comparable
    patience: int = 3
    seed: int = 0
    time_limit_s: Optional[float] = None  # stop (resumably) after this long; the run continues with --resume
    kd_temperature: float = 2.0
    kd_lambda: float = 0.5

    def __post_init__(self):
        for name in ("batch_size", "seq_len", "max_steps", "eval_every", "eval_windows", "patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"TrainConfig.dropout must be in [0, 1), got {self.dropout}")


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warm-up to lr, then cosine decay to min_lr at max_steps."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    t = min(1.0, (step - tc.warmup_steps) / max(1, tc.max_steps - tc.warmup_steps))
    return tc.min_lr + 0.5 * (1 + math.cos(math.pi * t)) * (tc.lr - tc.min_lr)


def get_batch(tokens: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator):
    """Random windows: x (B, T) and the next tokens y (B, T)."""
    if len(tokens) < seq_len + 2:
        raise ValueError(f"{len(tokens)} tokens are too few for windows of seq_len={seq_len}")
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch_size)
    w = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64)  # (B, T+1)
    return torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])


def eval_windows(tokens: np.ndarray, n: int, seq_len: int):
    """n evenly spaced, non-overlapping where possible, windows: the same every evaluation."""
    n = max(1, min(n, (len(tokens) - 1) // seq_len))
    starts = np.linspace(0, len(tokens) - seq_len - 1, n).astype(np.int64)
    w = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64)  # (n, T+1)
    return torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])


@torch.no_grad()
def position_losses(model: Transformer, x, y, batch_size: int = 4) -> torch.Tensor:
    """Mean cross-entropy at each position over fixed windows: (T,). Shows whether a model trained on
    short windows still predicts well late in its context. x, y: (N, T)."""
    was = model.training
    model.eval()
    total = torch.zeros(x.shape[1], dtype=torch.float64)
    for i in range(0, len(x), batch_size):
        logits = model(x[i:i + batch_size])                                       # (B, T, V)
        nll = F.cross_entropy(logits.transpose(1, 2), y[i:i + batch_size], reduction="none")  # (B, T)
        total += nll.double().sum(0)
    model.train(was)
    return total / len(x)


def kd_loss(student_logits, teacher_logits, targets, T: float, lam: float):
    """T^2 KL(p_teacher^T || q_student^T) + lambda CE. logits: (B, T, V); targets: (B, T)."""
    s = F.log_softmax(student_logits.flatten(0, 1) / T, -1)                        # (B*T, V)
    t = F.log_softmax(teacher_logits.flatten(0, 1) / T, -1)                        # (B*T, V)
    kl = F.kl_div(s, t, log_target=True, reduction="batchmean")
    ce = F.cross_entropy(student_logits.flatten(0, 1), targets.flatten())
    return T * T * kl + lam * ce


def _optimizer(model: Transformer, tc: TrainConfig):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=tc.lr, betas=(0.9, 0.95))


STATE_KEYS = ("model", "optimizer", "numpy_rng", "torch_rng", "step", "best", "bad", "seconds", "tokens")


def load_state(path) -> dict:
    """state.pt, unpickled with weights_only=True: a state file is data, and one planted in a run folder must not
    run code, which torch.load's full unpickler does for whatever callable the pickle names. What train() saves
    is all tensors and plain values (numpy's RNG state is a dict of str and int), so it loads this way."""
    try:
        st = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        line = next((ln for ln in str(e).splitlines() if "WeightsUnpickler error:" in ln), str(e))  # torch's own reason
        why = line.split("WeightsUnpickler error:")[-1].split(" Please use")[0].strip()[:200]
        raise ValueError(f"{path}: refusing to unpickle it: it holds objects other than tensors and plain values, "
                         f"which torch.load(weights_only=True) will not build ({why}). A state file train() wrote "
                         f"never does; start afresh, or from weights alone with --init-from MODEL.bin") from None
    except (RuntimeError, EOFError) as e:
        raise ValueError(f"{path}: not a readable state file ({e}); start afresh, "
                         "or with --init-from MODEL.bin") from None
    missing = [k for k in STATE_KEYS if not isinstance(st, dict) or k not in st]
    if missing:
        raise ValueError(f"{path}: not a state file train() wrote: it lacks {', '.join(missing)}")
    return st


def run_label(model_cfg: ModelConfig, out_dir: str) -> str:
    """What a training run's progress bar is called: its folder's name ("runs/shakespeare" -> "shakespeare"),
    or the model's shape when the folder is a temporary one (a notebook's tempfile.mkdtemp() says nothing)."""
    path = os.path.realpath(out_dir)
    folder = os.path.basename(path)
    made_by_mkdtemp = os.path.dirname(path) == os.path.realpath(tempfile.gettempdir()) and folder.startswith("tmp")
    if folder and not made_by_mkdtemp:         # (a project that lives under /tmp keeps its runs' names)
        return folder
    c = model_cfg
    return f"model dim {c.dim}, {c.n_layers} layers, {c.num_params() / 1e6:.2f} M params"


def train(model_cfg: ModelConfig, train_tokens: np.ndarray, val_tokens: np.ndarray, tc: TrainConfig,
          teacher: Optional[Transformer] = None, resume: bool = False, log=print,
          init_from: Optional[str] = None, kd_loss_fn: Callable = kd_loss, name: Optional[str] = None) -> dict:
    """Train until early stopping, max_steps or the time limit. Returns a summary dict.
    Files in tc.out_dir: state.pt (resume), model.bin (best so far, llama2.c v0), log.jsonl, summary.json.
    With a teacher, each step's loss is kd_loss_fn(student_logits, teacher_logits, targets, T, lambda): kd_loss
    unless another is given (notebook 09's exercise plugs the reader's in here). name labels the progress bar
    (default: run_label(model_cfg, tc.out_dir))."""
    os.makedirs(tc.out_dir, exist_ok=True)
    state_path, log_path = os.path.join(tc.out_dir, "state.pt"), os.path.join(tc.out_dir, "log.jsonl")
    model_cfg.dropout = tc.dropout
    torch.manual_seed(tc.seed)
    model = Transformer(model_cfg).init_weights(tc.seed)
    if init_from:  # weights only (a .bin): continue a run whose state.pt was lost, with a fresh optimizer
        model.load_state_dict(load_bin(init_from).state_dict())
        log(f"initialised from {init_from}")
    opt = _optimizer(model, tc)
    rng = np.random.default_rng(tc.seed)
    step, best, bad, seconds, tokens_seen = 0, float("inf"), 0, 0.0, 0
    if resume and not os.path.exists(state_path):
        raise FileNotFoundError(f"--resume: no saved state at {state_path} (use --init-from MODEL.bin to start "
                                f"from weights alone)")
    if resume:
        st = load_state(state_path)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        rng.bit_generator.state = st["numpy_rng"]
        torch.set_rng_state(st["torch_rng"])
        step, best, bad, seconds, tokens_seen = st["step"], st["best"], st["bad"], st["seconds"], st["tokens"]
        log(f"resumed at step {step} (best val {best:.4f}, {bad} evals without improvement)")
    elif os.path.exists(log_path):
        os.remove(log_path)
    vx, vy = eval_windows(val_tokens, tc.eval_windows, tc.seq_len)
    if teacher is not None:
        teacher.eval()
    model.train()
    stop_reason, t_start = "max_steps", time.perf_counter() - seconds
    bar = progress(tc.max_steps, step, name or run_label(model_cfg, tc.out_dir))
    while step < tc.max_steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc)
        x, y = get_batch(train_tokens, tc.batch_size, tc.seq_len, rng)
        logits = model(x)                                                            # (B, T, V)
        if teacher is None:
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        else:
            with torch.no_grad():
                t_logits = teacher(x)                                                # (B, T, V)
            loss = kd_loss_fn(logits, t_logits, y, tc.kd_temperature, tc.kd_lambda)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        out_of_time = tc.time_limit_s is not None and time.perf_counter() - t_start - seconds >= tc.time_limit_s
        if step % tc.eval_every == 0 or step == tc.max_steps or out_of_time:
            val = evaluate(model, vx, vy)
            rec = {"step": step, "tokens": tokens_seen, "train_loss": round(loss.item(), 4), "val_loss": round(val, 4),
                   "lr": lr_at(step - 1, tc), "seconds": round(time.perf_counter() - t_start, 1)}
            with open_appending(log_path) as f:
                f.write(json.dumps(rec) + "\n")
            if val < best - 1e-4:
                best, bad = val, 0
                save_bin(model, os.path.join(tc.out_dir, "model.bin"))
            else:
                bad += 1
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                     "numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                     "step": step, "best": best, "bad": bad,
                     "seconds": time.perf_counter() - t_start, "tokens": tokens_seen,
                     "model_config": model_cfg.to_dict(), "train_config": asdict(tc)}
            write_replacing(state_path, lambda tmp: torch.save(state, tmp))
            log(f"step {step}: train {loss.item():.4f} val {val:.4f} (best {best:.4f}, {bad} without improvement)")
            if bad >= tc.patience:
                stop_reason = "early_stopping"
                break
            if out_of_time:
                stop_reason = "time_limit"
                break
    bar.close()
    summary = {"stop_reason": stop_reason, "steps": step, "tokens": tokens_seen, "best_val_loss": best,
               "seconds": round(time.perf_counter() - t_start, 1), "params": model_cfg.num_params(),
               "model_config": model_cfg.to_dict(), "train_config": asdict(tc)}
    with open_replacing(os.path.join(tc.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def unigram_loss(train_tokens: np.ndarray, val_tokens: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy of the val tokens under train-set token frequencies (add-one smoothed): the baseline
    a model must beat by learning context at all."""
    counts = np.bincount(train_tokens, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[val_tokens].mean())


def load_teacher(path: str) -> Transformer:
    """A v0 .bin or a runq.c Q8_0 file: a teacher only runs forward, so a quantized one serves."""
    return load_checkpoint(path).eval()


# ---------------------------------------------------------------------------- data preparation and CLI
def prepare_data(data_dir: str, vocab_size: int, tokenizer_path: Optional[str] = None, log=print):
    """Corpus -> BPE tokenizer (trained on the train split unless given) -> token streams, cached in data_dir.
    -> (Tokenizer, train_ids (N,) uint16, val_ids (M,) uint16)"""
    from ..formats.bpe import train_bpe
    from ..llama.tokenizer import Tokenizer
    from .data import build_corpus, encode_works
    os.makedirs(data_dir, exist_ok=True)
    tok_path = tokenizer_path or os.path.join(data_dir, "tokenizer.bin")
    tr_path, va_path = os.path.join(data_dir, "train.npy"), os.path.join(data_dir, "val.npy")
    meta_path = os.path.join(data_dir, "corpus.json")
    if all(os.path.exists(p) for p in (tok_path, tr_path, va_path, meta_path)):
        tok, meta = Tokenizer.load(tok_path), json.load(open(meta_path))
        if meta.get("tokenizer_sha256") == _sha256(tok_path) and (tokenizer_path or tok.vocab_size == vocab_size):
            return tok, np.load(tr_path), np.load(va_path)
        log(f"token cache in {data_dir} was made with another tokenizer: rebuilding it")
    if vocab_size > 65535 and not tokenizer_path:
        raise ValueError(f"vocab_size={vocab_size}: token streams are stored as uint16 (at most 65535)")
    corpus = build_corpus()
    if tokenizer_path:
        tok = Tokenizer.load(tokenizer_path)
    else:
        t0 = time.perf_counter()
        tok = train_bpe("".join(w.text for w in corpus.train), vocab_size)
        tok.save(tok_path)
        log(f"trained a {tok.vocab_size}-token BPE on {len(corpus.train)} works in {time.perf_counter() - t0:.1f} s")
    train_ids, val_ids = encode_works(corpus.train, tok), encode_works(corpus.val, tok)
    for path, ids in ((tr_path, train_ids), (va_path, val_ids)):
        with open_replacing(path) as f:
            np.save(f, ids)
    with open_replacing(os.path.join(data_dir, "corpus.json"), "w") as f:
        json.dump({"train_works": [w.name for w in corpus.train], "val_works": [w.name for w in corpus.val],
                   "dropped_editions": corpus.dropped, "train_chars": sum(len(w.text) for w in corpus.train),
                   "val_chars": sum(len(w.text) for w in corpus.val), "train_tokens": int(len(train_ids)),
                   "val_tokens": int(len(val_ids)), "vocab_size": tok.vocab_size,
                   "tokenizer_sha256": _sha256(tok_path)}, f, indent=2)
    log(f"corpus: {len(train_ids)} train tokens, {len(val_ids)} val tokens")
    return tok, train_ids, val_ids


def _sha256(path: str) -> str:
    import hashlib
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


RUN_FILES = ("state.pt", "model.bin", "log.jsonl", "summary.json")


def check_out_dir(out_dir: str, resume: bool, force: bool):
    """A new run in a folder that holds one would overwrite its model, state and log: refused unless --force,
    which deletes them first (a stale state.pt left beside a new run would be what --resume continues)."""
    if resume and force:
        raise ValueError(f"--resume continues the run in {out_dir} and --force deletes it: pass one of them")
    found = [n for n in ("state.pt", "model.bin") if os.path.exists(os.path.join(out_dir, n))]
    if not found or resume:
        return
    if not force:
        raise ValueError(f"{out_dir} already holds a run ({', '.join(found)}): continue it with --resume, start a "
                         f"new one with another --out, or delete it and start over with --force")
    for name in RUN_FILES:
        if os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm train", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shakespeare", help="model shape (minillm.config.PRESETS)")
    ap.add_argument("--out", required=True, help="run folder: state.pt, model.bin, log.jsonl, summary.json")
    ap.add_argument("--data-dir", default=None, help="tokenizer and token cache (default: <out>/../data)")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--tokenizer", default=None, help="use this tokenizer.bin instead of training one")
    ap.add_argument("--teacher", default=None, help="distil from this llama2.c .bin (same tokenizer)")
    ap.add_argument("--resume", action="store_true", help="continue from <out>/state.pt")
    ap.add_argument("--force", action="store_true", help="start over in an --out that holds a run, deleting it")
    ap.add_argument("--init-from", default=None, help="start from these weights (.bin), fresh optimizer")
    ap.add_argument("--threads", type=int, default=None)
    for f in TrainConfig.__dataclass_fields__.values():
        if f.name != "out_dir":
            ap.add_argument("--" + f.name.replace("_", "-"),
                            type=float if f.type in ("float", "Optional[float]") else int, default=f.default)
    a = ap.parse_args(argv)
    check_out_dir(a.out, a.resume, a.force)  # before the data is prepared: minutes, for a run that would be refused
    if a.threads is not None:
        use_threads(a.threads)
    else:
        auto_threads()
    tc = TrainConfig(out_dir=a.out, **{k: getattr(a, k) for k in TrainConfig.__dataclass_fields__ if k != "out_dir"})
    data_dir = a.data_dir or os.path.join(os.path.dirname(os.path.abspath(a.out)), "data")
    tok, train_ids, val_ids = prepare_data(data_dir, a.vocab_size, a.tokenizer)
    cfg = ModelConfig.from_name(a.preset, vocab_size=tok.vocab_size)
    teacher = load_teacher(a.teacher) if a.teacher else None
    if teacher is not None and teacher.config.vocab_size != cfg.vocab_size:
        raise ValueError(f"teacher vocab {teacher.config.vocab_size} != student vocab {cfg.vocab_size}")
    print(f"{a.preset}: {cfg.num_params():,} parameters; unigram baseline val loss "
          f"{unigram_loss(train_ids, val_ids, cfg.vocab_size):.4f} nats/token")
    summary = train(cfg, train_ids, val_ids, tc, teacher=teacher, resume=a.resume, init_from=a.init_from)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("model_config", "train_config")}))
    return 0
