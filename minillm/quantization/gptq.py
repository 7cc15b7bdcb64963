"""GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers"):
int4 group-wise weights chosen with the layer's inputs in view, stored in the plain int4 layout (Int4Linear), so
every backend that runs int4 runs GPTQ unchanged.

Round-to-nearest rounds every weight on its own. GPTQ quantizes a layer's input columns one at a time and pushes
each column's rounding error onto the columns not yet quantized, weighted by the inverse Hessian of the layer's
output error on calibration inputs X (R, K): H = 2 X^T X / R. It minimises ||W X^T - Q X^T||^2 (the layer's
output error on those rows), not ||W - Q|| (the weight error), which is why its weight error is larger than
round-to-nearest's while its output error is smaller.

The reference implementation (github.com/IST-DASLab/gptq, gptq.py `fasterquant`), step by step:
  1. dampening: H += percdamp * mean(diag H) * I (a Hessian from few rows is near singular);
  2. Hinv = the upper Cholesky factor of H^-1: row i of it, divided by its diagonal, is how column i's error
     spreads over the columns after it (the OBS update, with the columns already done removed: eq. 3-4);
  3. column i: q = quant(w_i), err = (w_i - q) / Hinv[i, i], W[:, i:] -= err Hinv[i, i:];
  4. lazy batch updates: inside a block of 128 columns the update only touches the block; the columns after it
     get the block's accumulated errors in one matmul (the same result, far fewer memory passes);
  5. group-wise scales (group size G): a group's scale is computed when the quantizer reaches its first column,
     from the weights as updated by then (scale = max |w| / 7 over the group, as quantize_int4; q in [-8, 7]);
  6. act_order: columns in order of decreasing diag(H) (the inputs with the most energy first, while the most
     columns are left to absorb their error). Int4Linear keeps one scale per contiguous group of input
     columns, so with act_order the groups stay the original contiguous ones and their scales are fixed up
     front from the float weights (the reference's `static_groups=True`); only the order columns are rounded
     in, and where their errors go, changes.
One difference from the reference: for a group that starts inside a block, the reference reads its scale from
W as updated only up to the block's start (it misses the block's own updates so far); here it is read from the
weights as updated up to that column, so the blocked loop gives exactly the column-by-column algorithm's result.

Layers are quantized in order (the reference's llama.py with --true-sequential): each block's linears in four
stages (q/k/v, o, gate/up, down) on the inputs the already quantized layers produce, then the classifier.
"""
from __future__ import annotations

import copy
import time

import torch
import torch.nn as nn

from ..config import INT4_GROUPS
from ..llama.linears import Int4Linear
from ..threads import auto_threads
from .calibration import calibration_ids

STAGES = (("attention.wq", "attention.wk", "attention.wv"), ("attention.wo",),
          ("feed_forward.w1", "feed_forward.w3"), ("feed_forward.w2",))       # a block's linears, by input
GPTQ_OPTIONS = ("group_size", "act_order", "damp", "block_size", "calibration_tokens")


