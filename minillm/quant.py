"""Weight-only quantization: a quantized weight is a drop-in for nn.Linear (DESIGN.md rule 9).

    int8  per output channel:  w_q (N, K) int8, scales (N,) fp32           W ~ scales[:, None] * w_q
    int4  group-wise (G):      w_packed (N, K/2) uint8, scales (N, K/G)    W ~ scale of k's group * (nibble - 8)

The layouts are DESIGN.md's, shared with minillm.kernels.quant_gemv, whose quantizers these use (each
returns its own max abs error). Why it pays: decoding reads every weight once per token, so its time
is the weight bytes over memory bandwidth; int8 is 1/4 and int4 about 1/8 of float32's bytes.

Forward: a single row (batch-1 decode) runs the dequantizing GEMV kernel's CPU twin, which reads the
small integer weights directly; several rows (prefill, batched decode) dequantize to x's dtype and
call torch's matmul, as gpt-fast's WeightOnlyInt8Linear does: `F.linear(x, w_q.to(x.dtype)) * scales`.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .kernels.quant_gemv import int4_gemv_rows, int8_gemv_rows, quantize_int4, quantize_int8

SCHEMES = ("int8", "int4")          # built so far; EngineConfig lists the others the issue names
INT4_GROUPS = (32, 64, 128)


class Int8Linear(nn.Module):
    def __init__(self, w_q: torch.Tensor, scales: torch.Tensor):
        super().__init__()
        self.register_buffer("w_q", w_q)          # (N, K) int8
        self.register_buffer("scales", scales)    # (N,) float32
        self.in_features, self.out_features = w_q.shape[1], w_q.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear):
        """-> (Int8Linear, max abs error of the dequantized weight)."""
        q, s, err = quantize_int8(linear.weight.detach().float().numpy())
        return cls(torch.from_numpy(q), torch.from_numpy(s)), err

    def dequantize(self, dtype=torch.float32):
        return self.w_q.to(dtype) * self.scales.to(dtype)[:, None]                 # (N, K)

    def forward(self, x):                                                           # (..., K) -> (..., N)
        if _one_row(x):
            y = np.empty((1, self.out_features), np.float32)                        # (1, N)
            int8_gemv_rows(x.detach().reshape(1, -1).contiguous().numpy(), self.w_q.numpy(), self.scales.numpy(), y)
            return torch.from_numpy(y).view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.w_q.to(x.dtype)) * self.scales.to(x.dtype)


class Int4Linear(nn.Module):
    def __init__(self, w_packed: torch.Tensor, scales: torch.Tensor, group: int):
        super().__init__()
        self.register_buffer("w_packed", w_packed)   # (N, K/2) uint8: even k low nibble, odd k high, as q + 8
        self.register_buffer("scales", scales)       # (N, K/G) float32
        self.group = group
        self.in_features, self.out_features = 2 * w_packed.shape[1], w_packed.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: int):
        """-> (Int4Linear, max abs error of the dequantized weight)."""
        packed, s, err = quantize_int4(linear.weight.detach().float().numpy(), group)
        return cls(torch.from_numpy(packed), torch.from_numpy(s), group), err

    def dequantize(self, dtype=torch.float32):
        lo = (self.w_packed & 15).to(torch.int16) - 8                               # (N, K/2) even k
        hi = (self.w_packed >> 4).to(torch.int16) - 8                               # (N, K/2) odd k
        q = torch.stack((lo, hi), dim=-1).flatten(1)                                # (N, K)
        return q.to(dtype) * self.scales.to(dtype).repeat_interleave(self.group, dim=1)  # (N, K)

    def forward(self, x):                                                           # (..., K) -> (..., N)
        if _one_row(x):
            y = np.empty((1, self.out_features), np.float32)                        # (1, N)
            int4_gemv_rows(x.detach().reshape(1, -1).contiguous().numpy(), self.w_packed.numpy(),
                           self.scales.numpy(), self.group, y)
            return torch.from_numpy(y).view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.dequantize(x.dtype))


def _one_row(x) -> bool:
    return x.numel() == x.shape[-1] and x.dtype == torch.float32 and x.device.type == "cpu" and not x.requires_grad


def quantize_model(model: nn.Module, scheme: str, quant_config: dict | None = None):
    """A copy of `model` with every nn.Linear (attention, MLP, classifier) replaced by its quantized
    twin; the token embedding stays float (a lookup reads one row). -> (model, report) where report
    maps each replaced module's name to its max abs weight error, plus the weight bytes before/after."""
    if scheme not in SCHEMES:
        raise ValueError(f"quantization={scheme!r} is not available in this build; built: {', '.join(SCHEMES)}")
    cfg = dict(quant_config or {})
    group = cfg.pop("group_size", 32)
    if cfg:
        raise ValueError(f"unknown quant_config keys {sorted(cfg)}; known: group_size")
    if scheme == "int4" and group not in INT4_GROUPS:
        raise ValueError(f"int4 group_size must be one of {INT4_GROUPS}, got {group}")
    if next(model.parameters()).dtype != torch.float32:
        raise ValueError("quantize a float32 model (dtype='float32')")
    model = copy.deepcopy(model)
    errors, before, after = {}, 0, 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            full = f"{name}.{child_name}" if name else child_name
            if scheme == "int4" and child.in_features % group:
                raise ValueError(f"{full}: in_features={child.in_features} is not divisible by group_size={group}")
            q, err = Int8Linear.from_linear(child) if scheme == "int8" else Int4Linear.from_linear(child, group)
            setattr(module, child_name, q)
            errors[full] = err
            before += child.weight.numel() * 4
            after += sum(b.numel() * b.element_size() for b in q.buffers())
    return model, {"scheme": scheme, "group_size": group if scheme == "int4" else None, "max_abs_error": errors,
                   "linear_bytes_fp32": before, "linear_bytes": after}
