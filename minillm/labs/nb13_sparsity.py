"""Checkers for notebook 13_sparsity_and_gptq."""
from __future__ import annotations

import copy
import math

import torch

from .common import checker

_SHIPPED = {}          # the shipped model, its held-out window and calibration rows: loaded once per process


def _shipped():
    """(model, tokenizer, calibration rows {linear name: (R, K)}, one held-out window (x, y)), cached."""
    if not _SHIPPED:
        from ..bench.quant import held_out_windows
        from ..formats.loader import load
        from ..quantization.calibration import calibration_ids, linear_inputs
        model, tok = load("shakespeare")
        rows = linear_inputs(model, calibration_ids(tok, tokens=512), rows=512)       # {name: (512, K)}
        _SHIPPED.update(model=model, tok=tok, rows=rows, window=held_out_windows(tok, max_windows=1))
    return _SHIPPED["model"], _SHIPPED["tok"], _SHIPPED["rows"], _SHIPPED["window"]


def _mask(fn, w, x, sparsity, case):
    """The student's mask for weight w (N, K) and rows x (R, K), checked for shape and dtype."""
    out = fn(w.clone(), x.clone(), sparsity)
    assert isinstance(out, torch.Tensor), f"{case}: return a torch tensor (the mask), got {type(out).__name__}"
    assert out.shape == w.shape, \
        f"{case}: the mask has shape {tuple(out.shape)}, expected the weight's {tuple(w.shape)}"
    assert out.dtype == torch.bool, f"{case}: the mask is {out.dtype}, expected torch.bool (True = weight kept)"
    return out


def _diagnose(got, w, x, sparsity, case):
    """Why a mask differs from Wanda's: the common mistakes, recognised by redoing them."""
    from ..quantization.prune import prune_mask, scores
    N, K = w.shape
    drop = int(K * sparsity)
    if (~got).sum().item() != N * drop:
        if (~got).sum().item() == N * (K - drop):
            return f"{case}: {K - drop} of {K} weights per row dropped: the mask is True for the weights KEPT"
        return f"{case}: {(~got).sum().item()} weights dropped, expected {drop} per output row x {N} rows"
    if torch.equal(got, prune_mask(scores(w, "magnitude"), sparsity)):
        return f"{case}: the mask is magnitude pruning's: Wanda's score is |W_ij| * ||X_j||, the input norm included"
    if torch.equal(got, prune_mask(scores(w, "wanda", x.norm(dim=0) ** 2), sparsity)):
        return f"{case}: scored with ||X_j||^2: Wanda multiplies |W_ij| by the L2 norm ||X_j||, not its square"
    if torch.equal(got, prune_mask(scores(w, "wanda", x.abs().mean(0)), sparsity)):
        return f"{case}: scored with mean |X_j|: Wanda uses the L2 norm over the calibration rows, ||X_j||_2"
    if torch.equal(got, prune_mask(-scores(w, "wanda", x.norm(dim=0)), sparsity)):
        return f"{case}: the HIGHEST scores were dropped: prune the lowest |W| * ||X|| of each row"
    per_layer = torch.ones(N * K, dtype=torch.bool)
    per_layer[torch.sort(scores(w, "wanda", x.norm(dim=0)).flatten(), stable=True).indices[:N * drop]] = False
    if torch.equal(got, per_layer.view(N, K)) or (got.sum(1) != K - drop).any():
        return f"{case}: rows keep different numbers of weights: Wanda compares scores within each output row " \
               f"(dim 1 of W (N, K)), dropping {drop} of each row's {K}, not across the whole layer"
    return f"{case}: the mask differs from Wanda's (|W| * ||X||, lowest {sparsity:.0%} of each row dropped)"


