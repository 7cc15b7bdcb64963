"""Checkers for notebook 09_training_and_distillation."""
from __future__ import annotations

import torch

from .common import _close, checker


@checker
def check_lr_schedule(fn):
    """fn(step, lr, min_lr, warmup_steps, max_steps) -> learning rate (linear warm-up, then cosine)"""
    from ..training.train import TrainConfig, lr_at
    for lr, lo, w, m in [(1e-3, 1e-4, 10, 100), (3e-4, 0.0, 1, 50), (2.0, 0.5, 25, 26)]:
        tc = TrainConfig(lr=lr, min_lr=lo, warmup_steps=w, max_steps=m)
        for step in sorted({0, w - 1, w, (w + m) // 2, m - 1, m, m + 5}):
            got, want = fn(step, lr, lo, w, m), lr_at(step, tc)
            assert abs(got - want) <= 1e-9 + 1e-6 * abs(want), \
                f"step {step} (lr={lr}, warmup={w}, max={m}): got {got}, expected {want}"
    return "warm-up, cosine decay and the floor after max_steps all match minillm.training.train.lr_at"


@checker
def check_kd_loss(fn):
    """fn(student_logits (B, T, V), teacher_logits (B, T, V), targets (B, T), T, lam) -> scalar loss"""
    from ..training.train import kd_loss
    g = torch.Generator().manual_seed(4)
    for shape, temp, lam in [((2, 3, 11), 2.0, 0.5), ((1, 5, 7), 1.0, 0.0), ((3, 1, 13), 4.0, 1.0)]:
        s, t = torch.randn(shape, generator=g) * 2, torch.randn(shape, generator=g) * 2
        y = torch.randint(0, shape[-1], shape[:2], generator=g)
        _close(f"shape {shape}, T={temp}, lambda={lam}", torch.as_tensor(fn(s, t, y, temp, lam)).reshape(()),
               kd_loss(s, t, y, temp, lam).reshape(()), atol=1e-5)
    return "T^2 KL(p_teacher^T || q_student^T) + lambda CE matches minillm.training.train.kd_loss"


@checker
def check_alpha(fn):
    """fn(p (N, V), q (N, V)) -> mean over rows of sum_x min(p, q)"""
    g = torch.Generator().manual_seed(5)
    for N, V in [(1, 5), (7, 30)]:
        p = torch.softmax(torch.randn(N, V, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(torch.randn(N, V, generator=g, dtype=torch.float64), -1)
        want = torch.minimum(p, q).sum(-1).mean()
        _close(f"N={N}, V={V}", torch.as_tensor(fn(p, q), dtype=torch.float64).reshape(()), want.reshape(()), atol=1e-9)
    p = torch.softmax(torch.randn(3, 9, generator=g, dtype=torch.float64), -1)
    _close("alpha(p, p)", torch.as_tensor(fn(p, p), dtype=torch.float64).reshape(()),
           torch.tensor(1.0, dtype=torch.float64), atol=1e-9)
    return "alpha = E[sum_x min(p, q)], and 1 for a draft equal to the target"
