"""`python -m minillm bench quant`: every quantization scheme side by side on one model, in one run.

Per scheme: perplexity on held-out text (every window prefilled through the engine's KV pool, so an
int8 cache is read back as it would be served), weight bytes, KV bytes per token, batch-1 greedy decode
tok/s (run.c's loop) and 32-sequence batched decode tok/s (the engine), each also as a ratio to float32.
Timings are medians of a few runs after a warm-up, all in this one process, one scheme after another.

`bench_gemv`: the memory-bound regime on its own. Batch-1 decode is a chain of matrix-vector products
(GEMV), one per linear layer; it runs them through the engine's weight types (nn.Linear, Int8Linear,
Int4Linear) over layers whose weights, in every format, exceed the CPU's last-level cache, so each pass
reads them from main memory as a real model's decode does.

`bench_linear_rows`: the same regime through the numba backend's kernels (minillm.kernels.matmul.linear_cpu for
float32, minillm.kernels.quant_rows for int8, int4, q8_0 and W8A8), with M rows per call: M = 1 is batch-1
decode, M = 32 a batched decode step, where every weight read from memory serves all M rows.
"""
from __future__ import annotations

import glob
import math
import os
import re
import statistics
import subprocess
import time

import numpy as np
import torch

from ..core.sampling import RunCSampler, SamplingParams
from ..engine.runc import decode_loop
from ..formats.held_out import held_out_windows  # noqa: F401  (bench quant's own, and its old home)
from ..formats.loader import load
from ..llama.attention import AttentionMetadata
from ..llama.kv_cache import KVCache
from ..quantization.calibration import with_outlier_channels
from ..quantization.quantize import quantize_model

# (label, quantization, quant_config, kv_cache_dtype)
SCHEMES = [("fp32", None, None, "auto"), ("int8", "int8", None, "auto"),
           ("int4 g32", "int4", {"group_size": 32}, "auto"),
           ("int4 g128", "int4", {"group_size": 128}, "auto"), ("awq g32", "awq", {"group_size": 32}, "auto"),
           ("awq g128", "awq", {"group_size": 128}, "auto"), ("q8_0", "q8_0", None, "auto"),
           ("w8a8", "w8a8", None, "auto"), ("smoothquant", "smoothquant", {"alpha": 0.5}, "auto"),
           ("fp32, KV int8", None, None, "int8"),
           # the same function with outlier activation channels (quant.with_outlier_channels): the SmoothQuant case
           ("w8a8, outliers", "w8a8", None, "auto", "outliers"),
           ("smoothquant, outliers", "smoothquant", {"alpha": 0.5}, "auto", "outliers")]


def pool_loss(model, x, y, kv_dtype=torch.float32, block_size: int = 16, batch: int = 4) -> float:
    """Mean cross-entropy with every window prefilled through a paged pool of kv_dtype."""
    n, T = x.shape
    total = 0.0
    for i in range(0, n, batch):
        xb, yb = x[i:i + batch], y[i:i + batch]
        B, M = xb.shape[0], -(-T // block_size)
        kv = KVCache(model.config, num_blocks=B * M, block_size=block_size, dtype=kv_dtype)
        positions = torch.arange(T).expand(B, T)                                        # (B, T)
        attn = AttentionMetadata.build(positions, torch.arange(B * M).view(B, M), torch.full((B,), T), block_size)
        with torch.no_grad():
            logits = model(xb, positions, kv, attn)                                     # (B, T, V)
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="sum").item()
    return total / y.numel()


def weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers())
               if t is not model.rope_cos and t is not model.rope_sin)


