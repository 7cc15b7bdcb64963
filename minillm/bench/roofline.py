"""The roofline of this machine for a model's matmuls (Williams, Waterman & Patterson, CACM 2009).

A kernel doing F flops while moving B bytes (arithmetic intensity I = F/B) runs at most at
min(peak FLOP/s, bandwidth * I). A linear layer on M rows of (N, K) weights does 2MNK flops and must
move at least x, W and y: 4(MK + NK + MN) bytes in float32. Decode (M = batch, small) re-reads all of
W for a few rows: I ~ M/2, memory-bound. Prefill (M = prompt tokens) reuses each weight M times:
compute-bound. Batching is how decode climbs the roof. Measured here with torch's matmul; viz draws it.
"""
from __future__ import annotations

import statistics
import time
from typing import Optional

import torch

from ..config import ModelConfig
from .profiling import torch_threads


def _median_seconds(fn, repeats: int, sync) -> float:
    """Median seconds of one fn() call: a warm-up call, then `repeats` samples, each looping fn often
    enough to last about a millisecond (a 10-microsecond matmul is below perf_counter's noise)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    fn(), sync()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        if time.perf_counter() - t0 >= 1e-3 or n >= 4096:
            break
        n *= 4
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def _sync(device: str):
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


@torch.inference_mode()
def memory_bandwidth(nbytes: int = 64 * 2**20, repeats: int = 5, device: str = "cpu",
                     threads: Optional[int] = 1) -> float:
    """Bytes per second of a large copy (dst.copy_(src)): it reads nbytes and writes nbytes, so it
    moves 2 * nbytes. 64 MiB is far larger than any CPU cache, so this is DRAM's rate (the STREAM copy)."""
    if nbytes < 4:
        raise ValueError(f"nbytes must be >= 4, got {nbytes}")
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)       # (nbytes/4,)
    dst = torch.empty_like(src)
    with torch_threads(threads):
        seconds = _median_seconds(lambda: dst.copy_(src), repeats, _sync(device))
    return 2 * src.numel() * 4 / seconds


def matmul_cost(M: int, K: int, N: int, bytes_per_elem: int = 4) -> dict:
    """What y (M, N) = x (M, K) @ W (N, K)^T must do at least: 2MNK flops (a multiply and an add per
    weight per row), moving x, W and y once each."""
    flops = 2 * M * N * K
    nbytes = bytes_per_elem * (M * K + N * K + M * N)
    return {"M": M, "K": K, "N": N, "flops": flops, "bytes": nbytes, "intensity": flops / nbytes}


@torch.inference_mode()
def matmul_point(M: int, K: int, N: int, repeats: int = 5, device: str = "cpu",
                 threads: Optional[int] = 1, seed: int = 0) -> dict:
    """One point on the roofline: torch's x @ W^T in float32, timed (median), with its flops, bytes,
    arithmetic intensity and achieved FLOP/s."""
    if min(M, K, N) < 1:
        raise ValueError(f"M, K, N must be >= 1, got {(M, K, N)}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(device)                             # (M, K)
    w = torch.randn(N, K, generator=g).to(device)                             # (N, K) as nn.Linear stores it
    y = torch.empty(M, N, device=device)                                      # (M, N)
    with torch_threads(threads):
        seconds = _median_seconds(lambda: torch.matmul(x, w.T, out=y), repeats, _sync(device))
    point = matmul_cost(M, K, N)
    return {**point, "seconds": seconds, "flop_s": point["flops"] / seconds}


def layer_matmuls(cfg: ModelConfig) -> list:
    """(name, N, K) of one transformer layer's linear layers: q, k, v, o projections and SwiGLU's three."""
    C, Hd, kv = cfg.dim, cfg.hidden_dim, cfg.kv_dim
    return [("wq", C, C), ("wk", kv, C), ("wv", kv, C), ("wo", C, C), ("w1", Hd, C), ("w3", Hd, C), ("w2", C, Hd)]


def roofline(model_config: ModelConfig, batch_sizes=(1, 8, 32, 256), prefill_tokens=(512, 2048),
             peak_size: int = 1024, repeats: int = 5, device: str = "cpu", threads: Optional[int] = 1) -> dict:
    """The machine's roofs and where one layer's matmuls land under them: a "decode" point per batch
    size (M = sequences, one token each) and a "prefill" point per prompt length (M = tokens), each
    summing the layer's seven matmuls (flops, bytes, seconds). The compute roof is the best FLOP/s
    measured (a peak_size cube, or any point that beat it); the slope is the large-copy bandwidth.
    Small weights can sit in the CPU's cache, so a decode point may land above the DRAM slope."""
    points = []
    for kind, sizes in (("decode", batch_sizes), ("prefill", prefill_tokens)):
        for M in sizes:
            parts = [matmul_point(M, K, N, repeats, device, threads) for _, N, K in layer_matmuls(model_config)]
            total = {k: sum(p[k] for p in parts) for k in ("flops", "bytes", "seconds")}
            points.append({"kind": kind, "M": M, **total, "intensity": total["flops"] / total["bytes"],
                           "flop_s": total["flops"] / total["seconds"]})
    square = matmul_point(peak_size, peak_size, peak_size, repeats, device, threads)
    peak = max([square["flop_s"]] + [p["flop_s"] for p in points])
    bandwidth = memory_bandwidth(repeats=repeats, device=device, threads=threads)
    return {"device": device, "threads": threads, "peak_flop_s": peak, "bandwidth": bandwidth,
            "ridge_intensity": peak / bandwidth, "points": points, "square": square,
            "model": {"dim": model_config.dim, "hidden_dim": model_config.hidden_dim, "kv_dim": model_config.kv_dim}}
