"""Calibration: what the float model's linears see on text (the packaged Hamlet excerpt, training data, never
the held-out plays), and SmoothQuant's per-channel migration factors (Xiao et al. 2023). with_outlier_channels
makes the case SmoothQuant is for on a model too small to grow outlier channels by itself."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ..paths import SAMPLE_TEXT


def linear_inputs(model: nn.Module, calibration: torch.Tensor, rows: int = 512) -> dict:
    """What every nn.Linear reads while the float model runs on `calibration` (B, T) token ids:
    {name: (rows, K) a sample of its input rows}, the statistics SmoothQuant and AWQ calibrate on."""
    seen, hooks = {}, []
    pick = torch.randperm(calibration.numel(), generator=torch.Generator().manual_seed(0))[:rows]
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            def hook(m, inputs, out, name=name):
                seen[name] = inputs[0].detach().reshape(-1, inputs[0].shape[-1])[pick].float()  # (rows, K)
            hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(calibration)
    finally:
        for h in hooks:
            h.remove()
    return seen


def activation_absmax(model: nn.Module, calibration: torch.Tensor) -> dict:
    """Per input channel max |x| seen by every nn.Linear on the calibration tokens: SmoothQuant's statistic."""
    return {k: x.abs().amax(0) for k, x in linear_inputs(model, calibration, calibration.numel()).items()}


def calibration_ids(tokenizer, tokens: int = 2048, T: int = 256) -> torch.Tensor:
    """Calibration text: the packaged Hamlet excerpt (training data, never the held-out plays) -> (B, T)."""
    with open(SAMPLE_TEXT, encoding="utf-8") as f:
        ids = tokenizer.encode(f.read())[:tokens]
    n = len(ids) // T
    return torch.tensor(ids[:n * T]).view(n, T)


def smoothing_factors(act_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) (Xiao et al. 2023, eq. 4), per input channel j."""
    w_max = weight.detach().abs().amax(0).clamp_min(1e-5)                           # (K,)
    return (act_max.clamp_min(1e-5).pow(alpha) / w_max.pow(1 - alpha)).clamp_min(1e-5)


def with_outlier_channels(model: nn.Module, channels=(3, 77, 150), factor: float = 60.0) -> nn.Module:
    """A copy computing the same function, with LLM-style activation outliers: in every layer the RMSNorm
    weights of `channels` are multiplied by `factor` and the matching input columns of the linears that
    read them (q, k, v, w1, w3) divided by it. Large models grow such channels by themselves (Dettmers et
    al. 2022, LLM.int8()); a 7M-parameter model does not, so this makes the case SmoothQuant is for."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for layer in model.layers:
            for j in channels:
                layer.attention_norm.weight[j] *= factor
                layer.ffn_norm.weight[j] *= factor
                for lin in (layer.attention.wq, layer.attention.wk, layer.attention.wv,
                            layer.feed_forward.w1, layer.feed_forward.w3):
                    lin.weight[:, j] /= factor
    return model