def bench_quant(model: str = "shakespeare", tokenizer=None, steps: int = 64, batch: int = 32, repeats: int = 3,
                windows: int = 25, schemes=None, speed: bool = True) -> dict:
    """Every scheme's perplexity and bytes, and (speed=True) its decode tok/s at batch 1 and at `batch`."""
    net, tok = load(model, tokenizer)
    x, y = held_out_windows(tok, max_windows=windows)
    rows = {}
    twin = with_outlier_channels(net)
    for label, q, qcfg, kv_dtype, *variant in schemes or SCHEMES:
        src = twin if variant else net
        m = quantize_model(src, q, qcfg, tok)[0] if q else src
        kvd = torch.int8 if kv_dtype == "int8" else torch.float32

        loss = pool_loss(m, x, y, kvd)
        rows[label] = {"loss": loss, "perplexity": math.exp(loss), "weight_bytes": weight_bytes(m),
                       "kv_bytes_per_token": KVCache.bytes_per_token(net.config, kvd)}
        if speed:
            rows[label].update(_decode_speed(m, tok, kv_dtype, steps, batch, repeats))
    base = rows[next(iter(rows))]
    for r in rows.values():
        r.update(delta_ppl=r["perplexity"] / base["perplexity"] - 1,
                 weight_ratio=r["weight_bytes"] / base["weight_bytes"],
                 kv_ratio=r["kv_bytes_per_token"] / base["kv_bytes_per_token"])
        if speed:
            r.update(decode_speedup=r["decode_tok_s"] / base["decode_tok_s"],
                     batched_speedup=r["batched_tok_s"] / base["batched_tok_s"])
    return {"bench": "quant", "model": str(model), "steps": steps, "batch": batch, "repeats": repeats,
            "windows": int(x.shape[0]), "threads": torch.get_num_threads(), "speed": speed, "runs": rows}


