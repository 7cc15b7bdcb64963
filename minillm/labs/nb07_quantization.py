"""Checkers for notebook 07_quantization."""
from __future__ import annotations

import numpy as np
import torch

from .common import _close, checker


class _DivisionByZero(torch.overrides.TorchFunctionMode):
    """Notes whether any torch division inside it divides by zero (the reader's code, while it runs)."""
    DIVIDES = {torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.__truediv__, torch.Tensor.__itruediv__}
    seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.DIVIDES and len(args) > 1 and bool((torch.as_tensor(args[1]) == 0).any()):
            self.seen = True
        return func(*args, **(kwargs or {}))


@checker
def check_quantize_int8_row(fn):
    """fn(w (K,) float32 tensor) -> (q (K,) integers in [-127, 127], scale float): symmetric absmax, w ~ scale * q"""
    from ..kernels.quant_gemv import quantize_int8
    g = torch.Generator().manual_seed(7)
    rows = [torch.randn(64, generator=g), torch.randn(7, generator=g) * 1e-3, torch.zeros(5),
            torch.tensor([0.5, -2.0, 1.0, 0.25]), torch.randn(33, generator=g) * 40]
    for w in rows:
        want_q, want_s, _ = quantize_int8(w.numpy()[None])
        with _DivisionByZero() as div0:
            q, s = fn(w.clone())
        assert not div0.seen, (f"K={w.numel()}, an all-zero row: its scale is 0 and w / 0 is nan, whose cast to int8 "
                               "is undefined (0 on some machines, -128 on others): give such a row q = 0 without "
                               "dividing by its scale")
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


# ----------------------------------------------------------------------------- core: int4 group-wise, packed

