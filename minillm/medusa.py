"""Medusa heads (Cai et al. 2024, "Medusa-1"): extra next-next-token heads on a frozen target.

The target's own classifier reads the final hidden state h at position t and predicts token t+1.
Medusa adds K small heads that read the same h and guess further ahead: head k predicts token t+k+2.

    head k:  logits_k = W_cls (h + SiLU(W_k h + b_k))          W_k (C, C), b_k (C,), W_cls (V, C) frozen

W_k starts at zero, so before training every head is the target's own next-token head (SiLU(0) = 0);
training moves it to predict k+1 tokens further. Only W_k and b_k are learned (Medusa-1: the target
stays frozen, its classifier shared), so the heads file is K (C^2 + C) floats: 0.8 MB for the
shipped model.

Decoding with the heads: the top-k guesses of each head make a tree of candidate continuations
(build_tree); the target scores every node in one forward with tree attention (each node sees only
its ancestors: MedusaTree.mask); the longest path the target agrees with is accepted (greedy_accept).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------- the heads
class MedusaHeads(nn.Module):
    def __init__(self, dim: int, vocab_size: int, num_heads: int = 3):
        super().__init__()
        for name, value in (("dim", dim), ("vocab_size", vocab_size), ("num_heads", num_heads)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"MedusaHeads {name} must be a positive integer, got {value!r}")
        self.dim, self.vocab_size, self.num_heads = dim, vocab_size, num_heads
        self.weight = nn.Parameter(torch.zeros(num_heads, dim, dim))   # (K, C, C): W_k, zero = the target's head
        self.bias = nn.Parameter(torch.zeros(num_heads, dim))          # (K, C): b_k

    def forward(self, h, classifier_weight) -> torch.Tensor:
        """h (..., C), classifier_weight (V, C) (the target's frozen output.weight) -> logits (K, ..., V).
        logits[k] at position t predicts the token at t + k + 2."""
        if h.shape[-1] != self.dim:
            raise ValueError(f"hidden states have width {h.shape[-1]}, the Medusa heads expect dim={self.dim}")
        if tuple(classifier_weight.shape) != (self.vocab_size, self.dim):
            raise ValueError(f"classifier_weight has shape {tuple(classifier_weight.shape)}, the Medusa heads "
                             f"expect (vocab_size, dim) = ({self.vocab_size}, {self.dim})")
        lead = h.shape[:-1]
        x = h.reshape(-1, self.dim)                                    # (N, C), N = all leading positions
        z = x @ self.weight.transpose(1, 2) + self.bias[:, None, :]    # (K, N, C): W_k h + b_k
        r = x + F.silu(z)                                              # (K, N, C): the ResBlock
        logits = r @ classifier_weight.t()                             # (K, N, V)
        return logits.view(self.num_heads, *lead, self.vocab_size)     # (K, ..., V)


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


# ---------------------------------------------------------------------------- file format
#   "mdsa" | int32 version, num_heads, dim, vocab_size
#   | fingerprint of the target: int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len
#                                float64 sum of squares of the classifier weight
#   | float32 weight (K, C, C) | float32 bias (K, C)
MAGIC, VERSION = b"mdsa", 1
HEADER = struct.Struct("<4s4i")
FINGERPRINT = struct.Struct("<7id")
SHAPE_FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len")
CHECKSUM_RTOL = 1e-4  # the same weights in bf16/fp16 move the sum of squares by ~1e-5; another model's by far more


def classifier_checksum(target) -> float:
    return float(target.output.weight.detach().double().pow(2).sum())


def save_medusa(heads: MedusaHeads, path, target):
    cfg = target.config
    if (heads.dim, heads.vocab_size) != (cfg.dim, cfg.vocab_size):
        raise ValueError(f"heads of dim={heads.dim}, vocab_size={heads.vocab_size} do not fit the target "
                         f"(dim={cfg.dim}, vocab_size={cfg.vocab_size})")
    with open(path, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, heads.num_heads, heads.dim, heads.vocab_size))
        f.write(FINGERPRINT.pack(*(getattr(cfg, n) for n in SHAPE_FIELDS), classifier_checksum(target)))
        for p in (heads.weight, heads.bias):
            f.write(p.detach().to(torch.float32).cpu().numpy().tobytes())


def load_medusa(path, target) -> MedusaHeads:
    """Read heads saved by save_medusa; they must have been trained for this target (shape and classifier)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Medusa heads file not found: {path}")
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER.size + FINGERPRINT.size:
        raise ValueError(f"{path}: {len(data)} bytes is shorter than the Medusa header "
                         f"({HEADER.size + FINGERPRINT.size} bytes): truncated or not a heads file")
    magic, version, K, C, V = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"{path}: magic {magic!r} is not {MAGIC!r}: not a Medusa heads file")
    if version != VERSION:
        raise ValueError(f"{path}: Medusa heads file version {version}, this reader takes version {VERSION}")
    *shape, checksum = FINGERPRINT.unpack_from(data, HEADER.size)
    cfg = target.config
    theirs = dict(zip(SHAPE_FIELDS, shape))
    ours = {n: getattr(cfg, n) for n in SHAPE_FIELDS}
    if theirs != ours:
        diff = [n for n in SHAPE_FIELDS if theirs[n] != ours[n]]
        raise ValueError(f"Medusa heads in {path} were trained for a model with "
                         f"{', '.join(f'{n}={theirs[n]}' for n in diff)}, this model has "
                         f"{', '.join(f'{n}={ours[n]}' for n in diff)}")
    mine = classifier_checksum(target)
    if not math.isclose(checksum, mine, rel_tol=CHECKSUM_RTOL):
        raise ValueError(f"Medusa heads in {path} were trained for a model with classifier checksum {checksum:.6g}, "
                         f"this model has {mine:.6g}: same shape, other weights")
    # The heads' own fields, apart from the fingerprint: a file whose heads do not fit the target would
    # otherwise load and then fail inside every engine step.
    if (C, V) != (cfg.dim, cfg.vocab_size):
        raise ValueError(f"{path}: its header says heads of dim={C}, vocab_size={V}; the target has dim={cfg.dim}, "
                         f"vocab_size={cfg.vocab_size}")
    if K < 1:
        raise ValueError(f"{path}: its header says num_heads={K}; a heads file holds at least 1")
    want = HEADER.size + FINGERPRINT.size + 4 * K * (C * C + C)
    if len(data) != want:
        raise ValueError(f"{path}: expected {want} bytes for {K} heads of dim={C}, found {len(data)}: "
                         f"the file is {'truncated' if len(data) < want else 'longer than expected'}")
    flat = np.frombuffer(data, dtype=np.float32, offset=HEADER.size + FINGERPRINT.size)  # (K C C + K C,)
    heads = MedusaHeads(C, V, K)
    with torch.no_grad():
        heads.weight.copy_(torch.from_numpy(flat[:K * C * C].reshape(K, C, C).copy()))  # (K, C, C)
        heads.bias.copy_(torch.from_numpy(flat[K * C * C:].reshape(K, C).copy()))       # (K, C)
    return heads.to(target.output.weight.dtype).eval()


