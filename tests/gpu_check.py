"""`make gpu-check`: everything this project can only check on a CUDA GPU, in one run of under 8 minutes,
written to one report (markdown with the raw results as a JSON block at its end).

    python tests/gpu_check.py [--out F] [--quick] [--sections env,tests,...] [--budget S] [--dry-run]

Sections, in order (each its own subprocess with a timeout, so a crash, a hang or a poisoned CUDA context in
one is recorded and the next still runs; the report is rewritten after every section):
    env        the machine: GPU, driver, CUDA, torch / numba / numba-cuda versions, torch's copy bandwidth
    tests      `pytest -m gpu` on the gpu-marked test files: pass/fail counts and each failure
    kernels    every *_cuda launcher in kernels/ on stories110M-sized shapes: checked against torch, then
               timed beside torch on the same tensors (bytes moved, GB/s, speed ratio)
    decode     `python -m minillm bench decode --model shakespeare --backend cuda --quick`
    racecheck  compute-sanitizer's racecheck on each shared-memory kernel at small shapes (skipped, with the
               reason, where compute-sanitizer is not installed)

Why a script, not pytest: a GPU is lent to this project now and then, for minutes, on a machine with no network
where nothing may be installed. It runs with the Python found there and the source tree as it is: the project
is not installed there, so `minillm.kernels` (which pyproject.toml maps to kernels/) is mapped here too
(use_source_tree), in this process and in every child. Nothing here needs a GPU to be imported or tested:
tests/test_gpu_check.py runs the logic on CPU, and one kernel section in numba's CUDA simulator.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.abc
import importlib.util
import json
import os
import platform
import re
import runpy
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
PACKAGE_DIRS = {"minillm.kernels": "kernels", "minillm.viz": "viz"}   # pyproject's [tool.setuptools.package-dir]

BUDGET_S = 450          # the whole run: under the 8 minutes issue 16 allows, with room for the report
MIN_SECTION_S = 10      # a section with less time left than this is skipped, not started
CASE_IDLE_S = 90        # a kernel case that reports nothing for this long is taken as hung
RACECHECK_CASE_S = 60   # one kernel under compute-sanitizer
FLUSH_BYTES = 256 << 20  # zeroed before each timed run: more than the H100/H200's 50-60 MB L2, so no run
                         # reads its inputs from the previous run's cache
# Normwise: max |kernel - torch| / max |torch|. float32 with torch's own summation order differs by about
# sqrt(K) * 6e-8 of the row's scale (< 1e-5 for K <= 2048); an indexing or synchronisation bug is O(1).
TOL = 1e-4


# ----------------------------------------------------------------------------- the source tree, uninstalled

class SourceTree(importlib.abc.MetaPathFinder):
    """pyproject.toml's package-dir mapping (minillm.kernels -> kernels/) without an install, as pip's
    editable install does it: only the mapped names are found here; everything else as usual."""

    def find_spec(self, name, path=None, target=None):
        folder = PACKAGE_DIRS.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(name, ROOT / folder / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / folder)])


def use_source_tree():
    """Import minillm from this checkout (PYTHONPATH=. alone does not map minillm.kernels)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if not any(isinstance(f, SourceTree) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceTree())


def kernel_module(name: str):
    use_source_tree()
    return importlib.import_module(f"minillm.kernels.{name}")


# ----------------------------------------------------------------------------- arithmetic

def gb_per_s(nbytes: float, seconds: float) -> float:
    """Achieved bandwidth, 1e9 bytes per second (what GPU data sheets quote)."""
    return nbytes / seconds / 1e9


def max_rel_err(got, want) -> float:
    """max |got - want| / max |want| over the whole output (nan if either has a nan or inf)."""
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    if tuple(got.shape) != tuple(want.shape):
        raise ValueError(f"kernel output has shape {tuple(got.shape)}, torch's {tuple(want.shape)}")
    scale = want.abs().max().item() or 1.0
    return (got - want).abs().max().item() / scale


