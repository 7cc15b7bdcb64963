"""Naive against flash attention, timed on a GPU (notebook 04 with `GPU = True`), beside the roofline's bound.

naive: torch on the device, the textbook way: the (H, T, T) scores written to device memory, the causal mask,
    softmax, then P @ V (the three kernels attention_traffic counts for naive);
flash: minillm.kernels' flash_attention_cuda on the same tensors (16 x 16 tiles, fp32, scores on chip).
Both take torch tensors on the device and return one there: nothing crosses to the host inside a timing. In
numba's CUDA simulator (tests) the tensors stay on the CPU and the numbers are the simulator's, only a check
that the function runs and agrees.
"""
from __future__ import annotations

import math

import torch

from ..kernels.flash_attention import flash_attention_cuda
from .attention_traffic import attention_bytes_moved, attention_flops
from .roofline import _median_seconds, _sync


def naive_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q, k, v (T, H, D), same H (no GQA here) -> (T, H, D); the (H, T, T) matrix materialised."""
    T, _, D = q.shape
    s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)                      # (H, T, T)
    s.masked_fill_(torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), 1), float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(s, dim=-1), v).contiguous()


def time_attention(lengths, H: int = 4, D: int = 64, repeats: int = 5, device: str | None = None,
                   seed: int = 0) -> dict:
    """For each T: median seconds of naive (torch) and flash (the CUDA kernel) on `device` (default: "cuda" when
    torch sees a GPU), their largest difference, and the roofline's fp32 bound for both on the published GPU.
    -> {"device", "lengths", "naive": [s], "flash": [s], "max_error": [..], "flops": {"naive", "flash"}, "bytes":
    {"naive", "flash"}} (bytes and flops in float32, 16-row query tiles, as the kernel runs)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(seed)
    out = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else device, "lengths": list(lengths),
           "naive": [], "flash": [], "max_error": [], "flops": {"naive": [], "flash": []},
           "bytes": {"naive": [], "flash": []}}
    sync = _sync(device)
    for T in lengths:
        q, k, v = (torch.randn(T, H, D, generator=gen).to(device) for _ in range(3))
        err = (flash_attention_cuda(q, k, v) - naive_attention_torch(q, k, v)).abs().max().item()
        out["max_error"].append(err)
        out["naive"].append(_median_seconds(lambda: naive_attention_torch(q, k, v), repeats, sync))
        out["flash"].append(_median_seconds(lambda: flash_attention_cuda(q, k, v), repeats, sync))
        for m in ("naive", "flash"):
            out["flops"][m].append(attention_flops(T, H, D, m, q_tile=16))
            out["bytes"][m].append(attention_bytes_moved(T, H, D, m, q_tile=16, itemsize=4)["total"])
    return out