# ---------------------------------------------------------------------------- the candidate tree
@dataclass
class MedusaTree:
    tokens: list[int]        # (N,) node 0 is the root: the token the target just produced; nodes 1.. are candidates
    parents: list[int]       # (N,) parent node index, -1 for the root
    depths: list[int]        # (N,) 0 for the root; a node at depth d sits at position base + d (its RoPE position)
    mask: torch.Tensor       # (N, N) bool: mask[i, j] = node j is node i or one of its ancestors (tree attention)
    ranks: list[tuple]       # (N,) the path of top-k ranks that made each node, () for the root


# A path of top-k ranks per node: (0, 1) = head 0's best token, then head 1's second best after it.
# 14 candidates + the root. Measured for the shipped heads (32 val windows): head 0's rank-0..5 tokens
# are the target's greedy next-next token 24%, 8%, 5%, 4%, 3%, 2% of the time, head 1's rank 0 17%,
# head 2's 15%: the tree is widest at depth 1 and keeps a few paths down to depth 3 for the deeper heads.
DEFAULT_CHOICES: list[tuple[int, ...]] = [
    (0,), (1,), (2,), (3,), (4,), (5,),
    (0, 0), (0, 1), (1, 0), (0, 2), (2, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0),
]


def _check_choices(choices, num_heads: int, vocab_size: int) -> list[tuple[int, ...]]:
    seen: set[tuple[int, ...]] = set()
    out = []
    for c in choices:
        c = tuple(c)
        if not c or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < vocab_size for r in c):
            raise ValueError(f"tree choice {c!r} must be a non-empty path of ranks in [0, {vocab_size})")
        if len(c) > num_heads:
            raise ValueError(f"tree choice {c!r} is {len(c)} deep but there are only {num_heads} heads")
        if c in seen:
            raise ValueError(f"tree choice {c!r} appears twice")
        missing = [c[:i] for i in range(1, len(c)) if c[:i] not in seen]
        if missing:
            raise ValueError(f"tree choice {c!r} needs its prefix {missing[0]!r} to be a choice listed before it")
        seen.add(c)
        out.append(c)
    return out


def build_tree(root_token: int, head_logits: torch.Tensor, choices=DEFAULT_CHOICES) -> MedusaTree:
    """head_logits (K, V): the heads at the root's position, one sequence. One node per choice, in order;
    the node for choice c holds the c[-1]-th best token of head len(c) - 1, and its parent is c[:-1]."""
    K, V = head_logits.shape
    choices = _check_choices(choices, K, V)
    width = max((c[-1] for c in choices), default=0) + 1
    top = torch.topk(head_logits, min(width, V), dim=-1).indices.tolist()  # (K, width): best tokens first
    index = {(): 0}
    tokens, parents, depths, ranks = [int(root_token)], [-1], [0], [()]
    for c in choices:
        index[c] = len(tokens)
        tokens.append(top[len(c) - 1][c[-1]])
        parents.append(index[c[:-1]])
        depths.append(len(c))
        ranks.append(c)
    N = len(tokens)
    mask = torch.zeros(N, N, dtype=torch.bool)                         # (N, N)
    for i in range(N):
        if parents[i] >= 0:
            mask[i] = mask[parents[i]]                                 # the parent's ancestors (parents come first)
        mask[i, i] = True
    return MedusaTree(tokens, parents, depths, mask, ranks)


def greedy_accept(tree: MedusaTree, target_next: list[int]) -> list[int]:
    """target_next[i]: the target's argmax at node i. Walk down from the root, each time into the child
    whose token is what the target predicted at the current node. -> accepted node indices (root excluded).
    The engine emits tree.tokens[path] + [target_next[path[-1] if path else 0]]."""
    if len(target_next) != len(tree.tokens):
        raise ValueError(f"target_next has {len(target_next)} entries, the tree has {len(tree.tokens)} nodes")
    children: list[list[int]] = [[] for _ in tree.tokens]
    for i, p in enumerate(tree.parents):
        if p >= 0:
            children[p].append(i)
    path, node = [], 0
    while True:
        nxt = next((c for c in children[node] if tree.tokens[c] == target_next[node]), None)
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


# ---------------------------------------------------------------------------- CLI: train the shipped heads
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm.medusa", description=__doc__.split("\n")[0])
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
    from .loader import load
    torch.set_num_threads(a.threads)
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
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
