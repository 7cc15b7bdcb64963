"""Training Medusa-1 heads on a frozen target (`python -m minillm.training.medusa`, the command that made the
shipped heads): random windows of the corpus, the heads' loss against tokens t+2..t+K+1, AdamW; and per-head
top-1 accuracy on held-out windows."""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from ..atomic import open_replacing
from ..spec_decode.medusa_heads import MedusaHeads, save_medusa
from ..threads import use_threads


# ---------------------------------------------------------------------------- training and evaluation
def _windows(tokens: np.ndarray, starts, span: int) -> torch.Tensor:
    w = np.stack([tokens[s:s + span] for s in starts]).astype(np.int64)  # (B, span)
    return torch.from_numpy(w)


def _heads_loss(target, heads: MedusaHeads, w, seq_len: int, head_decay: float):
    """w (B, T + K + 1) token windows -> (weighted loss, per-head losses (K,), per-head logits (K, B, T, V))."""
    x = w[:, :seq_len]                                                 # (B, T)
    with torch.no_grad():
        _, h = target(x, return_hidden=True)                           # (B, T, C)
    logits = heads(h, target.output.weight.detach())                   # (K, B, T, V)
    losses = torch.stack([F.cross_entropy(logits[k].flatten(0, 1), w[:, k + 2:k + 2 + seq_len].flatten())
                          for k in range(heads.num_heads)])            # (K,): head k vs token t+k+2
    weights = head_decay ** torch.arange(heads.num_heads, dtype=losses.dtype)  # (K,): the paper's 0.8^k
    return (weights * losses).sum() / weights.sum(), losses, logits


def train_medusa(target, tokens: np.ndarray, num_heads: int = 3, steps: int = 260, batch_size: int = 8,
                 seq_len: int = 256, lr: float = 1e-2, seed: int = 0, log=None, head_decay: float = 0.8,
                 warmup_steps: int = 20, weight_decay: float = 0.0) -> MedusaHeads:
    """Medusa-1: the target frozen (no grad), K heads trained on random windows of `tokens` (1-D ids).
    loss = sum_k 0.8^k CE(head k at t, token t+k+2) / sum_k 0.8^k; AdamW, linear warm-up then cosine
    decay to lr/10. log(step, loss, per-head losses) is called every ~10% of the steps and at the end.
    Defaults: what fits ~5 minutes on one CPU thread for the shipped target (~1.1 s a step); lr 1e-2 beat
    1e-3 and 3e-3 in a 40-step probe (val head-0 accuracy 0.13 vs 0.09, 0.11): few steps want a big lr."""
    if steps < 1 or batch_size < 1 or seq_len < 1:
        raise ValueError(f"steps, batch_size and seq_len must be >= 1, got {steps}, {batch_size}, {seq_len}")
    span = seq_len + num_heads + 1                                     # x (T) plus the furthest head's targets (K + 1)
    if len(tokens) < span + 1:
        raise ValueError(f"{len(tokens)} tokens are too few for windows of seq_len={seq_len} with {num_heads} heads")
    if seq_len > target.config.max_seq_len:
        raise ValueError(f"seq_len={seq_len} exceeds the target's context max_seq_len={target.config.max_seq_len}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    heads = MedusaHeads(target.config.dim, target.config.vocab_size, num_heads)
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    was_training = target.training
    target.eval()
    for step in range(steps):
        warm = (step + 1) / warmup_steps if step < warmup_steps else 1.0
        cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * step / steps))       # 1 -> 0.1 over the run
        for g in opt.param_groups:
            g["lr"] = lr * min(warm, cosine)
        w = _windows(tokens, rng.integers(0, len(tokens) - span, size=batch_size), span)  # (B, T + K + 1)
        loss, losses, _ = _heads_loss(target, heads, w, seq_len, head_decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if log is not None and ((step + 1) % max(1, steps // 10) == 0 or step + 1 == steps):
            log(step + 1, loss.item(), [round(v, 4) for v in losses.tolist()])
    target.train(was_training)
    return heads.eval()


@torch.no_grad()
def head_accuracy(target, heads: MedusaHeads, tokens: np.ndarray, windows: int = 32, seq_len: int = 256,
                  batch_size: int = 8) -> list[float]:
    """Per-head top-1 accuracy: the fraction of positions t where argmax head k == token t+k+2, over
    `windows` evenly spaced windows of `tokens` (the same windows every call)."""
    K = heads.num_heads
    span = seq_len + K + 1                                             # the last head's target is t = T - 1 + K + 1
    if len(tokens) < span:
        raise ValueError(f"{len(tokens)} tokens are too few for windows of seq_len={seq_len} with {K} heads")
    starts = np.linspace(0, len(tokens) - span, max(1, windows)).astype(np.int64)
    hits, count = torch.zeros(K, dtype=torch.float64), 0
    for i in range(0, len(starts), batch_size):
        w = _windows(tokens, starts[i:i + batch_size], span)           # (B, T + K + 1)
        _, h = target(w[:, :seq_len], return_hidden=True)              # (B, T, C)
        guess = heads(h, target.output.weight).argmax(-1)              # (K, B, T)
        for k in range(K):
            hits[k] += (guess[k] == w[:, k + 2:k + 2 + seq_len]).sum().item()
        count += guess[0].numel()
    return (hits / count).tolist()


# ---------------------------------------------------------------------------- CLI: train the shipped heads
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm.training.medusa", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="shakespeare", help="the frozen target (minillm.load name or path)")
    ap.add_argument("--data-dir", default="runs/data", help="train.npy and val.npy token streams")
    ap.add_argument("--out", required=True, help="heads file to write; a .json log goes beside it")
    ap.add_argument("--steps", type=int, default=260)
    ap.add_argument("--num-heads", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    from ..formats.loader import load
    use_threads(a.threads)
    target, _ = load(a.model)
    train_ids = np.load(os.path.join(a.data_dir, "train.npy"))
    val_ids = np.load(os.path.join(a.data_dir, "val.npy"))
    t0 = time.perf_counter()
    heads = train_medusa(target, train_ids, a.num_heads, a.steps, a.batch_size, a.seq_len, a.lr, a.seed,
                         log=lambda s, loss, per: print(f"step {s}: loss {loss:.4f} per head {per}", flush=True))
    seconds = time.perf_counter() - t0
    acc = head_accuracy(target, heads, val_ids, a.eval_windows, a.seq_len)
    base = head_accuracy(target, MedusaHeads(target.config.dim, target.config.vocab_size, a.num_heads),
                         val_ids, a.eval_windows, a.seq_len)  # untrained heads = the target's t+1 guess at t+k+2
    save_medusa(heads, a.out, target)
    rec = {"model": a.model, "num_heads": a.num_heads, "steps": a.steps, "batch_size": a.batch_size,
           "seq_len": a.seq_len, "lr": a.lr, "seed": a.seed, "threads": a.threads,
           "train_tokens_seen": a.steps * a.batch_size * a.seq_len, "seconds": round(seconds, 1),
           "val_windows": a.eval_windows, "val_positions": a.eval_windows * a.seq_len,
           "val_top1_accuracy": [round(v, 4) for v in acc],
           "val_top1_accuracy_untrained": [round(v, 4) for v in base],
           "bytes": os.path.getsize(a.out)}
    with open_replacing(os.path.splitext(a.out)[0] + ".json", "w") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