def _int4_weight(N, K, G, seed):
    """(N, K) float32 weights whose groups differ in size by up to 100x (so one scale per row is visibly wrong),
    with an all-zero group and an all-zero row."""
    g = np.random.default_rng(seed)
    w = g.standard_normal((N, K)) * np.exp(g.uniform(-2.3, 2.3, (N, K // G))).repeat(G, axis=1)
    w[1, :G] = 0.0                                                    # an all-zero group
    w[-1] = 0.0                                                       # an all-zero row
    return w.astype(np.float32)


def _student_int4(fn, w, G, case):
    """fn's (packed, scales) for w (N, K), checked for DESIGN.md's layout: packed (N, K/2) uint8, scales (N, K/G)."""
    import warnings
    N, K = w.shape
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(w.copy(), G)
    assert not any("invalid value encountered in cast" in str(c.message) for c in caught), \
        f"{case}: an all-zero group has scale 0, and w / 0 is nan; numpy warned that it cast nan to an integer, " \
        "which is undefined: give such a group q = 0 without dividing by its scale"
    assert isinstance(out, tuple) and len(out) == 2, f"{case}: return (packed, scales), got {type(out).__name__}"
    packed, scales = (np.asarray(a.numpy() if isinstance(a, torch.Tensor) else a) for a in out)
    assert packed.shape == (N, K // 2), \
        f"{case}: packed has shape {packed.shape}, expected (N, K/2) = {(N, K // 2)}: two 4-bit values per byte"
    assert packed.dtype == np.uint8, f"{case}: packed is {packed.dtype}, expected uint8 (nibbles stored as q + 8)"
    assert scales.shape == (N, K // G), f"{case}: scales have shape {scales.shape}, expected (N, K/G) = " \
        f"{(N, K // G)}: one scale per group of G = {G} inputs" + \
        (" (one per row is int8's layout)" if scales.size == N else "")
    return packed, scales.astype(np.float32)


def _nibbles(packed):
    """The engine's reading of a packed (N, K/2) array: (N, K) stored nibbles 0..15, even k from the low nibble."""
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1).astype(np.int16)


@checker(kind="core", signature="w, group")
def check_quantize_int4(fn):
    """fn(w (N, K) float32 numpy, group G) -> (packed (N, K/2) uint8, scales (N, K/G) float32): DESIGN.md's int4
    layout (scale = max|w| / 7 per group, q = round(w / scale) in [-7, 7], byte j = (q[2j] + 8) | (q[2j+1] + 8) << 4).
    The result is loaded into the engine's Int4Linear (the weight type the linear op dispatches on) and compared
    with the engine's own quantizer, layer by layer and in a tiny model generating through LLM."""
    from ..kernels.quant_gemv import quantize_int4
    from ..llama.linears import Int4Linear
    for N, K, G in [(6, 64, 32), (5, 48, 16), (3, 128, 128)]:
        case = f"W {N} x {K}, G = {G}"
        w = _int4_weight(N, K, G, seed=K + G)
        packed, scales = _student_int4(fn, w, G, case)
        want_packed, want_scales, _ = quantize_int4(w, G)
        q_want = _nibbles(want_packed) - 8                             # (N, K) the engine's q in [-7, 7]
        stored = _nibbles(packed)
        group_max = np.abs(w).reshape(N, K // G, G).max(-1)            # (N, K/G)
        live = group_max > 0
        swapped = np.stack([packed >> 4, packed & 15], axis=-1).reshape(N, K).astype(np.int16)
        assert (stored - 8 == q_want).all() or not (swapped - 8 == q_want).all(), \
            f"{case}: nibble order swapped: even k goes in the LOW nibble (byte & 15), odd k in the high one"
        signed = np.where(stored >= 8, stored - 16, stored)             # two's complement nibbles, no offset
        assert (stored - 8 == q_want).all() or not (signed == q_want).all(), \
            f"{case}: no +8 offset: nibbles are stored as q + 8 (0..15), not as q's two's complement"
        assert np.isfinite(scales).all() and (stored[~live.repeat(G, axis=1)] == 8).all(), \
            f"{case}: an all-zero group must give q = 0 (stored as 8) and a finite scale: don't divide by its scale 0"
        for ratio, name in [(8, "max|w| / 8"), (15, "max|w| / 15"), (16, "max|w| / 16")]:
            assert not np.allclose(scales[live], group_max[live] / ratio, rtol=1e-5), \
                f"{case}: scale = {name}; the engine uses max|w| / 7 (symmetric: q in [-7, 7], -8 unused)"
        row_scale = np.abs(w).max(1, keepdims=True) / 7                # (N, 1)
        assert K == G or not np.allclose(scales[live], np.broadcast_to(row_scale, scales.shape)[live], rtol=1e-5), \
            f"{case}: one scale per row (max over all K inputs): the scale is per group of G = {G} inputs"
        assert np.allclose(scales[live], want_scales[live], rtol=1e-6), \
            f"{case}: scales differ from max|w| / 7 per group by up to " \
            f"{np.abs(scales[live] / want_scales[live] - 1).max():.2g} (relative)"
        ratio = np.divide(w, np.repeat(want_scales, G, axis=1), out=np.zeros_like(w), where=live.repeat(G, axis=1))
        tie = np.abs(np.abs(ratio - np.trunc(ratio)) - 0.5) < 1e-5     # w / scale within 1e-5 of a half step
        off = (stored - 8 != q_want) & ~tie                            # a tie may round either way
        if off.any():
            trunc = (stored - 8 == np.trunc(ratio)).all()
            raise AssertionError(f"{case}: q differs from round(w / scale) at {off.sum()} of {w.size} weights" +
                                 ("; it is truncated (astype(int) rounds toward 0): use round" if trunc else ""))
        mine = Int4Linear(torch.from_numpy(packed.copy()), torch.from_numpy(scales.copy()), G)
        ref = Int4Linear(torch.from_numpy(want_packed), torch.from_numpy(want_scales), G)
        x = torch.from_numpy(np.random.default_rng(N).standard_normal((3, K)).astype(np.float32))
        step = torch.from_numpy(np.repeat(want_scales, G, axis=1)).double()   # (N, K) each weight's step
        bound = x.abs().double() @ step.T / 2                                  # (3, N) half a step per weight
        ties = x.abs().double() @ (step * torch.from_numpy(stored - 8 != q_want)).T  # (3, N) ties rounded otherwise
        with torch.no_grad():
            for rows, how in [(x[:1], "one row: the int4 GEMV kernel"), (x, "3 rows: dequantize + matmul")]:
                got = mine(rows)
                _close(f"{case}, Int4Linear on {how}", got, ref(rows), atol=1e-4 + ties.max().item())
                err = (got.double() - rows.double() @ torch.from_numpy(w).double().T).abs()
                assert (err <= bound[:len(rows)] * (1 + 1e-4) + 1e-5).all(), \
                    f"{case}, {how}: error against float32 beyond sum_k |x_k| scale_k / 2"
    _generate_with_int4(fn)
    return ("DESIGN.md's int4 layout (scale max|w|/7 per group, even k low, q + 8), equal to quantize_int4; "
            "through Int4Linear's GEMV and matmul paths within half a step per weight of float32, and a tiny "
            "model quantized with it generates the engine's int4 tokens (LLM, quantization='int4')")


def _generate_with_int4(fn, G: int = 32):
    """Every nn.Linear of a tiny random model replaced by an Int4Linear holding fn's (packed, scales): greedy tokens
    through LLM must equal LLM(model, quantization='int4') with the engine's quantizer."""
    import copy

    import torch.nn as nn

    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    from ..formats.loader import random_model
    from ..llama.linears import Int4Linear
    model, tok = random_model("tiny", seed=0)
    model.init_weights(seed=5, std=0.15)
    plugged = copy.deepcopy(model)
    for module in list(plugged.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                packed, scales = _student_int4(fn, child.weight.detach().numpy(), G, f"the tiny model's {name}")
                setattr(module, name, Int4Linear(torch.from_numpy(packed.copy()), torch.from_numpy(scales.copy()), G))
    prompts = ["To be, or not to be"]        # one sequence: the prompt takes the matmul path, each decode step the GEMV
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = [o.token_ids for o in LLM(model, tokenizer=tok, backend="torch", quantization="int4",
                                     quant_config={"group_size": G}).generate(prompts, params)]
    got = [o.token_ids for o in LLM(plugged, tokenizer=tok, backend="torch").generate(prompts, params)]
    assert got == want, f"a tiny model quantized with your function generates {got}, the engine's int4 {want}"