def time_calls(fn, sync, repeats: int, warmup: int, before=None, clock=time.perf_counter) -> list[float]:
    """Seconds per call of fn, `repeats` times after `warmup` untimed calls. sync() waits for the device
    (torch.cuda.synchronize) before and after each timed call; before() (an L2 flush) runs outside the timing."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        sync()
        t = clock()
        fn()
        sync()
        times.append(clock() - t)
    return times


# ----------------------------------------------------------------------------- kernel cases

# stories110M (dim 768, hidden 2048, 12 heads of 64, vocab 32000, context 1024): rows = a prefill chunk of
# 2048 tokens, seqs = a decode batch of 32 over a paged pool. tiny: the simulator's and racecheck's shapes
# (a few tiles or blocks per dimension, hidden 40, vocab 300 and the contexts not whole tiles: edges exercised).
SHAPES = {
    "full": dict(dim=768, hidden=2048, vocab=32000, heads=12, kv_heads=12, head_dim=64, rows=2048, seq=1024,
                 logit_rows=64, seqs=32, block=16, splits=8, group=32),
    "tiny": dict(dim=48, hidden=40, vocab=300, heads=2, kv_heads=1, head_dim=16, rows=5, seq=80,
                 logit_rows=3, seqs=3, block=4, splits=2, group=8),
}


def _randn(rng, *shape, scale=1.0):
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)


@dataclass(frozen=True)
class Case:
    """One CUDA launcher, its inputs, and the torch code that computes the same thing. inputs(shape, rng)
    -> the launcher's keyword arguments as numpy arrays (and ints); the torch reference takes the same
    keywords as tensors; nbytes(inputs) counts compulsory global-memory traffic: each array read or written
    once (what a kernel cannot avoid moving)."""
    name: str
    module: str                      # minillm.kernels.<module>
    launcher: str                    # the *_cuda function timed
    inputs: Callable
    torch_ref: Callable
    torch_desc: str                  # what torch runs, for the report
    nbytes: Callable
    flops: Callable | None = None
    mutates: tuple = ()              # arguments the launcher writes in place (fresh copies for the check)
    racecheck: bool = False          # has shared memory: run under racecheck


def _f32(*arrays) -> int:
    return 4 * sum(int(np.prod(a.shape)) for a in arrays)


def _matmul_inputs(s, rng):
    return dict(x=_randn(rng, s["rows"], s["dim"]), w=_randn(rng, s["hidden"], s["dim"]))


def _matmul_bytes(a):
    M, N = a["x"].shape[0], a["w"].shape[0]
    return _f32(a["x"], a["w"]) + 4 * M * N


def _matmul_flops(a):
    return 2 * a["x"].shape[0] * a["w"].shape[0] * a["x"].shape[1]


def _gemv_inputs(s, rng):
    return dict(w=_randn(rng, s["vocab"], s["dim"]), x=_randn(rng, s["dim"]))


def _norm_inputs(s, rng, residual=False):
    a = dict(x=_randn(rng, s["rows"], s["dim"]), weight=_randn(rng, s["dim"]))
    if residual:
        a["residual"] = _randn(rng, s["rows"], s["dim"])
    return a


def _rmsnorm_bytes(a):
    """Reads x and weight, writes out: 2MC + C floats (the unfused pair's count, less its add's 3MC)."""
    M, C = a["x"].shape
    return 4 * (2 * M * C + C)


def _add_rmsnorm_torch(x, residual, weight):
    residual.add_(x)
    return F.rms_norm(residual, (x.shape[1],), weight, 1e-5)


def _rope_inputs(s, rng):
    D, S = s["head_dim"], s["seq"]
    ang = np.outer(np.arange(S), 10000.0 ** (-np.arange(0, D, 2) / D))                      # (S, D/2)
    return dict(x=_randn(rng, s["rows"], s["heads"], D), positions=np.arange(s["rows"], dtype=np.int64) % S,
                cos=np.cos(ang).astype(np.float32), sin=np.sin(ang).astype(np.float32))


def _rope_torch(x, positions, cos, sin):
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]                          # (M, 1, D/2)
    x0, x1 = x[..., 0::2], x[..., 1::2]                                                    # (M, H, D/2) each
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).flatten(-2)                 # (M, H, D)


def _rope_bytes(a):
    """Reads x, writes out, reads each row's position and its cos and sin rows (D/2 floats each)."""
    M, H, D = a["x"].shape
    return 4 * (2 * M * H * D + M * D) + 8 * M


def _swiglu_inputs(s, rng):
    return dict(gate=_randn(rng, s["rows"], s["hidden"]), up=_randn(rng, s["rows"], s["hidden"]))


def _softmax_inputs(s, rng):
    return dict(x=_randn(rng, s["logit_rows"], s["vocab"], scale=3.0))


def _flash_inputs(s, rng):
    T, D = s["seq"], s["head_dim"]
    return dict(q=_randn(rng, T, s["heads"], D), k=_randn(rng, T, s["kv_heads"], D), v=_randn(rng, T, s["kv_heads"], D))


def _flash_torch(q, k, v):
    y = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=True, enable_gqa=True)                    # (1, H, T, D)
    return y[0].transpose(0, 1)                                                            # (T, H, D)


def _flash_flops(a):
    T, H, D = a["q"].shape
    return 4 * H * D * T * (T + 1) // 2               # q k^T and p v, over the causal half


