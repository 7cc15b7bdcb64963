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

SCHEMES = ("int8", "int4", "q8_0")  # built so far; EngineConfig lists the others the issue names
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


# ----------------------------------------------------------------------------- Q8_0, as llama2.c's runq.c

def q80_group_size(dim: int, start: int = 64) -> int:
    """runq.c's export: group size 64, halved until it divides dim (llama.cpp's own Q8_0 uses 32)."""
    gs = start
    while dim % gs:
        gs //= 2
    return gs


def q80_quantize(x: torch.Tensor, gs: int):
    """runq.c's quantize(), per group of gs along the last dim: scale = max|x| / 127 (float32), q =
    round(x / scale) with C's round (half away from zero). x (..., K) float32 -> (q (..., K) int8,
    scales (..., K/gs) float32, max abs error). An all-zero group gets scale 0 and q 0."""
    K = x.shape[-1]
    if K % gs:
        raise ValueError(f"Q8_0: the dimension {K} is not divisible by the group size {gs}")
    xg = x.float().reshape(*x.shape[:-1], K // gs, gs)                               # (..., K/gs, gs)
    scale = xg.abs().amax(-1) / 127.0                                                # (..., K/gs) float32
    v = (xg / scale[..., None]).double()                                             # float32 division, as C
    q = torch.nan_to_num(torch.sign(v) * torch.floor(v.abs() + 0.5)).to(torch.int8)  # C's round(), then (int8_t)
    err = (q.double() * scale[..., None].double() - xg.double()).abs().max().item() if x.numel() else 0.0
    return q.reshape(x.shape), scale, err


class Q80Linear(nn.Module):
    """runq.c's matmul: activations quantized to int8 per group too; per group an exact integer dot
    product (int8 x int8 -> int32), then val += ival * w_scale * x_scale, groups in order, in float32."""

    def __init__(self, w_q: torch.Tensor, scales: torch.Tensor, group: int):
        super().__init__()
        self.register_buffer("w_q", w_q)          # (N, K) int8
        self.register_buffer("scales", scales)    # (N, K/G) float32
        self.group = group
        self.in_features, self.out_features = w_q.shape[1], w_q.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: int):
        q, s, err = q80_quantize(linear.weight.detach(), group)
        return cls(q, s, group), err

    def dequantize(self, dtype=torch.float32):
        return self.w_q.to(dtype) * self.scales.to(dtype).repeat_interleave(self.group, dim=1)  # (N, K)

    def forward(self, x):                                                           # (..., K) -> (..., N)
        N, K, G = self.out_features, self.in_features, self.group
        x2 = x.reshape(-1, K)                                                       # (M, K)
        xq, xs, _ = q80_quantize(x2, G)                                             # (M, K) int8, (M, K/G)
        # integer dot products per group: |sum| <= 127 * 127 * G < 2^24, so float32 holds them exactly
        ival = torch.einsum("mgk,ngk->mng", xq.float().view(-1, K // G, G), self.w_q.float().view(N, K // G, G))
        val = torch.zeros(x2.shape[0], N)                                           # (M, N)
        for g in range(K // G):                                                     # runq.c's order, in float32
            val = val + (ival[:, :, g] * self.scales[None, :, g]) * xs[:, None, g]
        return val.view(*x.shape[:-1], N).to(x.dtype)


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
    if scheme == "q8_0":      # runq.c's rule; the embedding is stored quantized too, so it is used dequantized
        group = q80_group_size(model.config.dim)
    if next(model.parameters()).dtype != torch.float32:
        raise ValueError("quantize a float32 model (dtype='float32')")
    model = copy.deepcopy(model)
    errors, before, after = {}, 0, 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            full = f"{name}.{child_name}" if name else child_name
            if scheme in ("int4", "q8_0") and child.in_features % group:
                raise ValueError(f"{full}: in_features={child.in_features} is not divisible by group_size={group}")
            q, err = (Int8Linear.from_linear(child) if scheme == "int8" else Int4Linear.from_linear(child, group)
                      if scheme == "int4" else Q80Linear.from_linear(child, group))
            setattr(module, child_name, q)
            errors[full] = err
            before += child.weight.numel() * 4
            after += sum(b.numel() * b.element_size() for b in q.buffers())
    if scheme == "q8_0":
        emb = model.tok_embeddings.weight
        q, sc, errors["tok_embeddings"] = q80_quantize(emb.detach(), group)
        with torch.no_grad():
            emb.copy_(q.float() * sc.repeat_interleave(group, dim=1))               # (V, C) as runq.c dequantizes it
    return model, {"scheme": scheme, "group_size": None if scheme == "int8" else group, "max_abs_error": errors,
                   "linear_bytes_fp32": before, "linear_bytes": after}
