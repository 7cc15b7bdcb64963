"""Weight types the linear op dispatches on: each quantized weight is a drop-in for nn.Linear (DESIGN.md rule 9).

The quantizers that make them (per-channel, group-wise, AWQ's search, SmoothQuant's calibration) are in
minillm.quantization; llama2.c's runq files hold Q8_0 weights (minillm.formats.runq)

    int8  per output channel:  w_q (N, K) int8, scales (N,) fp32           W ~ scales[:, None] * w_q
    int4  group-wise (G):      w_packed (N, K/2) uint8, scales (N, K/G)    W ~ scale of k's group * (nibble - 8)
    2:4   sparse:              values (N, K/2) fp32, meta (N, K/8) uint8  2 of every 4 inputs, 2-bit positions

The layouts are DESIGN.md's, shared with minillm.kernels.quant_gemv, whose quantizers these use (each
returns its own max abs error). Why it pays: decoding reads every weight once per token, so its time
is the weight bytes over memory bandwidth; int8 is 1/4 and int4 about 1/8 of float32's bytes.

Forward: a single row (batch-1 decode) runs the dequantizing GEMV kernel's CPU twin, which reads the
small integer weights directly; several rows (prefill, batched decode) dequantize to x's dtype and
call torch's matmul, as gpt-fast's WeightOnlyInt8Linear does: `F.linear(x, w_q.to(x.dtype)) * scales`.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels.quant_gemv import int4_gemv_rows, int8_gemv_rows, quantize_int4, quantize_int8
from ..kernels.sparse24 import compress_24, decompress_24, sparse24_gemv_rows


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
        """The weight this module multiplies by, (N, K)."""
        return self.unpacked(dtype)

    def unpacked(self, dtype=torch.float32):
        """The stored int4 values times their group scales, (N, K)."""
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
        return F.linear(x, self.unpacked(x.dtype))


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


class W8A8Linear(nn.Module):
    """Weights int8 per output channel and activations int8 per token (dynamic absmax), multiplied as
    integers: y = (x_q @ w_q^T) * x_scale * w_scale. With `smooth` (K,), x is divided by it first and
    the weight was multiplied by it before quantization (SmoothQuant, Xiao et al. 2023): the product is
    unchanged in exact arithmetic, but the activation outliers move into the weights, which quantize
    per output channel and so absorb them."""

    def __init__(self, w_q: torch.Tensor, w_scale: torch.Tensor, smooth: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("w_q", w_q)            # (N, K) int8
        self.register_buffer("w_scale", w_scale)    # (N,) float32
        self.register_buffer("smooth", smooth)      # (K,) float32 or None
        self.in_features, self.out_features = w_q.shape[1], w_q.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear, smooth: torch.Tensor | None = None):
        w = linear.weight.detach().float()
        if smooth is not None:
            w = w * smooth[None, :]                                                 # W' = W diag(s)
        q, sc, err = quantize_int8(w.numpy())
        return cls(torch.from_numpy(q), torch.from_numpy(sc), smooth), err

    def forward(self, x):                                                           # (..., K) -> (..., N)
        x2 = x.reshape(-1, self.in_features).float()                                # (M, K)
        if self.smooth is not None:
            x2 = x2 / self.smooth                                                   # X' = X diag(s)^-1
        xs = (x2.abs().amax(-1, keepdim=True) / 127.0).clamp_min(1e-30)             # (M, 1) per token
        xq = torch.round(x2 / xs)                                                   # (M, K) in [-127, 127]
        acc = xq.double() @ self.w_q.double().T                                     # exact integer sums
        y = acc.float() * xs * self.w_scale                                         # (M, N)
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


class AWQLinear(Int4Linear):
    """int4 group-wise weights of W diag(s); the input is divided by s first (AWQ folds 1/s into the
    previous op; here it is one elementwise division, kept visible)."""

    def __init__(self, w_packed, scales, group: int, smooth: torch.Tensor):
        super().__init__(w_packed, scales, group)
        self.register_buffer("smooth", smooth)      # (K,) float32

    def dequantize(self, dtype=torch.float32):
        return self.unpacked(dtype) / self.smooth.to(dtype)                         # the effective W (N, K)

    def forward(self, x):
        return super().forward(x / self.smooth)


class Sparse24Linear(nn.Module):
    """A 2:4 sparse weight (minillm.kernels.sparse24's layout): the 2 kept values of every group of 4 inputs and
    their 2-bit positions. Made by minillm.quantization.prune from a weight already pruned to 2:4 (exact: no error)."""

    def __init__(self, values: torch.Tensor, meta: torch.Tensor):
        super().__init__()
        self.register_buffer("values", values)    # (N, K/2) float32, 2 per group of 4 inputs
        self.register_buffer("meta", meta)        # (N, K/8) uint8, 4 two-bit positions per byte
        self.in_features, self.out_features = 2 * values.shape[1], values.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear):
        """-> (Sparse24Linear, max abs error): 0.0, as the weight must already be 2:4 (ValueError otherwise)."""
        values, meta = compress_24(linear.weight.detach().float().numpy())
        return cls(torch.from_numpy(values), torch.from_numpy(meta)), 0.0

    def dequantize(self, dtype=torch.float32):
        """The dense weight, (N, K), zeros where pruned."""
        return torch.from_numpy(decompress_24(self.values.numpy(), self.meta.numpy())).to(dtype)

    def forward(self, x):                                                           # (..., K) -> (..., N)
        if _one_row(x):
            y = np.empty((1, self.out_features), np.float32)                        # (1, N)
            sparse24_gemv_rows(x.detach().reshape(1, -1).contiguous().numpy(), self.values.numpy(),
                               self.meta.numpy(), y)
            return torch.from_numpy(y).view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.dequantize(x.dtype))


def _one_row(x) -> bool:
    return x.numel() == x.shape[-1] and x.dtype == torch.float32 and x.device.type == "cpu" and not x.requires_grad
