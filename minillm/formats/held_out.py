"""Held-out evaluation: the packaged held-out Shakespeare slice cut into windows, and a model's mean cross-entropy on
windows. Shared by training (the model card), the benchmarks and the notebooks, from this low layer."""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..llama.transformer import Transformer
from ..paths import MODELS_DIR


@torch.no_grad()
def evaluate(model: Transformer, x, y, batch_size: int = 16) -> float:
    """Mean cross-entropy (nats/token) over fixed windows. x, y: (N, T)."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(x), batch_size):
        logits = model(x[i:i + batch_size])                                       # (B, T, V)
        total += F.cross_entropy(logits.flatten(0, 1), y[i:i + batch_size].flatten(), reduction="sum").item()
        count += y[i:i + batch_size].numel()
    model.train(was)
    return total / count


def held_out_windows(tok, T: int = 256, max_windows: int = 25):
    """The packaged held-out Shakespeare slice, cut into (N, T) inputs and targets."""
    ids = torch.tensor(tok.encode(open(os.path.join(MODELS_DIR, "val_slice.txt")).read()))
    n = min(max_windows, (len(ids) - 1) // T)
    return ids[:n * T].view(n, T), ids[1:n * T + 1].view(n, T)
