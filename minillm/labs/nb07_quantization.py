"""Checkers for notebook 07_quantization."""
from __future__ import annotations

import numpy as np
import torch

from .common import _close, checker


@checker
def check_quantize_int8_row(fn):
    """fn(w (K,) float32 tensor) -> (q (K,) integers in [-127, 127], scale float): symmetric absmax, w ~ scale * q"""
    from ..kernels.quant_gemv import quantize_int8
    g = torch.Generator().manual_seed(7)
    rows = [torch.randn(64, generator=g), torch.randn(7, generator=g) * 1e-3, torch.zeros(5),
            torch.tensor([0.5, -2.0, 1.0, 0.25]), torch.randn(33, generator=g) * 40]
    for w in rows:
        want_q, want_s, _ = quantize_int8(w.numpy()[None])
        q, s = fn(w.clone())
        q = torch.as_tensor(np.asarray(q)).reshape(-1).double()
        s = float(s)
        assert q.shape == (w.numel(),), f"K={w.numel()}: q has shape {tuple(q.shape)}, expected ({w.numel()},)"
        assert abs(s - float(want_s[0])) <= 1e-6 * float(want_s[0]) + 1e-12, \
            f"K={w.numel()}, max |w|={w.abs().max().item():.3g}: scale {s:.6g}, " \
            f"expected max|w|/127 = {float(want_s[0]):.6g}"
        assert (q == q.round()).all() and q.abs().max() <= 127, f"K={w.numel()}: q must be integers in [-127, 127]"
        off = (q - torch.from_numpy(want_q[0]).double()).abs()
        assert off.max() <= 1 and (off > 0).sum() <= 1, \
            f"K={w.numel()}: q differs from round(w / scale) in {(off > 0).sum()} places"
        err = (q * s - w.double()).abs().max().item()
        assert err <= s / 2 * (1 + 1e-4) + 1e-12, \
            f"K={w.numel()}: max error {err:.3g} is more than half a step ({s / 2:.3g})"
    return "scale = max|w| / 127, q = round(w / scale), error within half a step; an all-zero row stays zero"


@checker
def check_smooth_factor(fn):
    """fn(act_max (K,), w_max (K,), alpha) -> s (K,): SmoothQuant's s_j = act_max_j^alpha / w_max_j^(1 - alpha)"""
    from ..quantization.calibration import smoothing_factors
    g = torch.Generator().manual_seed(8)
    for K, alpha in [(16, 0.5), (7, 0.0), (9, 1.0), (32, 0.8)]:
        act = torch.rand(K, generator=g) * 3 + 0.05
        act[0] *= 60                                            # an outlier channel
        w = torch.randn(5, K, generator=g) * 0.1
        want = smoothing_factors(act, w, alpha)
        got = torch.as_tensor(fn(act.clone(), w.abs().amax(0), alpha))
        _close(f"K={K}, alpha={alpha}", got, want, atol=1e-6, rtol=1e-5)
    return ("matches minillm.quantization.calibration.smoothing_factors: alpha = 0 puts all the range on the "
            "weights, 1 on the activations")
