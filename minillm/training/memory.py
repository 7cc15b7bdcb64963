"""What a model costs in memory to train and to serve (notebook 09).

Training with AdamW keeps, for every parameter, its weight, its gradient and Adam's two moments (the running
mean of the gradient, m, and of its square, v): in float32 that is 4 + 4 + 4 + 4 = 16 bytes a parameter (mixed
precision keeps the same 16: fp16 weights and gradients, fp32 master weights and moments; Rajbhandari et al.
2020, ZeRO), plus the activations the backward pass needs, which grow with batch x sequence length and are not
counted here. Inference keeps the weights (4 bytes a parameter in float32, 2 in fp16) and the KV cache: for
every token of every sequence in flight, K and V of every layer (ModelConfig.kv_bytes_per_token).
"""
from __future__ import annotations

import torch

from ..config import ModelConfig

TRAINING_PARTS = ("weights", "gradients", "Adam m", "Adam v")
INFERENCE_PARTS = ("weights", "KV cache")


def training_bytes(n_params: int, weight_bytes: int = 4, grad_bytes: int = 4, state_bytes: int = 4) -> dict:
    """Bytes an AdamW training step holds for n_params parameters (activations not counted):
    {"weights", "gradients", "Adam m", "Adam v"}; float32 throughout by default."""
    if n_params < 0:
        raise ValueError(f"n_params must be >= 0, got {n_params}")
    return {"weights": n_params * weight_bytes, "gradients": n_params * grad_bytes,
            "Adam m": n_params * state_bytes, "Adam v": n_params * state_bytes}


def inference_bytes(cfg: ModelConfig, tokens: int, weight_bytes: int = 4, kv_bytes: int = 4) -> dict:
    """Bytes serving holds with `tokens` tokens in the KV cache (summed over the sequences in flight):
    {"weights", "KV cache"}."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return {"weights": cfg.num_params() * weight_bytes, "KV cache": tokens * cfg.kv_bytes_per_token(kv_bytes)}


def per_parameter(parts: dict, n_params: int) -> dict:
    """Each part's bytes divided by the parameter count."""
    return {k: v / n_params for k, v in parts.items()}


def measured_training_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The bytes the tensors of a training step actually hold, after at least one optimizer step:
    the parameters (a tied weight counted once), their .grad, and Adam's exp_avg (m) and exp_avg_sq (v) in
    optimizer.state. Adam's per-tensor step counters (one number per parameter tensor) are left out."""
    params = list(model.parameters())                  # unique: a tied embedding / classifier appears once
    state = [optimizer.state[p] for p in params if p in optimizer.state]
    if not state:
        raise ValueError("the optimizer holds no state yet: run one optimizer step first")
    return {"weights": sum(p.nbytes for p in params),
            "gradients": sum(p.grad.nbytes for p in params if p.grad is not None),
            "Adam m": sum(s["exp_avg"].nbytes for s in state),
            "Adam v": sum(s["exp_avg_sq"].nbytes for s in state)}
