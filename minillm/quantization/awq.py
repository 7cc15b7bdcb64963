"""AWQ (Lin et al. 2024, activation-aware weight quantization): per-channel scales searched on calibration
inputs, then a per-(output channel, group) clipping search, then int4 group-wise. The searches run as torch
fake-quant (fake_int4), exactly what quantize_int4 then dequantizing gives."""
from __future__ import annotations

import torch

from ..kernels.quant_gemv import quantize_int4
from ..llama.linears import AWQLinear


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