@checker(kind="core", signature="weight, x, sparsity")
def check_wanda_mask(fn):
    """fn(weight (N, K), x (R, K) calibration rows, sparsity float) -> mask (N, K) bool, True = kept: Wanda (Sun et
    al. 2024), score |W_ij| * ||X_j||_2, the lowest `sparsity` fraction of each output row dropped. Checked on small
    cases, then plugged into the shipped model: every transformer linear pruned to 50% by the reader's masks, the
    masks compared with the engine's (minillm.quantization.prune), and the pruned model's held-out perplexity shown."""
    from ..bench.quant import pool_loss
    from ..quantization.prune import prunable, prune_mask, scores
    g = torch.Generator().manual_seed(13)
    for N, K, R, s in [(6, 24, 10, 0.25), (4, 16, 32, 0.5), (3, 40, 64, 0.7)]:
        w, x = torch.randn(N, K, generator=g), torch.randn(R, K, generator=g)
        x[:, 1] *= 30                                                   # an outlier channel: Wanda keeps its weights
        w[:, 1] /= 10
        case = f"W {N} x {K}, {R} rows, sparsity {s}"
        got = _mask(fn, w, x, s, case)
        want = prune_mask(scores(w, "wanda", x.norm(dim=0)), s)
        assert torch.equal(got, want), _diagnose(got, w, x, s, case)
    from ..threads import fair_threads
    torch.set_num_threads(fair_threads())          # the free cores (the checker restores the count afterwards)
    model, tok, rows, (x, y) = _shipped()
    pruned, layers = copy.deepcopy(model), 0
    with torch.no_grad():
        for _, _, name, lin in prunable(pruned):
            layers += 1
            w = lin.weight.detach().clone()
            got = _mask(fn, w, rows[name], 0.5, name)
            want = prune_mask(scores(w, "wanda", rows[name].norm(dim=0)), 0.5)
            assert torch.equal(got, want), _diagnose(got, w, rows[name], 0.5, f"the shipped model's {name}")
            lin.weight.mul_(got)
    if "dense" not in _SHIPPED:
        _SHIPPED["dense"] = math.exp(pool_loss(model, x, y))
    dense, mine = _SHIPPED["dense"], math.exp(pool_loss(pruned, x, y))
    assert mine < 2 * dense, f"perplexity {dense:.2f} dense -> {mine:.2f} with your masks at 50%"
    return (f"your masks are the engine's (minillm.quantization.prune) on all {layers} transformer linears of "
            f"the shipped model: held-out perplexity {dense:.2f} dense -> {mine:.2f} at 50% (one window of 256)")


@checker(signature="score, n, m")
def check_nm_mask(fn):
    """Warm-up: the N:M mask, (N, K) bool, keeping the n highest scores of every m consecutive inputs of a row
    (ties to the lower input index, as minillm.quantization.prune.prune_mask)."""
    from ..quantization.prune import prune_mask
    g = torch.Generator().manual_seed(13)
    for N, K, n, m in [(4, 8, 2, 4), (5, 16, 2, 4), (3, 12, 1, 3), (2, 16, 4, 8)]:
        score = torch.randn(N, K, generator=g)                                      # (N, K)
        case = f"{n}:{m} on a ({N}, {K}) score"
        out = fn(score.clone(), n, m)
        assert isinstance(out, torch.Tensor) and out.shape == (N, K), \
            f"{case}: return a (N, K) = ({N}, {K}) tensor, got {type(out).__name__} {tuple(getattr(out, 'shape', ()))}"
        assert out.dtype == torch.bool, f"{case}: the mask is {out.dtype}, expected torch.bool (True = kept)"
        want = prune_mask(score, f"{n}:{m}")
        if torch.equal(out, want):
            continue
        groups = out.reshape(N, K // m, m).sum(-1)                                  # (N, K/M) kept per group
        low = prune_mask(-score, f"{n}:{m}")
        assert not (torch.equal(out, ~want) or torch.equal(out, low)), \
            f"{case}: the LOWEST scores of each group were kept (or the mask is inverted): keep the n highest, " \
            "True marking a weight kept"
        assert not (groups == m - n).all() or n == m - n, \
            f"{case}: each group keeps {m - n}, not {n}: keep the n HIGHEST, drop the other m - n"
        columns = prune_mask(score.t().contiguous(), f"{n}:{m}").t() if N % m == 0 else None
        assert columns is None or not torch.equal(out, columns), \
            f"{case}: groups were taken down a column: N:M groups are m consecutive INPUTS of one row (dim 1)"
        assert (groups == n).all(), f"{case}: a group keeps {groups.flatten().tolist()[:6]}... weights, not {n} each"
        assert False, f"{case}: the right count per group, but not the n highest scores of each m consecutive inputs"
    return "the n highest of every m consecutive inputs, per row, on 2:4, 1:3 and 4:8"
