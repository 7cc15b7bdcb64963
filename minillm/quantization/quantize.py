"""quantize_model: a copy of a model with every nn.Linear replaced by its quantized twin (minillm.llama.linears),
for each scheme EngineConfig.quantization names, with each layer's max weight error (DESIGN.md rule 9)."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ..config import INT4_GROUPS, QUANTIZATION_SCHEMES
from ..llama.linears import Int4Linear, Int8Linear, Q80Linear, W8A8Linear, q80_group_size, q80_quantize
from .awq import awq_quantize
from .calibration import activation_absmax, calibration_ids, linear_inputs, smoothing_factors
from .gptq import gptq_from_config

SCHEMES = QUANTIZATION_SCHEMES                     # every scheme quantize_model builds (EngineConfig's list)


def quantize_model(model: nn.Module, scheme: str, quant_config: dict | None = None, tokenizer=None):
    """A copy of `model` with every nn.Linear (attention, MLP, classifier) replaced by its quantized
    twin; the token embedding stays float (a lookup reads one row). -> (model, report) where report
    maps each replaced module's name to its max abs weight error, plus the weight bytes before/after."""
    if scheme not in SCHEMES:
        raise ValueError(f"quantization={scheme!r} is not available in this build; built: {', '.join(SCHEMES)}")
    if scheme == "gptq":                           # Hessian-based int4, its own options (minillm.quantization.gptq)
        return gptq_from_config(model, quant_config, tokenizer)
    cfg = dict(quant_config or {})
    group = cfg.pop("group_size", 32)
    alpha = float(cfg.pop("alpha", 0.5))
    if cfg:
        raise ValueError(f"unknown quant_config keys {sorted(cfg)}; known: group_size (int4), alpha (smoothquant)")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smoothquant alpha must be in [0, 1], got {alpha}")
    act = inputs = None
    if scheme in ("smoothquant", "awq"):
        if tokenizer is None:
            raise ValueError(f"{scheme} calibrates on text: pass the tokenizer")
        if scheme == "smoothquant":
            act = activation_absmax(model, calibration_ids(tokenizer))
        else:
            inputs = linear_inputs(model, calibration_ids(tokenizer), rows=1024)
    if scheme == "awq" and group not in INT4_GROUPS:
        raise ValueError(f"awq (int4) group_size must be one of {INT4_GROUPS}, got {group}")
    if scheme == "int4" and group not in INT4_GROUPS:
        raise ValueError(f"int4 group_size must be one of {INT4_GROUPS}, got {group}")
    if scheme == "q8_0":      # runq.c's rule; the embedding is stored quantized too, so it is used dequantized
        group = q80_group_size(model.config.dim)
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"quantization={scheme!r} quantizes float32 weights; this model is {dtype} "
                         "(use dtype='float32')")
    model = copy.deepcopy(model)
    errors, before, after = {}, 0, 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            full = f"{name}.{child_name}" if name else child_name
            if scheme in ("int4", "q8_0", "awq") and child.in_features % group:
                raise ValueError(f"{full}: in_features={child.in_features} is not divisible by group_size={group}")
            if scheme == "int8":
                q, err = Int8Linear.from_linear(child)
            elif scheme == "int4":
                q, err = Int4Linear.from_linear(child, group)
            elif scheme == "q8_0":
                q, err = Q80Linear.from_linear(child, group)
            elif scheme == "awq":
                q, err = awq_quantize(child.weight, inputs[full], group)
            else:                                  # w8a8, smoothquant
                smooth = smoothing_factors(act[full], child.weight, alpha) if act is not None else None
                q, err = W8A8Linear.from_linear(child, smooth)
            setattr(module, child_name, q)
            errors[full] = err
            before += child.weight.numel() * 4
            after += sum(b.numel() * b.element_size() for b in q.buffers())
    if scheme == "q8_0":
        emb = model.tok_embeddings.weight
        q, sc, errors["tok_embeddings"] = q80_quantize(emb.detach(), group)
        with torch.no_grad():
            emb.copy_(q.float() * sc.repeat_interleave(group, dim=1))               # (V, C) as runq.c dequantizes it
    return model, {"scheme": scheme, "group_size": group if scheme in ("int4", "q8_0", "awq") else None,
                   "alpha": alpha if scheme == "smoothquant" else None, "max_abs_error": errors,
                   "linear_bytes_fp32": before, "linear_bytes": after}