def _decode_speed(m, tok, kv_dtype: str, steps: int, batch: int, repeats: int) -> dict:
    """Batch-1 greedy decode tok/s (run.c's loop) and `batch`-sequence decode tok/s through the engine, both on
    the backend the engine would choose for this model (backend="auto": numba for what it runs, else torch)."""
    from ..backends.capabilities import backend_model, choose_backend
    from ..config import EngineConfig
    from ..engine.llm import LLM
    greedy = RunCSampler(0.0, 0.9, 1)
    backend, _ = choose_backend(EngineConfig(), None, m)
    fwd = backend_model(m, backend)

    def run(n):
        return decode_loop(fwd, tok, greedy, "", n, write=None, stop_at_bos=False)[1]
    run(4)
    one = statistics.median(run(steps) for _ in range(repeats))
    rates = []
    for _ in range(repeats + 1):                                                        # the first warms up
        llm = LLM(m, tokenizer=tok, kv_cache_dtype=kv_dtype,                             # m: already quantized
                  max_num_seqs=batch, max_model_len=steps + 1)
        llm.generate([[1]] * batch, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
        dec = [s for s in llm.engine.trace.steps if s.kind == "decode"]
        rates.append(sum(s.num_decode_tokens for s in dec) / sum(s.seconds for s in dec))
    return {"decode_tok_s": one, "batched_tok_s": statistics.median(rates[1:]), "backend": backend}


def print_table(res: dict):
    speed = res.get("speed", True)
    cols = [("perplexity", "{:>11.3f}"), ("delta_ppl", "{:>+10.2%}"), ("weight_ratio", "{:>8.3f}"),
            ("kv_ratio", "{:>6.3f}")]
    if speed:
        cols += [("decode_tok_s", "{:>9.1f}"), ("decode_speedup", "{:>7.2f}x"), ("batched_tok_s", "{:>9.0f}"),
                 ("batched_speedup", "{:>7.2f}x"), ("backend", "{:>8}")]
    print(f"{res['model']}: {res['windows']} held-out windows of 256" +
          (f"; decode {res['steps']} steps; batched {res['batch']} sequences" if speed else ""))
    print(f"{'scheme':<24}{'ppl':>11}{'d ppl':>10}{'weights':>8}{'KV':>6}" +
          (f"{'tok/s':>9}{'x fp32':>8}{'batched':>9}{'x fp32':>8}{'backend':>8}" if speed else ""))
    for label, r in res["runs"].items():
        print(f"{label:<24}" + "".join(fmt.format(r[c]) for c, fmt in cols))


# ------------------------------------------------------------------------------ the memory-bound regime
DEFAULT_LLC = 32 << 20          # assumed when the machine does not say (a common desktop / laptop L3)
GEMV_FORMATS = ("fp32", "int8", "int4 g32")


def _size_bytes(text: str) -> int | None:
    """'32768K', '32 MiB', '1 MiB (2 instances)', '512 KB' -> bytes."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\b", text, re.I)
    if not m:
        return None
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()])


def last_level_cache_bytes() -> int | None:
    """The last-level cache one core sees, in bytes: Linux's /sys/devices/system/cpu/cpu0/cache (the
    highest level's size), else `lscpu`'s largest 'L<n> cache' line (its size per instance); None where
    neither says."""
    best = (0, None)
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            level = int(open(os.path.join(d, "level")).read())
            kind = open(os.path.join(d, "type")).read().strip()
            size = _size_bytes(open(os.path.join(d, "size")).read())
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and size and level > best[0]:
            best = (level, size)
    if best[1]:
        return best[1]
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for level in "4321":
        m = re.search(rf"^L{level}d? cache:\s*(.+)$", out, re.M)
        if m and _size_bytes(m.group(1)):
            total, inst = _size_bytes(m.group(1)), re.search(r"\((\d+) instances?\)", m.group(1))
            return total // int(inst.group(1)) if inst else total
    return None


def gemv_layer_bytes(fmt: str, N: int, K: int) -> int:
    """Bytes one (N, K) linear layer stores in a format of GEMV_FORMATS: fp32 4 per weight; int8 1 per weight plus
    a float32 scale per row; int4 gG half a byte per weight plus a float32 scale per group of G."""
    if fmt == "fp32":
        return 4 * N * K
    if fmt == "int8":
        return N * K + 4 * N
    m = re.fullmatch(r"int4 g(\d+)", fmt)
    if not m:
        raise ValueError(f"unknown GEMV format {fmt!r}; known: fp32, int8, int4 g<group> (e.g. {GEMV_FORMATS[2]!r})")
    return N * K // 2 + 4 * N * (K // int(m.group(1)))


def gemv_layers(fmt: str, N: int, K: int, layers: int, seed: int = 0) -> list:
    """`layers` linear layers (N, K) in one format, as the engine stores them (nn.Linear, Int8Linear,
    Int4Linear), each in its own memory. The weights are random (the values do not change how long a GEMV
    takes, and building them needs no quantizer pass over float weights) and the layers copies of the
    first (a copy is cheaper to make than new random numbers)."""
    from ..llama.linears import Int4Linear, Int8Linear
    gemv_layer_bytes(fmt, N, K)                                                          # checks the name
    g = torch.Generator().manual_seed(seed)
    if fmt == "fp32":
        w = torch.empty(N, K).uniform_(-0.05, 0.05, generator=g)

        def make(w):
            lin = torch.nn.Linear(K, N, bias=False, device="meta")
            lin.weight = torch.nn.Parameter(w, requires_grad=False)
            return lin
    elif fmt == "int8":
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)

        def make(w):
            return Int8Linear(w, torch.full((N,), 1e-3))
    else:
        G = int(fmt.split("g")[1])
        w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)

        def make(w):
            return Int4Linear(w, torch.full((N, K // G), 1e-3), G)
    return [make(w if i == 0 else w.clone()) for i in range(layers)]


def _layers_beyond_llc(smallest: int, layers: int | None, repeats: int, llc_bytes: int | None, beyond: float) -> int:
    """`layers` as given, or the fewest layers of `smallest` bytes that hold `beyond` times the last-level cache
    (DEFAULT_LLC when unknown), so that every format streams its weights from main memory on every pass."""
    if layers is None:
        layers = max(1, math.ceil(beyond * (llc_bytes or DEFAULT_LLC) / smallest))
    if layers < 1 or repeats < 1:
        raise ValueError(f"layers and repeats must be >= 1, got layers={layers}, repeats={repeats}")
    return layers


@torch.inference_mode()
def bench_gemv(shape=(4096, 4096), layers: int | None = None, repeats: int = 5, formats=GEMV_FORMATS,
               llc_bytes: int | None = None, beyond: float = 1.5) -> dict:
    """Batch-1 decode's GEMVs on their own: one float32 row x (1, K) through `layers` linear layers of
    shape (N, K), once per "token", in each format. `layers` defaults to the fewest that make the smallest
    format's weights `beyond` times the last-level cache (llc_bytes, default: read from the machine, else
    DEFAULT_LLC), so every format streams its weights from main memory on every pass.
    numba's kernels run on torch's thread count (the free cores) during the measurement.

    -> {"shape": (N, K), "layers", "llc_bytes" (None: unknown), "repeats", "threads", "rows": {format:
    {"weight_bytes": all layers, "seconds": median seconds per pass (one token), "gb_s": weight bytes read
    per second / 1e9, "ms_per_token": seconds * 1e3, "speedup": the first format's seconds / these}}}"""
    N, K = shape
    known = last_level_cache_bytes() if llc_bytes is None else llc_bytes
    layers = _layers_beyond_llc(min(gemv_layer_bytes(f, N, K) for f in formats), layers, repeats, known, beyond)
    threads = torch.get_num_threads()
    import numba
    numba_before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    rows = {}
    try:
        for fmt in formats:
            mods = gemv_layers(fmt, N, K, layers)
            x = torch.randn(1, K, generator=torch.Generator().manual_seed(1))
            times = []
            for _ in range(repeats + 1):                                                 # the first warms up
                t0 = time.perf_counter()
                for m in mods:
                    m(x)
                times.append(time.perf_counter() - t0)
            s = statistics.median(times[1:])
            nbytes = sum(b.numel() * b.element_size() for m in mods for b in list(m.parameters()) + list(m.buffers()))
            rows[fmt] = {"weight_bytes": nbytes, "seconds": s, "ms_per_token": s * 1e3, "gb_s": nbytes / s / 1e9}
            del mods
    finally:
        numba.set_num_threads(numba_before)
    first = rows[formats[0]]["seconds"]
    for r in rows.values():
        r["speedup"] = first / r["seconds"]
    return {"bench": "gemv", "shape": (N, K), "layers": layers, "llc_bytes": known, "repeats": repeats,
            "threads": threads, "rows": rows}


# ------------------------------------------------------------------------------ the numba backend's kernels
LINEAR_ROWS_FORMATS = ("fp32", "int8", "int4 g32", "int4 g128", "q8_0", "w8a8")


def linear_rows_layer(fmt: str, N: int, K: int, seed: int = 0) -> dict:
    """One (N, K) layer in a format of LINEAR_ROWS_FORMATS as the numba kernels take it: a dict of numpy arrays
    (random values: they do not change how long a kernel takes). q8_0's group is runq.c's (64, halved until it
    divides K)."""
    from ..llama.linears import q80_group_size
    rng = np.random.default_rng(seed)
    if fmt == "fp32":
        return {"w": rng.uniform(-0.05, 0.05, (N, K)).astype(np.float32)}
    if fmt in ("int8", "q8_0", "w8a8"):
        groups = K // q80_group_size(K) if fmt == "q8_0" else None
        return {"w_q": rng.integers(-127, 128, (N, K), dtype=np.int8),
                "scales": np.full((N, groups) if groups else (N,), 1e-3, np.float32)}
    m = re.fullmatch(r"int4 g(\d+)", fmt)
    if not m or K % int(m.group(1)) or int(m.group(1)) % 2:
        raise ValueError(f"unknown format {fmt!r} for K = {K}; known: {', '.join(LINEAR_ROWS_FORMATS)} "
                         "(int4 g<G>: an even G that divides K)")
    return {"w_packed": rng.integers(0, 256, (N, K // 2), dtype=np.uint8),
            "scales": np.full((N, K // int(m.group(1))), 1e-3, np.float32)}


def _linear_rows_call(fmt: str, layer: dict, x, y):
    """A zero-argument call of the format's kernel on x (M, K) -> y (M, N), activation quantization included
    (q8_0 and W8A8 quantize x per call, as a forward does before each matmul)."""
    from ..kernels import quant_rows as qr
    from ..kernels.matmul import linear_cpu
    if fmt == "fp32":
        return lambda: linear_cpu(x, layer["w"], y)
    if fmt == "int8":
        return lambda: qr.int8_linear_rows(x, layer["w_q"], layer["scales"], y)
    if fmt.startswith("int4"):
        return lambda: qr.int4_linear_rows(x, layer["w_packed"], layer["scales"], y)
    xq = np.empty(x.shape, np.int8)                                                      # (M, K)
    if fmt == "q8_0":
        G = x.shape[1] // layer["scales"].shape[1]
        xs = np.empty((x.shape[0], layer["scales"].shape[1]), np.float32)               # (M, K/G)

        def q8_0():
            qr.q8_0_quantize_rows(x, G, xq, xs)
            qr.q8_0_linear_rows(xq, xs, layer["w_q"], layer["scales"], y)
        return q8_0
    xs, no_smooth = np.empty(x.shape[0], np.float32), np.zeros(0, np.float32)             # (M,)

    def w8a8():
        qr.w8a8_quantize_rows(x, no_smooth, xq, xs)
        qr.w8a8_linear_rows(xq, xs, layer["w_q"], layer["scales"], y)
    return w8a8


def bench_linear_rows(N: int = 2048, K: int = 768, M: int = 1, repeats: int = 5, formats=LINEAR_ROWS_FORMATS,
                      layers: int | None = None, llc_bytes: int | None = None, beyond: float = 1.5,
                      threads: int | None = None) -> dict:
    """The numba kernels' y (M, N) = x (M, K) @ W^T over `layers` distinct (N, K) weight matrices per format, one
    pass through all of them per repeat, formats interleaved within each repeat (so a change in the machine's
    load affects them alike). `layers` defaults to the fewest that make the smallest format's weights `beyond`
    times the last-level cache, so every format streams from main memory, as decode does with a model larger
    than the cache. numba runs on `threads` threads (default: torch's thread count).

    -> {"shape": (N, K), "M", "layers", "llc_bytes", "repeats", "threads", "rows": {format: {"weight_bytes": all
    layers, scales included, "seconds": median seconds per pass, "ms_per_pass", "gb_s": weight bytes / seconds / 1e9,
    "spread": (min, max) seconds per pass, "speedup": the first format's seconds / these}}}"""
    if min(N, K, M) < 1:
        raise ValueError(f"N, K and M must be >= 1, got N={N}, K={K}, M={M}")
    known = last_level_cache_bytes() if llc_bytes is None else llc_bytes
    one = {fmt: linear_rows_layer(fmt, N, K) for fmt in formats}                        # checks every name first
    sizes = {fmt: sum(a.nbytes for a in layer.values()) for fmt, layer in one.items()}
    layers = _layers_beyond_llc(min(sizes.values()), layers, repeats, known, beyond)
    x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)              # (M, K)
    y = np.empty((M, N), np.float32)                                                     # (M, N)
    calls = {fmt: [_linear_rows_call(fmt, one[fmt] if i == 0 else {k: a.copy() for k, a in one[fmt].items()}, x, y)
                   for i in range(layers)] for fmt in formats}                           # each layer its own memory
    import numba
    threads = min(threads or torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
    numba_before = numba.get_num_threads()
    numba.set_num_threads(threads)
    times = {fmt: [] for fmt in formats}
    try:
        for rep in range(repeats + 1):                                                   # the first warms up
            for fmt in formats:
                t0 = time.perf_counter()
                for call in calls[fmt]:
                    call()
                if rep:
                    times[fmt].append(time.perf_counter() - t0)
    finally:
        numba.set_num_threads(numba_before)
    rows = {}
    for fmt in formats:
        s, nbytes = statistics.median(times[fmt]), layers * sizes[fmt]
        rows[fmt] = {"weight_bytes": nbytes, "seconds": s, "ms_per_pass": s * 1e3, "gb_s": nbytes / s / 1e9,
                     "spread": (min(times[fmt]), max(times[fmt])), "speedup": None}
    for r in rows.values():
        r["speedup"] = rows[formats[0]]["seconds"] / r["seconds"]
    return {"bench": "linear_rows", "shape": (N, K), "M": M, "layers": layers, "llc_bytes": known,
            "repeats": repeats, "threads": threads, "rows": rows}


def print_linear_rows(res: dict):
    N, K = res["shape"]
    first = next(iter(res["rows"]))
    print(f"y (M={res['M']}, N={N}) = x @ W^T, K={K}: {res['layers']} layers per format, median of {res['repeats']} "
          f"passes, {res['threads']} threads")
    print(f"{'format':<11}{'MiB':>8}{'ms/pass':>10}{'GB/s':>8}{'x ' + first:>9}")
    for fmt, r in res["rows"].items():
        print(f"{fmt:<11}{r['weight_bytes'] / 2**20:>8.1f}{r['ms_per_pass']:>10.2f}{r['gb_s']:>8.1f}"
              f"{r['speedup']:>8.2f}x")