def _paged_inputs(s, rng, splits=False):
    """A decode batch: `seqs` rows with contexts between a quarter and all of `seq`, their blocks scattered
    through a pool (a permutation), as the block manager leaves them after some serving."""
    R, BS, Hkv, D = s["seqs"], s["block"], s["kv_heads"], s["head_dim"]
    ctx = rng.integers(s["seq"] // 4, s["seq"] + 1, R).astype(np.int64)                     # (R,)
    need = -(-ctx // BS)                                                                   # (R,) blocks per row
    M, NB = int(need.max()), int(need.sum()) + 8
    ids = rng.permutation(NB)
    tables = np.zeros((R, M), np.int64)                                                    # (R, M) unused: block 0
    start = 0
    for r in range(R):
        tables[r, :need[r]] = ids[start:start + need[r]]
        start += need[r]
    a = dict(q=_randn(rng, R, s["heads"], D), k_pool=_randn(rng, NB, BS, Hkv, D), v_pool=_randn(rng, NB, BS, Hkv, D),
             block_tables=tables, context_lens=ctx)
    if splits:
        a["num_splits"] = s["splits"]
    return a


def _paged_torch(q, k_pool, v_pool, block_tables, context_lens, num_splits=1):
    """The torch backend's way (minillm.llama.attention.paged_attention): gather each row's context through
    its block table, then scaled_dot_product_attention with a length mask."""
    R, H, D = q.shape
    L = int(context_lens.max())
    M = -(-L // k_pool.shape[1])
    k = k_pool[block_tables[:, :M]].flatten(1, 2)[:, :L]                                   # (R, L, Hkv, D)
    v = v_pool[block_tables[:, :M]].flatten(1, 2)[:, :L]
    mask = torch.arange(L, device=q.device)[None, :] < context_lens[:, None]               # (R, L)
    y = F.scaled_dot_product_attention(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask[:, None, None], enable_gqa=True)     # (R, H, 1, D)
    return y[:, :, 0]


def _paged_bytes(a):
    """q read and out written, each row's K and V positions read once, its context length and table entries."""
    R, H, D = a["q"].shape
    Hkv, BS = a["k_pool"].shape[2], a["k_pool"].shape[1]
    ctx = a["context_lens"]
    return 4 * (2 * R * H * D + 2 * int(ctx.sum()) * Hkv * D) + 8 * (R + int((-(-ctx // BS)).sum()))


def _int8_inputs(s, rng):
    q, scales, _ = kernel_module("quant_gemv").quantize_int8(_randn(rng, s["vocab"], s["dim"]))
    return dict(x=_randn(rng, s["dim"]), w_q=q, scales=scales)


def _int4_inputs(s, rng):
    p, scales, _ = kernel_module("quant_gemv").quantize_int4(_randn(rng, s["vocab"], s["dim"]), s["group"])
    return dict(x=_randn(rng, s["dim"]), w_packed=p, scales=scales, group=s["group"])


def _int4_torch(x, w_packed, scales, group):
    """Int4Linear's torch path: unpack the nibbles to float, apply each group's scale, then a matmul."""
    N = w_packed.shape[0]
    q = torch.stack([(w_packed & 15).to(torch.int16) - 8, (w_packed >> 4).to(torch.int16) - 8], -1)  # (N, K/2, 2)
    w = q.reshape(N, -1).to(torch.float32) * scales.repeat_interleave(group, 1)            # (N, K)
    return w @ x


def _quant_bytes(a):
    """The packed weights once, their scales, x in and y out."""
    w = a["w_q"] if "w_q" in a else a["w_packed"]
    return w.nbytes + a["scales"].nbytes + 4 * (a["x"].shape[0] + w.shape[0])


def _gemv_bytes(a):
    return _f32(a["w"], a["x"]) + 4 * a["w"].shape[0]


def _gemv_flops(a):
    w = next(a[k] for k in ("w", "w_q", "w_packed") if k in a)                            # (N, K) or (N, K/2)
    return 2 * a["x"].shape[-1] * w.shape[0]


def _rms_bytes_moved(fused):
    return lambda a: kernel_module("rmsnorm").bytes_moved(*a["x"].shape, fused=fused)


def _swiglu_bytes_moved(fused):
    return lambda a: kernel_module("swiglu").bytes_moved(*a["gate"].shape, fused=fused)


CASES = {c.name: c for c in [
    Case("matmul_tiled", "matmul", "matmul_cuda", _matmul_inputs, lambda x, w: x @ w.T, "x @ w.T (fp32, no TF32)",
         _matmul_bytes, _matmul_flops, racecheck=True),
    Case("matmul_naive", "matmul_naive", "matmul_naive_cuda", _matmul_inputs, lambda x, w: x @ w.T,
         "x @ w.T (fp32, no TF32)", _matmul_bytes, _matmul_flops),
    Case("gemv", "matmul", "gemv_cuda", _gemv_inputs, lambda w, x: w @ x, "w @ x", _gemv_bytes, _gemv_flops,
         racecheck=True),
    Case("rmsnorm", "rmsnorm", "rmsnorm_cuda", _norm_inputs,
         lambda x, weight: F.rms_norm(x, (x.shape[1],), weight, 1e-5), "F.rms_norm", _rmsnorm_bytes, racecheck=True),
    Case("add_rmsnorm", "rmsnorm", "add_rmsnorm_cuda", lambda s, rng: _norm_inputs(s, rng, True), _add_rmsnorm_torch,
         "residual.add_(x); F.rms_norm", _rms_bytes_moved(True), mutates=("residual",), racecheck=True),
    Case("add_then_rmsnorm", "rmsnorm", "add_then_rmsnorm_cuda", lambda s, rng: _norm_inputs(s, rng, True),
         _add_rmsnorm_torch, "residual.add_(x); F.rms_norm", _rms_bytes_moved(False), mutates=("residual",)),
    Case("rope", "rope", "rope_cuda", _rope_inputs, _rope_torch, "gathered cos/sin, pairwise rotation",
         _rope_bytes),
    Case("swiglu", "swiglu", "swiglu_cuda", _swiglu_inputs, lambda gate, up: F.silu(gate) * up, "F.silu(gate) * up",
         _swiglu_bytes_moved(True)),
    Case("swiglu_unfused", "swiglu", "swiglu_unfused_cuda", _swiglu_inputs, lambda gate, up: F.silu(gate) * up,
         "F.silu(gate) * up", _swiglu_bytes_moved(False)),
    Case("softmax", "softmax", "softmax_cuda", _softmax_inputs, lambda x: x.softmax(-1), "x.softmax(-1)",
         lambda a: 2 * _f32(a["x"]), racecheck=True),
    Case("online_softmax", "softmax", "online_softmax_cuda", _softmax_inputs, lambda x: x.softmax(-1),
         "x.softmax(-1)", lambda a: 2 * _f32(a["x"]), racecheck=True),
    Case("flash_attention", "flash_attention", "flash_attention_cuda", _flash_inputs, _flash_torch,
         "F.scaled_dot_product_attention(is_causal=True)", lambda a: 2 * _f32(a["q"]) + _f32(a["k"], a["v"]),
         _flash_flops, racecheck=True),
    Case("paged_attention", "paged_attention", "paged_attention_cuda", _paged_inputs, _paged_torch,
         "gather through block tables + F.scaled_dot_product_attention", _paged_bytes, racecheck=True),
    Case("flash_decoding", "paged_attention", "flash_decoding_cuda", lambda s, rng: _paged_inputs(s, rng, True),
         _paged_torch, "gather through block tables + F.scaled_dot_product_attention", _paged_bytes, racecheck=True),
    Case("int8_gemv", "quant_gemv", "int8_gemv_cuda", _int8_inputs,
         lambda x, w_q, scales: (w_q.to(torch.float32) @ x) * scales, "(w_q.float() @ x) * scales (Int8Linear)",
         _quant_bytes, _gemv_flops, racecheck=True),
    Case("int4_gemv", "quant_gemv", "int4_gemv_cuda", _int4_inputs, _int4_torch,
         "unpack nibbles, scale groups, matmul (Int4Linear)", _quant_bytes, _gemv_flops, racecheck=True),
]}
QUICK_RACECHECK = ["matmul_tiled", "rmsnorm", "online_softmax", "flash_attention", "flash_decoding", "int4_gemv"]


def run_case(case: Case, shape: dict, device: str, sync, repeats: int, warmup: int, before=None,
             launch=None) -> dict:
    """Check one launcher against torch on the same tensors (fresh copies of what it writes in place), then
    time both: medians of `repeats` calls, each with the launcher's Python checks and conversions included,
    as the engine pays them. launch: what to time in place of the case's launcher (tests)."""
    arrays = case.inputs(shape, np.random.default_rng(0))
    t = {k: torch.from_numpy(v).to(device) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
    launch = launch or getattr(kernel_module(case.module), case.launcher)

    def fresh():
        return {k: v.clone() if k in case.mutates else v for k, v in t.items()}
    got, want = launch(**fresh()), case.torch_ref(**fresh())                  # the first launch compiles
    sync()
    err = max_rel_err(got, want)
    k_times = time_calls(lambda: launch(**t), sync, repeats, warmup, before)
    t_times = time_calls(lambda: case.torch_ref(**t), sync, repeats, warmup, before)
    k_s, t_s = statistics.median(k_times), statistics.median(t_times)
    nbytes, flops = case.nbytes(arrays), case.flops(arrays) if case.flops else None
    return {"name": case.name, "launcher": f"minillm.kernels.{case.module}.{case.launcher}", "torch": case.torch_desc,
            "shapes": {k: list(v.shape) for k, v in arrays.items() if isinstance(v, np.ndarray)},
            "bytes": nbytes, "flops": flops, "kernel_s": k_s, "torch_s": t_s,
            "kernel_gb_s": gb_per_s(nbytes, k_s), "torch_gb_s": gb_per_s(nbytes, t_s), "speed_vs_torch": t_s / k_s,
            "kernel_tflop_s": flops / k_s / 1e12 if flops else None,
            "torch_tflop_s": flops / t_s / 1e12 if flops else None,
            "max_rel_err": err, "tol": TOL, "correct": err <= TOL, "status": "ok" if err <= TOL else "wrong",
            "kernel_s_all": k_times, "torch_s_all": t_times}


# ----------------------------------------------------------------------------- children (what runs on the GPU)

def child_env(result: Path):
    """The machine, each part on its own so one failing query loses only itself."""
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda}

    def part(name, fn):
        try:
            info.update(fn())
        except Exception as e:  # recorded in the report
            info[f"{name}_error"] = f"{type(e).__name__}: {e}"

    def torch_gpu():
        return {"torch_sees_gpu": torch.cuda.is_available()}

    def device():
        p = torch.cuda.get_device_properties(0)
        return dict(gpu_name=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1))

    def copy_bandwidth():
        """torch's device-to-device copy of 1 GiB: the bandwidth the kernels' GB/s are compared with."""
        x = torch.empty(1 << 28, device="cuda")                                  # 1 GiB of float32
        y = torch.empty_like(x)
        s = time_calls(lambda: y.copy_(x), torch.cuda.synchronize, 5, 2)
        return {"copy_gb_s": gb_per_s(2 * x.nbytes, statistics.median(s))}     # read + write

    def numba_versions():
        import importlib.metadata as md

        import numba
        return {"numba": numba.__version__, "numba_cuda": md.version("numba-cuda")}

    def numba_gpu():
        import contextlib
        import io

        from numba import cuda
        info["numba_sees_gpu"] = bool(cuda.is_available())
        if info["numba_sees_gpu"]:
            return {}
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            cuda.detect()                                   # prints why numba finds no usable device
        return {"numba_detect": said.getvalue().strip()[-1000:]}

    def cuda_versions():
        from numba import cuda
        return {"cuda_driver_api": ".".join(map(str, cuda.cudadrv.driver.driver.get_version())),
                "cuda_runtime": ".".join(map(str, cuda.runtime.get_version()))}

    def smi():
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip().splitlines()
        return {"nvidia_smi": out, "driver": out[0].split(",")[1].strip() if out else None}
    for name, fn in [("torch", torch_gpu), ("numba", numba_versions), ("numba_gpu", numba_gpu), ("nvidia_smi", smi)]:
        part(name, fn)
    if info.get("torch_sees_gpu"):
        for name, fn in [("device", device), ("copy", copy_bandwidth), ("cuda_versions", cuda_versions)]:
            part(name, fn)
    info["gpu"] = bool(info.get("torch_sees_gpu") and info.get("numba_sees_gpu"))
    result.write_text(json.dumps(info))


def child_kernels(names: list[str], scale: str, device: str, repeats: int, warmup: int, result: Path) -> int:
    """Each case's result as one JSON line, appended as soon as it is known. On the GPU the first error ends
    the process (a CUDA error poisons the context): the parent goes on with the rest in a fresh one."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    on_gpu = device == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    before = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device).zero_ if on_gpu else None
    for name in names:
        try:
            res = run_case(CASES[name], SHAPES[scale], device, sync, repeats, warmup, before)
        except Exception as e:  # recorded in the report
            res = {"name": name, "status": "error", "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-1500:]}
        with open(result, "a") as f:
            f.write(json.dumps(res) + "\n")
        if res["status"] == "error" and on_gpu:
            return 1
    return 0


def child_racecheck(names: list[str]):
    """Launch each kernel once at the tiny shapes, on numpy arrays (numba copies them to the GPU and back),
    for compute-sanitizer to watch."""
    for name in names:
        case = CASES[name]
        getattr(kernel_module(case.module), case.launcher)(**case.inputs(SHAPES["tiny"], np.random.default_rng(0)))
    from numba import cuda
    cuda.synchronize()


# ----------------------------------------------------------------------------- running children

@dataclass
class Ran:
    rc: int | None
    seconds: float
    timed_out: bool
    tail: str


def child_environ(extra: dict | None = None) -> dict:
    env = dict(os.environ, MINILLM_PROGRESS="0", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra or {})
    return env


def run_child(cmd: list, timeout: float, log: Path, env: dict | None = None, idle_timeout: float | None = None,
              progress: Path | None = None) -> Ran:
    """Run cmd in its own process group, output to `log`. Killed (the whole group: compute-sanitizer's
    target, pytest's workers) after `timeout` seconds, or after `idle_timeout` seconds in which the file
    `progress` did not grow."""
    t0 = last = time.monotonic()
    seen, timed_out = -1, False
    with open(log, "wb") as f:
        p = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             cwd=ROOT, env=child_environ(env), start_new_session=True)
        try:
            while p.poll() is None:
                now = time.monotonic()
                size = progress.stat().st_size if progress is not None and progress.exists() else 0
                if size != seen:
                    seen, last = size, now
                if now - t0 > timeout or (idle_timeout is not None and now - last > idle_timeout):
                    timed_out = True
                    break
                time.sleep(0.05)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return Ran(None if timed_out else p.returncode, time.monotonic() - t0, timed_out, tail(log))


def tail(path: Path, n: int = 3000) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-n:].decode("utf-8", "replace")


def child_cmd(*args) -> list:
    return [sys.executable, SCRIPT, "--child", *args]


def module_cmd(module: str, *args) -> list:
    """`python -m module args` with this checkout importable as installed (see use_source_tree)."""
    return [sys.executable, SCRIPT, "--module", module, *args]


def failed(ran: Ran, what: str, when: str = "") -> dict:
    if ran.timed_out:
        return {"status": "timeout", "error": f"{what} timed out after {ran.seconds:.0f} s{when}", "tail": ran.tail}
    return {"status": "error", "error": f"{what} exited with {ran.rc}{when}", "tail": ran.tail}


# ----------------------------------------------------------------------------- sections

@dataclass
class Ctx:
    tmp: Path
    quick: bool = False
    sanitizer: str | None = None


def section_env(ctx: Ctx, timeout: float) -> dict:
    res = ctx.tmp / "env.json"
    ran = run_child(child_cmd("env", "--result", res), timeout, ctx.tmp / "env.log", {"NUMBA_ENABLE_CUDASIM": "0"})
    if not res.exists():
        return failed(ran, "the environment probe")
    return {"status": "ok", **json.loads(res.read_text())}


def marks_gpu(source: str) -> bool:
    """Whether code (not a string in it) says `pytest.mark.gpu`."""
    return any(isinstance(n, ast.Attribute) and n.attr == "gpu" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(ast.parse(source)))


def gpu_test_files(tests: Path = ROOT / "tests") -> list[str]:
    """The test files with gpu-marked tests (named, so a collection error elsewhere cannot stop them)."""
    return [str(p.relative_to(ROOT)) for p in sorted(tests.glob("test_*.py")) if marks_gpu(p.read_text())]


def parse_junit(path: Path) -> dict:
    """pytest's --junitxml: counts, each failure or error with its message, each skip reason."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures, skips = [], []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kind = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if kind is None:
            counts["passed"] += 1
            continue
        key = {"failure": "failed", "error": "errors", "skipped": "skipped"}[kind.tag]
        counts[key] += 1
        msg = (kind.get("message") or "")[:500]
        (skips if key == "skipped" else failures).append({"test": name, "message": msg,
                                                          "detail": (kind.text or "")[-1500:]})
    return {**counts, "failures": failures, "skips": skips[:10]}


def section_tests(ctx: Ctx, timeout: float, files: list[str] | None = None) -> dict:
    files = gpu_test_files() if files is None else files
    junit = ctx.tmp / "junit.xml"
    cmd = module_cmd("pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
                     f"--junitxml={junit}", *files)
    ran = run_child(cmd, timeout, ctx.tmp / "tests.log", {"NUMBA_ENABLE_CUDASIM": "0"})
    if not junit.exists():
        return {**failed(ran, "pytest"), "files": files}
    res = {"files": files, "command": shlex.join(map(str, cmd)), **parse_junit(junit), "tail": ran.tail[-1500:]}
    bad = res["failed"] or res["errors"] or ran.rc not in (0, None)
    res["status"] = "fail" if bad else "ok" if res["passed"] else "skipped"
    return res


def section_kernels(ctx: Ctx, timeout: float, cases: list[str] | None = None, device: str = "cuda",
                    scale: str = "full", repeats: int | None = None, warmup: int | None = None) -> dict:
    """All cases in one process when all goes well; when the process dies or hangs in a case, that case is
    recorded as the culprit and the rest continue in a new process. device='cpu': CPU tensors, the kernels
    in numba's CUDA simulator (how tests/test_gpu_check.py runs this on a machine without a GPU)."""
    names = list(CASES) if cases is None else list(cases)
    repeats = repeats if repeats is not None else 5 if ctx.quick else 20
    warmup = warmup if warmup is not None else 1 if ctx.quick else 3
    env = {"NUMBA_ENABLE_CUDASIM": "1" if device == "cpu" else "0"}
    deadline = time.monotonic() + timeout
    results, pending, attempt, barren = {}, names, 0, 0
    while pending:
        left = deadline - time.monotonic()
        if left < MIN_SECTION_S:
            results.update({n: {"name": n, "status": "skipped", "error": "out of the section's time"} for n in pending})
            break
        attempt += 1
        progress = ctx.tmp / f"kernels{attempt}.jsonl"
        cmd = child_cmd("kernels", "--cases", ",".join(pending), "--device", device, "--scale", scale,
                        "--repeats", repeats, "--warmup", warmup, "--result", progress)
        ran = run_child(cmd, left, ctx.tmp / f"kernels{attempt}.log", env, CASE_IDLE_S, progress)
        got = {r["name"]: r for r in read_jsonl(progress)}
        barren = 0 if got else barren + 1
        done = 0
        while done < len(pending) and pending[done] in got:
            results[pending[done]] = got[pending[done]]
            done += 1
        if done < len(pending):
            culprit = pending[done]
            results[culprit] = {"name": culprit, **failed(ran, "the kernel process", " during this case")}
            done += 1
        pending = pending[done:]
        if barren == 2 and pending:          # the process itself fails (an import, the driver): not a kernel
            results.update({n: {"name": n, "status": "skipped", "error": "two kernel processes in a row died before "
                                "finishing any case (see the errors above)"} for n in pending})
            break
    rows = [results[n] for n in names]
    status = "ok" if all(r["status"] == "ok" for r in rows) else "fail"
    return {"status": status, "device": device, "scale": scale, "shape": SHAPES[scale], "repeats": repeats,
            "warmup": warmup, "l2_flush_bytes": FLUSH_BYTES if device == "cuda" else 0, "cases": rows}


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:     # a line cut short by a kill
            pass
    return rows


def section_decode(ctx: Ctx, timeout: float, backend: str = "cuda") -> dict:
    res = ctx.tmp / "decode.json"
    cmd = module_cmd("minillm", "bench", "decode", "--model", "shakespeare", "--backend", backend, "--quick",
                     "--json", res)
    ran = run_child(cmd, timeout, ctx.tmp / "decode.log", {"NUMBA_ENABLE_CUDASIM": "0"})
    if ran.rc != 0 or not res.exists():
        return {**failed(ran, "bench decode"), "command": shlex.join(map(str, cmd))}
    out = json.loads(res.read_text())
    keep = ("model", "backend", "steps", "repeats", "tok_s_median", "tok_s_min", "tok_s_max", "tok_s_all", "params")
    return {"status": "ok", "command": shlex.join(map(str, cmd)), **{k: out.get(k) for k in keep},
            "stdout": ran.tail[-800:]}


def find_sanitizer(env=os.environ, which=shutil.which, exists=os.path.exists) -> str | None:
    """compute-sanitizer on PATH, else in /usr/local/cuda/bin, $CUDA_HOME/bin or $CUDA_PATH/bin."""
    found = which("compute-sanitizer")
    if found:
        return found
    homes = ["/usr/local/cuda"] + [env[k] for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)]
    return next((p for p in (os.path.join(h, "bin", "compute-sanitizer") for h in homes) if exists(p)), None)


RACECHECK_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
HAZARD_EXIT = 99        # --error-exitcode: the target ran, and racecheck found errors


def racecheck_verdict(ran: Ran) -> dict:
    """pass: the summary says 0 hazards and the program exited 0; fail: hazards reported as errors;
    warn: only warnings; error: no summary (the tool could not run: an unsupported device, a missing
    library) or the program failed; timeout."""
    m = RACECHECK_SUMMARY.search(ran.tail)
    res = {"seconds": round(ran.seconds, 1)}
    if ran.timed_out:
        return {**res, "status": "timeout", "tail": ran.tail[-1500:]}
    if m is None:
        return {**res, "status": "error", "error": f"no racecheck summary (exit {ran.rc})", "tail": ran.tail[-1500:]}
    hazards, errors, warnings = map(int, m.groups())
    res.update(hazards=hazards, errors=errors, warnings=warnings)
    if errors or ran.rc == HAZARD_EXIT:
        return {**res, "status": "fail", "tail": ran.tail[-2500:]}
    if ran.rc != 0:
        return {**res, "status": "error", "error": f"the kernels' process exited with {ran.rc}",
                "tail": ran.tail[-1500:]}
    return {**res, "status": "warn" if warnings else "pass"}


def section_racecheck(ctx: Ctx, timeout: float, cases: list[str] | None = None) -> dict:
    if ctx.sanitizer is None:
        return {"status": "skipped", "reason": "compute-sanitizer not found (PATH, /usr/local/cuda/bin, "
                                               "$CUDA_HOME/bin, $CUDA_PATH/bin)"}
    names = cases or (QUICK_RACECHECK if ctx.quick else [n for n, c in CASES.items() if c.racecheck])
    deadline = time.monotonic() + timeout
    ver = run_child([ctx.sanitizer, "--version"], min(30, timeout), ctx.tmp / "sanitizer.log")
    res = {"sanitizer": ctx.sanitizer, "version": ver.tail.strip().splitlines()[-1:] or None, "shape": SHAPES["tiny"],
           "cases": []}
    for i, name in enumerate(names):
        left = deadline - time.monotonic()
        if left < MIN_SECTION_S:
            res["cases"] += [{"name": n, "status": "skipped", "error": "out of the section's time"} for n in names[i:]]
            break
        cmd = [ctx.sanitizer, "--tool", "racecheck", "--error-exitcode", HAZARD_EXIT, *child_cmd("racecheck",
                                                                                               "--cases", name)]
        ran = run_child(cmd, min(RACECHECK_CASE_S, left), ctx.tmp / f"racecheck_{name}.log",
                        {"NUMBA_ENABLE_CUDASIM": "0"})
        res["cases"].append({"name": name, **racecheck_verdict(ran)})
        if i == 0 and res["cases"][0]["status"] in ("error", "timeout"):   # the tool itself: no use going on
            res["cases"] += [{"name": n, "status": "skipped", "error": "compute-sanitizer failed on the first kernel"}
                             for n in names[1:]]
            break
    statuses = {c["status"] for c in res["cases"]}
    res["status"] = ("fail" if "fail" in statuses else "error" if statuses & {"error", "timeout"} else
                     "skipped" if statuses == {"skipped"} else "ok")
    return res


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    run: Callable
    cap_s: float            # its own limit; the run's remaining budget may cut it shorter
    needs_gpu: bool = True


SECTIONS = [
    Section("env", "Machine", section_env, 60, needs_gpu=False),
    Section("tests", "gpu-marked tests (pytest -m gpu)", section_tests, 150),
    Section("kernels", "CUDA kernels against torch, same shapes and device", section_kernels, 180),
    Section("decode", "bench decode --backend cuda", section_decode, 90),
    Section("racecheck", "compute-sanitizer racecheck, shared-memory kernels", section_racecheck, 150),
]


def run_sections(sections: list[Section], ctx: Ctx, report: dict, out: Path, budget_s: float,
                 clock=time.monotonic) -> dict:
    """Each section in turn, within its cap and what is left of the budget; an exception or a failure is
    recorded and the next section runs; the report is rewritten after each. Sections that need a GPU are
    skipped when the env section found none."""
    start = clock()
    deadline = start + budget_s
    for s in sections:
        left = deadline - clock()
        env = report["sections"].get("env", {})
        t0 = clock()
        if left < MIN_SECTION_S:
            res = {"status": "skipped", "reason": f"out of the run's budget ({budget_s:.0f} s)"}
        elif s.needs_gpu and env.get("status") == "ok" and not env.get("gpu"):
            res = {"status": "skipped", "reason": "no CUDA GPU that both torch and numba can use (see Machine)"}
        else:
            try:
                res = s.run(ctx, min(s.cap_s, left))
            except Exception as e:  # recorded in the report
                res = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        res["seconds"] = round(clock() - t0, 1)
        report["sections"][s.name] = res
        report["total_s"] = round(clock() - start, 1)
        write_report(out, report)
        print(f"gpu-check: {s.name} {res['status']} ({res['seconds']:.0f} s)", flush=True)
    return report


# ----------------------------------------------------------------------------- the report

def _fmt(v, spec=".3g", missing="-"):
    return missing if v is None else format(v, spec)


def _machine_md(r: dict) -> list[str]:
    keys = ["gpu_name", "capability", "sms", "memory_gib", "driver", "torch_cuda", "cuda_driver_api", "cuda_runtime",
            "torch", "numba", "numba_cuda", "python", "platform", "copy_gb_s", "torch_sees_gpu", "numba_sees_gpu",
            "numba_detect"]
    lines = [f"- {k}: {r[k]:.0f}" if k == "copy_gb_s" else f"- {k}: {r[k]}" for k in keys if k in r]
    lines += [f"- {k}: {v}" for k, v in r.items() if k.endswith("_error")]
    return lines


def _tests_md(r: dict) -> list[str]:
    if "passed" not in r:
        return []
    lines = [f"{r['passed']} passed, {r['failed']} failed, {r['errors']} errors, {r['skipped']} skipped "
             f"({', '.join(r['files'])})", ""]
    lines += [f"- FAILED {f['test']}: {f['message']}" for f in r["failures"]]
    lines += [f"- skipped {s['test']}: {s['message']}" for s in r["skips"]]
    return lines


def _kernels_md(r: dict, copy_gb_s: float | None) -> list[str]:
    if "cases" not in r:
        return []
    lines = [f"Shapes ({r['scale']}): {r['shape']}. Median of {r['repeats']} timed calls after {r['warmup']} "
             f"warm-ups, each between device synchronisations, L2 flushed ({r['l2_flush_bytes'] >> 20} MiB) "
             "before each; kernel times include the launcher's Python checks and __cuda_array_interface__ "
             "conversions (what the engine pays). Bytes: compulsory traffic (each array once). "
             f"Correct: max |kernel - torch| / max |torch| <= {TOL:g}."
             + (f" % copy: of torch's device copy, {copy_gb_s:.0f} GB/s." if copy_gb_s else ""), "",
             "| kernel | MB | kernel ms | GB/s | torch ms | torch GB/s | speed vs torch | % copy | TFLOP/s | "
             "rel err | status |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["cases"]:
        if "kernel_s" not in c:
            lines.append(f"| {c['name']} | | | | | | | | | | {c['status']}: {c.get('error', '')} |")
            continue
        pct = f"{100 * c['kernel_gb_s'] / copy_gb_s:.0f}%" if copy_gb_s else "-"
        lines.append(f"| {c['name']} | {c['bytes'] / 1e6:.1f} | {1e3 * c['kernel_s']:.3f} | {c['kernel_gb_s']:.0f} | "
                     f"{1e3 * c['torch_s']:.3f} | {c['torch_gb_s']:.0f} | {c['speed_vs_torch']:.2f}x | {pct} | "
                     f"{_fmt(c['kernel_tflop_s'])} | {c['max_rel_err']:.1e} | {c['status']} |")
    lines += ["", "Launchers, their torch equivalents, and shapes:"]
    for c in r["cases"]:
        case = CASES.get(c["name"])
        what = f"{case.module}.{case.launcher} vs {case.torch_desc}" if case else ""
        lines.append(f"- {c['name']}: {what}" + (f"; {c['shapes']}" if "shapes" in c else ""))
    for c in r["cases"]:
        if c["status"] in ("error", "timeout"):
            lines += ["", f"{c['name']} ({c['status']}): {c.get('error', '')}", "```",
                      (c.get("traceback") or c.get("tail", "")).strip()[-1500:], "```"]
    return lines


def _decode_md(r: dict) -> list[str]:
    if "tok_s_median" not in r:
        return []
    return [f"`{r['command']}`", "", f"{r['model']} ({r['backend']}): {r['tok_s_median']:.1f} tok/s median over "
            f"{r['repeats']} runs of {r['steps']} steps (min {r['tok_s_min']:.1f}, max {r['tok_s_max']:.1f})"]


def _racecheck_md(r: dict) -> list[str]:
    if "cases" not in r:
        return []
    lines = [f"{r['sanitizer']} ({' '.join(r['version'] or [])}), shapes {r['shape']}", "",
             "| kernel | verdict | hazards | errors | warnings | s |", "|---|---|---|---|---|---|"]
    lines += [f"| {c['name']} | {c['status']} | {_fmt(c.get('hazards'), 'd')} | {_fmt(c.get('errors'), 'd')} | "
              f"{_fmt(c.get('warnings'), 'd')} | {_fmt(c.get('seconds'), '.0f')} |" for c in r["cases"]]
    for c in r["cases"]:
        if c["status"] not in ("pass", "skipped"):
            lines += ["", f"{c['name']} ({c['status']}): {c.get('error', '')}", "```", c.get("tail", "").strip(), "```"]
    return lines


def render(report: dict) -> str:
    secs = report["sections"]
    env = secs.get("env", {})
    lines = [f"# GPU check: {env.get('gpu_name', 'no GPU found')}", "",
             f"Started {report['started']}, {report.get('total_s', 0):.0f} s of a {report['budget_s']:.0f} s budget; "
             f"`{report['command']}`", "", "| section | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {r['status']} | {r.get('seconds', '')} |" for name, r in secs.items()]
    md = {"env": _machine_md, "tests": _tests_md, "decode": _decode_md, "racecheck": _racecheck_md,
          "kernels": lambda r: _kernels_md(r, env.get("copy_gb_s"))}
    titles = {s.name: s.title for s in SECTIONS}
    for name, r in secs.items():
        lines += ["", f"## {titles.get(name, name)}: {r['status']}", ""]
        lines += [f"Skipped: {r['reason']}"] if "reason" in r else []
        if "error" in r:
            lines += [f"Error: {r['error']}"]
        lines += md[name](r) if name in md else []
        if r["status"] in ("error", "timeout") and ("tail" in r or "traceback" in r):
            lines += ["```", (r.get("traceback") or r.get("tail", "")).strip(), "```"]
    lines += ["", "## Raw results", "", "```json", json.dumps(report, indent=1, default=str), "```", ""]
    return "\n".join(lines)


def write_report(out: Path, report: dict):
    """The whole report, rewritten; if rendering fails, the raw results still reach the file."""
    try:
        text = render(report)
    except Exception:  # a bad renderer must not lose the results it was given
        text = (f"# GPU check\n\nThe report could not be rendered:\n\n```\n{traceback.format_exc()}```\n\n"
                f"```json\n{json.dumps(report, indent=1, default=str)}\n```\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    tmp.write_text(text)
    tmp.replace(out)          # a reader (or a kill) never sees half a report


def default_out(env=os.environ) -> Path:
    return Path(env["OUT"]) / "gpu_check.md" if env.get("OUT") else Path("gpu_check.md")


# ----------------------------------------------------------------------------- command line

def plan(sections: list[Section], ctx: Ctx, out: Path, budget_s: float) -> str:
    """What a run would do, without doing any of it (--dry-run)."""
    lines = [f"gpu-check: {len(sections)} sections within {budget_s:.0f} s; report -> {out}"]
    for s in sections:
        lines.append(f"- {s.name} (at most {s.cap_s:.0f} s{', needs a GPU' if s.needs_gpu else ''}): {s.title}")
        if s.name == "env":
            lines.append(f"    {shlex.join(map(str, child_cmd('env', '--result', 'F')))}")
        if s.name == "tests":
            lines.append(f"    {shlex.join(map(str, module_cmd('pytest', '-m', 'gpu', *gpu_test_files())))}")
        if s.name == "kernels":
            lines.append(f"    shapes {SHAPES['full']}; {5 if ctx.quick else 20} timed runs per kernel and torch")
            lines += [f"    {c.name}: {c.module}.{c.launcher} vs {c.torch_desc}" for c in CASES.values()]
        if s.name == "decode":
            cmd = module_cmd("minillm", "bench", "decode", "--model", "shakespeare", "--backend", "cuda", "--quick")
            lines.append(f"    {shlex.join(map(str, cmd))}")
        if s.name == "racecheck":
            names = QUICK_RACECHECK if ctx.quick else [n for n, c in CASES.items() if c.racecheck]
            lines.append(f"    {ctx.sanitizer or 'compute-sanitizer not found: would be skipped'}; shapes "
                         f"{SHAPES['tiny']}: {', '.join(names)}")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python tests/gpu_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="the report (default: $OUT/gpu_check.md if OUT is set, "
                                                "else ./gpu_check.md)")
    ap.add_argument("--quick", action="store_true", help="5 timed runs per kernel, racecheck on one kernel per file")
    ap.add_argument("--sections", default=",".join(s.name for s in SECTIONS),
                    help="a comma-separated subset of: " + ", ".join(s.name for s in SECTIONS))
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole run (default %(default)s)")
    ap.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    ap.add_argument("--child", choices=["env", "kernels", "racecheck"], help=argparse.SUPPRESS)
    ap.add_argument("--cases", default="", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--scale", default="full", choices=list(SHAPES), help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=20, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    known = {s.name for s in SECTIONS}
    a.sections = [n for n in a.sections.split(",") if n]
    bad = [n for n in a.sections if n not in known]
    if bad:
        ap.error(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(s.name for s in SECTIONS)}")
    if a.budget <= 0:
        ap.error(f"--budget must be > 0 seconds, got {a.budget:g}")
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--module"]:          # a child: `python -m MODULE ARGS` on the source tree
        use_source_tree()
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    a = parse_args(argv)
    if a.child:
        use_source_tree()
        names = [n for n in a.cases.split(",") if n]
        if a.child == "env":
            return child_env(Path(a.result)) or 0
        if a.child == "kernels":
            return child_kernels(names, a.scale, a.device, a.repeats, a.warmup, Path(a.result))
        return child_racecheck(names) or 0
    sections = [s for s in SECTIONS if s.name in a.sections]
    out = Path(a.out) if a.out else default_out()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        ctx = Ctx(Path(tmp), a.quick, find_sanitizer())
        if a.dry_run:
            print(plan(sections, ctx, out, a.budget))
            return 0
        report = {"check": "gpu-check", "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "budget_s": a.budget,
                  "quick": a.quick, "root": str(ROOT), "command": shlex.join([sys.executable, str(SCRIPT), *argv]),
                  "sections": {}}
        run_sections(sections, ctx, report, out, a.budget)
    statuses = {n: r["status"] for n, r in report["sections"].items()}
    print("gpu-check: " + ", ".join(f"{n} {st}" for n, st in statuses.items()) + f"; report: {out}")
    env = report["sections"].get("env", {})
    if env.get("status") == "ok" and not env.get("gpu"):
        print("gpu-check: no CUDA GPU that torch and numba can both use: nothing was checked")
        return 2
    return 1 if set(statuses.values()) - {"ok", "skipped"} else 0


if __name__ == "__main__":
    sys.exit(main())
