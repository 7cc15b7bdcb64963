"""`python -m minillm bench sparsity`: pruning's cost in perplexity, and what 2:4 buys in speed at batch 1.

Perplexity: the shipped model pruned by magnitude and by Wanda (minillm.quantization.prune) at unstructured
sparsities 10-70% and at 2:4, each scored on the held-out windows bench quant uses (every window prefilled through
the engine's KV pool), as a change against the dense model. Wanda's activation norms are computed once and shared.

Speed: batch-1 GEMV over layers whose dense weights exceed the last-level cache (so every pass reads them from
memory, as decode does), the 2:4 layout (minillm.kernels.sparse24) beside a dense numba GEMV with the same loop
order and beside torch's F.linear; medians of interleaved repeats, in one process.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from ..formats.loader import load
from ..kernels.sparse24 import compress_24, dense_gemv_rows, sparse24_gemv_rows
from ..quantization.calibration import with_outlier_channels
from ..quantization.prune import input_norms, prune_mask, prune_model, scores
from ..threads import auto_threads
from .quant import held_out_windows, last_level_cache_bytes, pool_loss
from .timing import interleaved

SPARSITIES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
METHODS = ("magnitude", "wanda")


def perplexity_sweep(model: str = "shakespeare", tokenizer=None, windows: int = 25, sparsities=SPARSITIES,
                     patterns=("2:4",), outliers=(0.5, "2:4")) -> dict:
    """Delta perplexity of every (method, pattern) against the dense model on `windows` held-out windows of 256;
    `outliers`: the same patterns on with_outlier_channels' twin (the same function with LLM-style outlier input
    channels, bench quant's SmoothQuant case), where a weight's size no longer says what it contributes."""
    net, tok = load(model, tokenizer)
    x, y = held_out_windows(tok, max_windows=windows)
    dense = math.exp(pool_loss(net, x, y))
    rows = []
    runs = [(p, net, "") for p in list(sparsities) + list(patterns)]
    twin = with_outlier_channels(net) if outliers else None
    runs += [(p, twin, "outliers") for p in outliers]
    norms = {"": input_norms(net, tok), "outliers": input_norms(twin, tok) if twin is not None else None}
    for pattern, src, variant in runs:
        for method in METHODS:
            pruned, rep = prune_model(src, {"method": method, "pattern": pattern}, tok, norms=norms[variant])
            ppl = math.exp(pool_loss(pruned, x, y))
            rows.append({"method": method, "pattern": pattern, "model": variant or "shipped",
                         "sparsity": rep["sparsity"], "perplexity": ppl, "delta_ppl": ppl / dense - 1,
                         "weight_ratio": rep["linear_bytes"] / rep["linear_bytes_dense"]})
    return {"model": str(model), "windows": int(x.shape[0]), "dense_perplexity": dense, "rows": rows}


def gemv_speed(N: int = 2048, K: int = 2048, repeats: int = 7, layers: int | None = None, seed: int = 0) -> dict:
    """Batch-1 GEMV through `layers` (N, K) layers: 2:4 compressed vs dense (same numba loop) vs torch F.linear.
    -> seconds per layer (median over repeats) and the ratios. Enough layers that the dense weights are 4x the LLC."""
    threads = auto_threads()       # the free cores: a pool spin-waiting on a busy core is 10-100x slower at these sizes
    llc = last_level_cache_bytes() or (32 << 20)
    layers = layers or max(2, math.ceil(4 * llc / (4 * N * K)))
    rng = np.random.default_rng(seed)
    dense, sparse = [], []
    for _ in range(layers):
        w = torch.from_numpy(rng.standard_normal((N, K), dtype=np.float32))
        w = w * prune_mask(scores(w, "magnitude"), "2:4")                            # (N, K) 2:4
        dense.append(np.ascontiguousarray(w.numpy()))
        sparse.append(compress_24(dense[-1]))
    x = rng.standard_normal((1, K), dtype=np.float32)
    y = np.empty((1, N), np.float32)
    xt = torch.from_numpy(x)
    runs = {"2:4 numba": lambda i: sparse24_gemv_rows(x, *sparse[i], y),
            "dense numba": lambda i: dense_gemv_rows(x, dense[i], y),
            "dense torch": lambda i: F.linear(xt, torch.from_numpy(dense[i]))}
    y24 = None
    for label, fn in runs.items():                                                   # warm-up (compiles), and check
        fn(0)
        if label == "2:4 numba":
            y24 = y.copy()
    want = x.astype(np.float64) @ dense[0].T.astype(np.float64)
    err = float(np.abs(y24 - want).max())
    def per_layer(fn):
        def run():
            t = time.perf_counter()
            for i in range(layers):
                fn(i)
            return (time.perf_counter() - t) / layers
        return run
    timing = interleaved({label: per_layer(fn) for label, fn in runs.items()}, repeats=repeats, warmup=0)  # warmed
    med = {label: timing.median(label) for label in runs}
    v, m = sparse[0]
    return {"N": N, "K": K, "layers": layers, "repeats": repeats, "llc_bytes": llc, "threads": threads,
            "bytes_dense": 4 * N * K, "bytes_24": v.nbytes + m.nbytes, "seconds": med,
            "spread": {label: timing.spread(label) for label in runs}, "max_abs_error": err,
            "speedup_vs_dense_numba": timing.speedup("2:4 numba", "dense numba")[0],
            "speedup_vs_dense_numba_range": timing.speedup("2:4 numba", "dense numba")[1:],
            "speedup_vs_torch": timing.speedup("2:4 numba", "dense torch")[0]}


def bench_sparsity(model: str = "shakespeare", tokenizer=None, quick: bool = False, windows: int = 25) -> dict:
    if quick:
        ppl = perplexity_sweep(model, tokenizer, windows=1, sparsities=(0.5,), outliers=())   # a smoke test
        speed = gemv_speed(1024, 1024, repeats=3, layers=4)
    else:
        ppl, speed = perplexity_sweep(model, tokenizer, windows=windows), gemv_speed()
    return {"bench": "sparsity", "perplexity": ppl, "gemv": speed}


def print_report(res: dict):
    p, g = res["perplexity"], res["gemv"]
    print(f"{p['model']}: dense perplexity {p['dense_perplexity']:.3f} on {p['windows']} held-out windows of 256")
    print(f"{'pattern':>14}" + "".join(f"{m + ' d ppl':>18}" for m in METHODS) + f"{'bytes':>8}")
    by = {}
    for r in p["rows"]:
        label = f"{r['pattern']:.0%}" if not isinstance(r["pattern"], str) else r["pattern"]
        by.setdefault(label + (", outliers" if r["model"] == "outliers" else ""), {})[r["method"]] = r
    for label, rs in by.items():
        print(f"{label:>14}" + "".join(f"{rs[m]['delta_ppl']:>+18.2%}" for m in METHODS) +
              f"{rs[METHODS[0]]['weight_ratio']:>8.2f}")
    s = g["seconds"]
    print(f"batch-1 GEMV, {g['layers']} layers of ({g['N']}, {g['K']}) (dense {g['bytes_dense'] / 2**20:.0f} MiB each, "
          f"2:4 {g['bytes_24'] / 2**20:.1f} MiB; LLC {g['llc_bytes'] / 2**20:.0f} MiB), median of {g['repeats']}, "
          f"{g['threads']} threads:")
    for label, sec in s.items():
        print(f"  {label:<12} {sec * 1e6:9.0f} us/layer")
    print(f"  2:4 vs dense numba: {g['speedup_vs_dense_numba']:.2f}x, vs torch F.linear: {g['speedup_vs_torch']:.2f}x "
          f"(max abs error {g['max_abs_error']:.1e})")


# ---------------------------------------------------------------------------- python -m minillm bench sparsity
def add_parser(sub):
    """`bench sparsity`: its options, and run_cli to run it."""
    p = sub.add_parser("sparsity", help="magnitude and Wanda pruning: delta perplexity vs sparsity 10-70%% and 2:4; "
                                        "the 2:4 GEMV against dense at batch 1")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--windows", type=int, default=25, help="held-out windows of 256 tokens (25: all of them)")
    p.add_argument("--quick", action="store_true", help="2 windows, 50%% and 2:4 only, small GEMV: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    res = bench_sparsity(a.model, a.tokenizer, a.quick, a.windows)
    print_report(res)
    return res
