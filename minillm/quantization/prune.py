"""prune_model: a copy of a model with the weights of its transformer linears pruned, for EngineConfig.sparsity.

Two scores say which weights matter (the lowest-scoring ones are set to zero):
    magnitude   |W_ij|                                    (Han et al. 2015)
    wanda       |W_ij| * ||X_j||_2 over calibration rows  (Sun et al. 2024, "A Simple and Effective Pruning
                Approach for Large Language Models"): a small weight on an input channel that carries large
                activations still moves the output, so the weight alone undersells it.
Two patterns say how many go and where:
    0.5         unstructured: that fraction of every output row (Wanda compares within each output row; the
                magnitude baseline here does the same, so the two differ by their score only)
    "2:4"       semi-structured N:M: keep the N best of every M consecutive inputs of a row. 2:4 is stored
                compressed (minillm.llama.linears.Sparse24Linear: values + 2-bit indices, a numba GEMV);
                other N:M patterns and unstructured stay dense nn.Linear weights with zeros.
As in Wanda and SparseGPT, the token embedding and the classifier are left dense; the activation norms come from
one pass of the dense model over the calibration text, all of it (Wanda prunes layer by layer on the pruned model's
activations; on 8 layers that was no better here, +7.7% against +7.0% at 50%, and one pass keeps this readable).
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ..config import check_sparsity, sparsity_pattern
from ..llama.linears import Sparse24Linear
from .calibration import calibration_ids

# Wanda's calibration: every token of the packaged excerpt (about 13,500). With 2,048 the norms are noisy enough
# that Wanda lost to magnitude at 50% on the held-out windows (+7.58% vs +7.20%); with all of them it wins (bench
# sparsity). The paper uses 128 x 2048 tokens of C4.
CALIBRATION_TOKENS = 1 << 20


def scores(weight: torch.Tensor, method: str, x_norm: torch.Tensor | None = None) -> torch.Tensor:
    """How much each weight matters: |W| (magnitude) or |W| * ||X_j|| (wanda). weight (N, K), x_norm (K,) -> (N, K)."""
    if method == "magnitude":
        return weight.detach().abs()
    if x_norm is None:
        raise ValueError("wanda scores |W| * ||X||: it needs the input norms (calibration rows), got x_norm=None")
    return weight.detach().abs() * x_norm[None, :]                                  # (N, K)


def prune_mask(score: torch.Tensor, pattern) -> torch.Tensor:
    """The weights kept, (N, K) bool: per output row the lowest fraction of scores dropped (pattern a float), or
    the N highest of every M consecutive inputs kept (pattern "N:M"). Ties go to the lower input index."""
    n_keep, m = sparsity_pattern(pattern)
    N, K = score.shape
    if m is None:                                                                   # unstructured, per row
        drop = int(K * n_keep)                                                      # n_keep is the fraction here
        order = torch.sort(score, dim=1, stable=True).indices                       # (N, K) ascending
        mask = torch.ones(N, K, dtype=torch.bool)
        mask.scatter_(1, order[:, :drop], False)
        return mask
    if K % m:
        raise ValueError(f"pattern {pattern!r}: in_features={K} is not divisible by M={m}")
    g = score.reshape(N, K // m, m)                                                 # (N, K/M, M)
    keep = torch.sort(g, dim=-1, descending=True, stable=True).indices[..., :n_keep]  # (N, K/M, N_keep)
    mask = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, keep, True)
    return mask.reshape(N, K)


def input_norms(model: nn.Module, tokenizer, tokens: int = CALIBRATION_TOKENS, batch: int = 8) -> dict:
    """||X_j||_2 per input channel of every nn.Linear over `tokens` calibration tokens (the whole packaged excerpt
    by default, 53 windows of 256): {name: (K,)}. Squares are summed window batch by window batch, so memory stays
    one batch of activations whatever the calibration size."""
    ids = calibration_ids(tokenizer, tokens=tokens)                                 # (B, T) training text
    sq, hooks = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            def hook(m, inputs, out, name=name):
                x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()   # (rows, K)
                sq[name] = sq.get(name, 0.0) + (x * x).sum(0)                       # (K,)
            hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for i in range(0, ids.shape[0], batch):
                model(ids[i:i + batch])
    finally:
        for h in hooks:
            h.remove()
    return {k: v.sqrt().float() for k, v in sq.items()}


def prunable(model: nn.Module):
    """(parent module, attribute, full name, nn.Linear) for every linear inside the transformer blocks."""
    for name, module in model.named_modules():
        if not name.startswith("layers."):
            continue
        for child_name, child in module.named_children():
            if type(child) is nn.Linear:
                yield module, child_name, f"{name}.{child_name}", child


def prune_model(model: nn.Module, sparsity: dict, tokenizer=None, norms: dict | None = None):
    """A copy of `model` with every transformer linear pruned as `sparsity` says ({"method", "pattern"}); the
    caller's model is left as it was. norms: input_norms() already computed (a sweep reuses them).
    -> (model, report): the fraction of zeros per layer and overall, and the linear bytes before and after."""
    sparsity = check_sparsity(sparsity)
    method, pattern = sparsity["method"], sparsity["pattern"]
    dtype = next(model.parameters()).dtype
    compressed = pattern == "2:4" or sparsity_pattern(pattern) == (2, 4)
    if compressed and dtype != torch.float32:
        raise ValueError(f"sparsity pattern '2:4' is stored as float32 values (Sparse24Linear); this model is "
                         f"{dtype} (use dtype='float32')")
    if method == "wanda" and norms is None:
        if tokenizer is None:
            raise ValueError("sparsity method 'wanda' calibrates on text: pass the tokenizer")
        norms = input_norms(model, tokenizer)
    model = copy.deepcopy(model)
    zeros, total, layers, before, after = 0, 0, {}, 0, 0
    for parent, attr, full, lin in list(prunable(model)):
        mask = prune_mask(scores(lin.weight, method, norms.get(full) if norms else None), pattern)   # (N, K)
        with torch.no_grad():
            lin.weight.mul_(mask)
        layers[full] = 1.0 - mask.float().mean().item()
        zeros += int((~mask).sum())
        total += mask.numel()
        before += lin.weight.numel() * lin.weight.element_size()
        if compressed:
            lin, _ = Sparse24Linear.from_linear(lin)
            setattr(parent, attr, lin)
        after += sum(t.numel() * t.element_size() for t in list(lin.parameters()) + list(lin.buffers()))
    return model, {"method": method, "pattern": pattern, "sparsity": zeros / max(total, 1), "per_layer": layers,
                   "linear_bytes_dense": before, "linear_bytes": after, "compressed": compressed}