def check_gptq_options(group_size=32, act_order=False, damp=0.01, block_size=128, calibration_tokens=2048):
    """The user's quant_config for quantization="gptq", checked before any work: ValueError naming the value."""
    if group_size not in INT4_GROUPS:
        raise ValueError(f"gptq (int4) group_size must be one of {INT4_GROUPS}, got {group_size!r}")
    if not isinstance(act_order, bool):
        raise ValueError(f"gptq act_order must be True or False, got {act_order!r}")
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not 0.0 < damp < 1.0:
        raise ValueError(f"gptq damp (the fraction of mean(diag H) added to H's diagonal) must be in (0, 1), "
                         f"got {damp!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1 or block_size % group_size:
        raise ValueError(f"gptq block_size must be a positive multiple of group_size={group_size}, got {block_size!r}")
    if isinstance(calibration_tokens, bool) or not isinstance(calibration_tokens, int) or calibration_tokens < 256:
        raise ValueError(f"gptq calibration_tokens must be an int >= 256 (one window), got {calibration_tokens!r}")


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q (N, K) integers in [-8, 7] -> (N, K/2) uint8 in DESIGN.md's layout: q + 8, even k low nibble, odd k high."""
    u = (q.to(torch.int16) + 8).to(torch.uint8)                                      # (N, K) 0..15
    return (u[:, 0::2] | (u[:, 1::2] << 4)).contiguous()                             # (N, K/2)


def _scale(wt: torch.Tensor) -> torch.Tensor:
    """Symmetric absmax scale of a group's columns, as quantize_int4: wt (G, N) (W^T's rows) -> (N,) max |w| / 7,
    rounded to float32 (what Int4Linear stores), so the error fed back is the stored weight's."""
    return (wt.abs().amax(0) / 7.0).float().double()


def _round(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w (N,) to the int4 grid of scale (N,): integers in [-8, 7] (an all-zero group's scale is 0: q = 0)."""
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.clamp(torch.round(w / safe), -8, 7)


def gptq_quantize_weight(weight: torch.Tensor, H: torch.Tensor, group: int, damp: float = 0.01,
                         act_order: bool = False, block: int = 128) -> tuple:
    """GPTQ of one linear's weight (N, K) against its Hessian H (K, K) = 2 X^T X / R of calibration inputs X.
    -> (q (N, K) int8 in [-8, 7], scales (N, K/G) float32); the weight it stands for is q * its group's scale.
    Runs on one torch thread: the loop's K steps are operations on vectors of N, where a thread pool's barriers
    cost more than they save (10-20x slower with 2 threads on 2 busy cores; minillm.threads says why)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _gptq(weight, H, group, damp, act_order, block)
    finally:
        torch.set_num_threads(threads)


def _gptq(weight: torch.Tensor, H: torch.Tensor, group: int, damp: float, act_order: bool, block: int) -> tuple:
    W = weight.detach().double().clone()                                             # (N, K)
    N, K = W.shape
    H = H.double().clone()                                                           # (K, K)
    dead = torch.diag(H) == 0                                                        # inputs that were always 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    scales = torch.zeros(N, K // group, dtype=torch.float64)                          # (N, K/G)
    perm = torch.arange(K)
    if act_order:                                                                    # static groups, see above
        scales = _scale(W.view(N, K // group, group).transpose(0, 2)).T             # (N, K/G) from the float W
        perm = torch.argsort(torch.diag(H), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
    eye = torch.eye(K, dtype=torch.float64)
    H += damp * torch.diag(H).mean() * eye                                          # dampening
    Hinv = torch.linalg.cholesky(torch.cholesky_solve(eye, torch.linalg.cholesky(H)), upper=True)  # (K, K)
    # the loop works on W^T (K, N): column i of W is then row i, contiguous, and its update a rank-1 addr_
    Wt, St = W.T.contiguous(), scales.T.contiguous()                                 # (K, N), (K/G, N)
    Qt = torch.zeros_like(Wt)                                                        # (K, N) integers, permuted order
    for i1 in range(0, K, block):
        i2 = min(i1 + block, K)
        W1, Hinv1 = Wt[i1:i2].clone(), Hinv[i1:i2, i1:i2]                            # (B, N), (B, B)
        Err1 = torch.zeros_like(W1)                                                  # (B, N)
        for i in range(i2 - i1):
            col = int(perm[i1 + i])                                                  # original column index
            if not act_order and col % group == 0:                                   # a group starts here
                St[col // group] = _scale(W1[i:i + group])
            s = St[col // group]                                                     # (N,)
            w = W1[i]                                                                # (N,)
            Qt[i1 + i] = q = _round(w, s)                                            # (N,)
            Err1[i] = err = (w - q * s) / Hinv1[i, i]                                # (N,)
            W1[i:].addr_(Hinv1[i, i:], err, alpha=-1)                                # error feedback in the block
        Wt[i2:].addmm_(Hinv[i1:i2, i2:].T, Err1, alpha=-1)                          # lazy batch update
    Q = Qt.T[:, torch.argsort(perm)]                                                 # (N, K), the original order
    scales = St.T
    return Q.to(torch.int8), scales.float()


def hessian(x: torch.Tensor) -> torch.Tensor:
    """GPTQ's H (K, K) = 2 X^T X / R of calibration rows x (R, K) (what the layer-by-layer hooks accumulate), in
    float64: gptq_linear(linear, hessian(x), group) quantizes one layer on its own."""
    x = x.detach().reshape(-1, x.shape[-1]).double()                                 # (R, K)
    return 2 * x.T @ x / x.shape[0]


def output_error(delta: torch.Tensor, H: torch.Tensor) -> float:
    """Mean squared output error per calibration row of a weight error delta (N, K): ||delta x||^2 averaged over
    the rows x, = trace(delta (X^T X / R) delta^T) = trace(delta H delta^T) / 2."""
    delta = delta.double()
    return float(((delta @ H.double()) * delta).sum() / 2)


def gptq_linear(linear: nn.Module, H: torch.Tensor, group: int, damp: float = 0.01, act_order: bool = False,
                block: int = 128) -> tuple:
    """-> (Int4Linear, max abs weight error, {"gptq": output error, "rtn": round-to-nearest's output error}),
    both output errors on the calibration rows behind H (output_error)."""
    w = linear.weight.detach().float()                                               # (N, K)
    q, scales = gptq_quantize_weight(w, H, group, damp, act_order, block)
    lin = Int4Linear(pack_int4(q), scales, group)
    deq = lin.dequantize(torch.float64)                                              # (N, K)
    rtn = Int4Linear.from_linear(linear, group)[0].dequantize(torch.float64)
    return lin, (deq - w.double()).abs().max().item(), {"gptq": output_error(deq - w, H),
                                                        "rtn": output_error(rtn - w, H)}


class _Hessians:
    """Forward hooks that add 2 x x^T of every row each watched linear reads: H (K, K) = 2 X^T X / R."""

    def __init__(self, modules: dict):
        self.sums = {name: None for name in modules}
        self.rows = {name: 0 for name in modules}
        self.hooks = [m.register_forward_hook(self._hook(name)) for name, m in modules.items()]

    def _hook(self, name):
        def hook(mod, inputs, out):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()          # (R, K)
            xtx = x.T @ x                                                             # (K, K)
            self.sums[name] = xtx if self.sums[name] is None else self.sums[name] + xtx
            self.rows[name] += x.shape[0]
        return hook

    def close(self) -> dict:
        for h in self.hooks:
            h.remove()
        return {name: 2 * s / self.rows[name] for name, s in self.sums.items()}


def _submodule(root: nn.Module, path: str):
    parent, _, child = path.rpartition(".")
    return root.get_submodule(parent) if parent else root, child


@torch.no_grad()
def gptq_quantize_model(model: nn.Module, tokenizer=None, group_size: int = 32, act_order: bool = False,
                        damp: float = 0.01, block_size: int = 128, calibration_tokens: int = 2048,
                        calibration: torch.Tensor | None = None) -> tuple:
    """A copy of `model` with every nn.Linear replaced by a GPTQ Int4Linear (the token embedding stays float, as
    quantize_model does). Calibration rows: `calibration` (B, T) token ids, else the first `calibration_tokens`
    of the packaged Hamlet excerpt through `tokenizer` (calibration_ids). Layers go in order, each on the inputs
    the layers quantized before it produce. -> (model, report): quantize_model's report ("max_abs_error" per
    linear, bytes) plus "output_error" {linear: {"gptq", "rtn"}} (mean squared output error per calibration
    row, GPTQ's and round-to-nearest's, on the same rows), "seconds" and the options."""
    check_gptq_options(group_size, act_order, damp, block_size, calibration_tokens)
    auto_threads()     # unless a thread count was chosen: the cores free now (the engine's rule, minillm.threads)
    if calibration is None:
        if tokenizer is None:
            raise ValueError("quantization='gptq' needs calibration data: pass the tokenizer (the packaged Hamlet "
                             "excerpt is tokenized) or calibration= (B, T) token ids; got neither")
        calibration = calibration_ids(tokenizer, tokens=calibration_tokens)
    if calibration.ndim != 2 or calibration.numel() == 0:
        raise ValueError(f"gptq calibration must be (B, T) token ids, got shape {tuple(calibration.shape)}")
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"quantization='gptq' quantizes float32 weights; this model is {dtype} (use dtype='float32')")
    expected = {f"layers.{i}.{n}" for i in range(len(model.layers)) for stage in STAGES for n in stage} | {"output"}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name not in expected:
            raise ValueError(f"gptq quantizes the Transformer's own linears in order; {name!r} is not one of them")
        if isinstance(mod, nn.Linear) and mod.in_features % group_size:
            raise ValueError(f"{name}: in_features={mod.in_features} is not divisible by group_size={group_size}")
    t0 = time.perf_counter()
    model = copy.deepcopy(model)
    errors, outputs, before, after = {}, {}, 0, 0

    def quantize(root: nn.Module, prefix: str, names, run):
        """GPTQ of root's linears `names` on the inputs they read while run() runs."""
        nonlocal before, after
        hess = _Hessians({n: root.get_submodule(n) for n in names})
        try:
            run()
        finally:
            hs = hess.close()
        for n in names:
            parent, child = _submodule(root, n)
            lin = getattr(parent, child)
            q, errors[prefix + n], outputs[prefix + n] = gptq_linear(lin, hs[n], group_size, damp, act_order,
                                                                     min(block_size, lin.in_features))
            setattr(parent, child, q)
            before += lin.weight.numel() * 4
            after += sum(b.numel() * b.element_size() for b in q.buffers())

    B, T = calibration.shape
    model.ensure_rope(T)
    x = model.tok_embeddings(calibration)                                            # (B, T, C)
    cos = model.rope_cos[:T].expand(B, T, -1).to(x.dtype)                            # (B, T, D/2)
    sin = model.rope_sin[:T].expand(B, T, -1).to(x.dtype)
    for i, block in enumerate(model.layers):
        for stage in STAGES:
            quantize(block, f"layers.{i}.", stage, lambda: block(x, cos, sin, None, None))
        x = block(x, cos, sin, None, None)                                           # through the quantized block
    h = model.norm(x)                                                                # (B, T, C)
    quantize(model, "", ("output",), lambda: model.output(h))
    return model, {"scheme": "gptq", "group_size": group_size, "alpha": None, "act_order": act_order, "damp": damp,
                   "calibration_tokens": calibration.numel(), "max_abs_error": errors, "output_error": outputs,
                   "seconds": time.perf_counter() - t0, "linear_bytes_fp32": before, "linear_bytes": after}


def gptq_from_config(model: nn.Module, quant_config: dict | None, tokenizer=None) -> tuple:
    """quantize_model's entry for quantization="gptq": quant_config's keys are GPTQ_OPTIONS (group_size, act_order,
    damp, block_size, calibration_tokens); an unknown key is a ValueError naming it."""
    cfg = dict(quant_config or {})
    unknown = sorted(set(cfg) - set(GPTQ_OPTIONS))
    if unknown:
        raise ValueError(f"unknown quant_config keys {unknown} for gptq; known: {', '.join(GPTQ_OPTIONS)}")
    return gptq_quantize_model(model, tokenizer, **cfg)
