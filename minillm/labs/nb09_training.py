"""Checkers for notebook 09_training_and_distillation."""
from __future__ import annotations

import torch
import torch.nn.functional as F

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


def _kd_mistakes(s, t, y, T, lam):
    """What the common mistakes compute instead of kd_loss, by name. s, t (B, S, V); y (B, S)."""
    B, S, V = s.shape

    def kl(p_logits, p_T, q_logits, q_T):                   # KL(softmax(p / p_T) || softmax(q / q_T)), per position
        log_p, log_q = F.log_softmax(p_logits / p_T, -1), F.log_softmax(q_logits / q_T, -1)
        return (log_p.exp() * (log_p - log_q)).sum(-1).mean()

    ce = F.cross_entropy(s.flatten(0, 1), y.flatten())
    right = kl(t, T, s, T)
    return {"no T^2 factor: the soft term is T^2 * KL (Hinton et al.), so its gradients keep the CE's scale":
                right + lam * ce,
            "T * KL instead of T^2 * KL": T * right + lam * ce,
            "KL direction swapped: KL(p_teacher || q_student) sums p_teacher * log(p_teacher / q_student)":
                T * T * kl(s, T, t, T) + lam * ce,
            "temperature applied to the student only: divide both logits by T": T * T * kl(t, 1.0, s, T) + lam * ce,
            "temperature applied to the teacher only: divide both logits by T": T * T * kl(t, T, s, 1.0) + lam * ce,
            "the hard-label term is missing: add lam * cross_entropy(student_logits, targets)": T * T * right,
            "lambda mixes the two terms ((1 - lam) T^2 KL + lam CE): the soft term is always T^2 KL; lam weights CE":
                (1 - lam) * T * T * right + lam * ce,
            "the KL is averaged over the vocabulary too (kl_div's reduction='mean'): sum over V, mean over positions":
                T * T * right / V + lam * ce,
            "the KL is summed over positions: average it over the B x T positions": T * T * right * B * S + lam * ce,
            "the KL is divided by B only (kl_div's 'batchmean' on (B, T, V)): average over all B x T positions":
                T * T * right * S + lam * ce,
            "the CE is taken on student_logits / T: the hard-label term uses the plain logits (temperature 1)":
                T * T * right + lam * F.cross_entropy(s.flatten(0, 1) / T, y.flatten())}


def _train_with(loss_fn, steps: int = 6):
    """A few AdamW steps of minillm.training.train.train distilling a tiny student (1 layer, dim 32) from a tiny
    teacher, with loss_fn as the distillation loss -> (the loss at every step, the trained weights)."""
    import os
    import tempfile

    import numpy as np

    from ..config import ModelConfig
    from ..llama.transformer import Transformer
    from ..training.train import TrainConfig, load_state, train

    def cfg():
        return ModelConfig(dim=32, hidden_dim=64, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, max_seq_len=32)
    teacher = Transformer(cfg()).init_weights(seed=11, std=0.3).eval()          # peaked, varied distributions
    tokens = np.random.default_rng(3).integers(0, 64, 4000).astype(np.uint16)
    losses = []

    def recorded(*args):
        loss = loss_fn(*args)
        losses.append(float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss))
        return loss
    progress = os.environ.get("MINILLM_PROGRESS")
    os.environ["MINILLM_PROGRESS"] = "0"                                         # no bar for a six-step run
    try:
        with tempfile.TemporaryDirectory() as out:
            tc = TrainConfig(out_dir=out, batch_size=4, seq_len=16, lr=1e-2, min_lr=1e-3, warmup_steps=1,
                             max_steps=steps, eval_every=steps, eval_windows=2, dropout=0.0, seed=2,
                             kd_temperature=2.0, kd_lambda=0.5)
            train(cfg(), tokens, tokens, tc, teacher=teacher, log=lambda *_: None, kd_loss_fn=recorded)
            weights = load_state(os.path.join(out, "state.pt"))["model"]
    finally:
        if progress is None:
            del os.environ["MINILLM_PROGRESS"]
        else:
            os.environ["MINILLM_PROGRESS"] = progress
    return losses, weights


@checker(kind="core", signature="student_logits, teacher_logits, targets, T, lam")
def check_kd_loss(fn):
    """fn(student_logits (B, T, V), teacher_logits (B, T, V), targets (B, T), T, lam) -> scalar loss with a gradient.
    Compared with minillm.training.train.kd_loss, then plugged into the real training loop (train's kd_loss_fn):
    a tiny student distilled from a tiny teacher must follow the same loss curve to the same weights."""
    from ..training.train import kd_loss
    g = torch.Generator().manual_seed(4)
    for shape, temp, lam in [((2, 3, 11), 2.0, 0.3), ((1, 5, 7), 1.0, 0.0), ((3, 2, 13), 4.0, 1.0)]:
        s, t = torch.randn(shape, generator=g) * 2, torch.randn(shape, generator=g) * 2
        y = torch.randint(0, shape[-1], shape[:2], generator=g)
        s_in = s.clone().requires_grad_(True)
        got = fn(s_in, t.clone(), y.clone(), temp, lam)
        case = f"shape {shape}, T={temp}, lambda={lam}"
        assert isinstance(got, torch.Tensor) and got.numel() == 1, \
            f"{case}: returned {type(got).__name__} {getattr(got, 'shape', '')}; expected a scalar tensor"
        assert got.requires_grad, f"{case}: the loss has no gradient: build it from torch ops on student_logits " \
                                  "(no .item(), .detach(), numpy or torch.no_grad)"
        _close(case, got.detach().reshape(()), kd_loss(s, t, y, temp, lam).reshape(()), atol=1e-5,
               mistakes={k: v.reshape(()) for k, v in _kd_mistakes(s, t, y, temp, lam).items()})

    want_losses, want_w = _train_with(kd_loss)
    try:
        got_losses, got_w = _train_with(fn)
    except RuntimeError as e:
        raise AssertionError(f"the training step's loss.backward() failed with your loss: {e}") from None
    curve = [abs(a - b) for a, b in zip(got_losses, want_losses)]
    assert curve[0] < 1e-5, f"in minillm.training.train.train, the first step's loss is {got_losses[0]:.5g}, " \
                            f"kd_loss gives {want_losses[0]:.5g}"
    drift = max((got_w[k] - want_w[k]).abs().max().item() for k in want_w)
    assert max(curve) < 1e-4 and drift < 1e-4, \
        f"in minillm.training.train.train the first loss matches kd_loss's, but the run drifts from kd_loss's " \
        f"(losses {[round(v, 3) for v in got_losses]} vs {[round(v, 3) for v in want_losses]}, weights apart by " \
        f"up to {drift:.2g} after {len(want_losses)} AdamW steps): the gradient differs; does it flow through " \
        f"every term (no .detach() on the student's side)?"
    return (f"matches kd_loss (T^2 KL(p_teacher^T || q_student^T) + lambda CE) on 3 cases; plugged into "
            f"minillm.training.train.train, {len(want_losses)} AdamW steps distilling a tiny student follow kd_loss's "
            f"loss curve ({want_losses[0]:.2f} -> {want_losses[-1]:.2f}) to the same weights")


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
