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

This file: the heads and their file format. The tree is minillm.spec_decode.medusa_tree, the proposer
minillm.spec_decode.medusa, training minillm.training.medusa.
"""
from __future__ import annotations

import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..atomic import open_replacing


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
    with open_replacing(path) as f:
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
