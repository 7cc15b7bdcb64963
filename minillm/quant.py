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
from .paths import SAMPLE_TEXT

SCHEMES = ("int8", "int4", "q8_0", "awq", "w8a8", "smoothquant")
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


# ----------------------------------------------------------------------------- W8A8 and SmoothQuant

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


def fake_int4(w: torch.Tensor, group: int, bound: torch.Tensor | None = None) -> torch.Tensor:
    """What quantize_int4 then dequantizing gives, in torch (for searches): each group of `group` inputs
    clipped to +-bound (default: its max |w|), scale = bound / 7, round. w (N, K), bound (N, K/G)."""
    N, K = w.shape
    wg = w.reshape(N, K // group, group)                                            # (N, K/G, G)
    bound = wg.abs().amax(-1) if bound is None else bound                           # (N, K/G)
    scale = (bound / 7.0).clamp_min(1e-12)[..., None]                               # (N, K/G, 1)
    return (torch.round(wg / scale).clamp(-7, 7) * scale).reshape(N, K)             # clipped, rounded


def awq_scales(weight: torch.Tensor, x: torch.Tensor, group: int, grid: int = 20) -> tuple:
    """AWQ (Lin et al. 2024): channels that see large activations matter most, so scale them up before
    quantizing (W diag(s)) and divide the input by s. s = mean|x_j|^a, with a searched on a grid to
    minimise the layer's output error on calibration rows x (R, K). -> (s (K,), best a, its error)."""
    w = weight.detach().float()                                                     # (N, K)
    ref = x @ w.T                                                                   # (R, N)
    act = x.abs().mean(0).clamp_min(1e-6)                                           # (K,)
    best = (float("inf"), None, None)
    for i in range(grid + 1):
        a = i / grid
        s = act.pow(a)
        s = s / (s.max() * s.min()).sqrt()                                          # centred around 1
        err = ((x @ (fake_int4(w * s, group) / s).T - ref) ** 2).mean().item()
        if err < best[0]:
            best = (err, s, a)
    return best[1], best[2], best[0]


def awq_clip(weight: torch.Tensor, x: torch.Tensor, group: int, grid: int = 20, max_shrink: float = 0.5,
             rows: int = 256) -> torch.Tensor:
    """AWQ's second step: clip each (output channel, group) to a fraction of its max |w| before
    quantizing, when the rounding saved outweighs the clipped tail. Fractions 1, 1 - 1/grid, ... down to
    1 - max_shrink are tried; per group the one with the least error in its share of the output
    (x_g @ w_g^T over calibration rows) wins. weight (N, K), x (R, K) -> clip bound (N, K/G)."""
    w = weight.detach().float()
    N, K = w.shape
    xg = x[:rows].reshape(-1, K // group, group).transpose(0, 1)                    # (K/G, R, G)
    ref = xg @ w.reshape(N, K // group, group).permute(1, 2, 0)                     # (K/G, R, N) per-group outputs
    full = w.reshape(N, K // group, group).abs().amax(-1)                           # (N, K/G)
    best_err, best = torch.full_like(full, float("inf")), full.clone()
    for i in range(int(max_shrink * grid)):
        bound = full * (1 - i / grid)                                               # (N, K/G)
        wq = fake_int4(torch.maximum(torch.minimum(w, bound.repeat_interleave(group, 1)),
                                     -bound.repeat_interleave(group, 1)), group, bound)  # (N, K)
        err = ((xg @ wq.reshape(N, K // group, group).permute(1, 2, 0) - ref) ** 2).mean(1).T  # (N, K/G)
        better = err < best_err
        best_err, best = torch.where(better, err, best_err), torch.where(better, bound, best)
    return best


def awq_quantize(weight: torch.Tensor, x: torch.Tensor, group: int):
    """AWQ = scale search (awq_scales) + clip search (awq_clip), then plain int4 of the clipped W diag(s).
    -> (AWQLinear, max abs error of the dequantized weight against W)."""
    w = weight.detach().float()
    smooth, _, _ = awq_scales(w, x, group)
    ws = w * smooth                                                                 # (N, K)
    bound = awq_clip(ws, x / smooth, group).repeat_interleave(group, dim=1)         # (N, K)
    packed, sc, _ = quantize_int4(torch.maximum(torch.minimum(ws, bound), -bound).numpy(), group)
    q = AWQLinear(torch.from_numpy(packed), torch.from_numpy(sc), group, smooth)
    return q, (q.dequantize() - w).abs().max().item()


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


def _one_row(x) -> bool:
    return x.numel() == x.shape[-1] and x.dtype == torch.float32 and x.device.type == "cpu" and not x.requires_grad


def quantize_model(model: nn.Module, scheme: str, quant_config: dict | None = None, tokenizer=None):
    """A copy of `model` with every nn.Linear (attention, MLP, classifier) replaced by its quantized
    twin; the token embedding stays float (a lookup reads one row). -> (model, report) where report
    maps each replaced module's name to its max abs weight error, plus the weight bytes before/after."""
    if scheme not in SCHEMES:
        raise ValueError(f"quantization={scheme!r} is not available in this build; built: {', '.join(SCHEMES)}")
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
        raise ValueError(f"quantization={scheme!r} quantizes float32 weights; this model is {dtype} (use dtype='float32')")
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
