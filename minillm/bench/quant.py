"""`python -m minillm bench quant`: every quantization scheme side by side on one model, in one run.

Per scheme: perplexity on held-out text (every window prefilled through the engine's KV pool, so an
int8 cache is read back as it would be served), weight bytes, KV bytes per token, batch-1 greedy decode
tok/s (run.c's loop) and 32-sequence batched decode tok/s (the engine), each also as a ratio to float32.
Timings are medians of a few runs after a warm-up, all in this one process, one scheme after another.
"""
from __future__ import annotations

import math
import os
import statistics

import torch

from ..core.sampling import RunCSampler, SamplingParams
from ..engine.runc import decode_loop
from ..formats.loader import MODELS_DIR, load
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


def held_out_windows(tok, T: int = 256, max_windows: int = 25):
    """The packaged held-out Shakespeare slice, cut into (N, T) inputs and targets."""
    ids = torch.tensor(tok.encode(open(os.path.join(MODELS_DIR, "val_slice.txt")).read()))
    n = min(max_windows, (len(ids) - 1) // T)
    return ids[:n * T].view(n, T), ids[1:n * T + 1].view(n, T)


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
                windows: int = 25, schemes=None) -> dict:
    net, tok = load(model, tokenizer)
    x, y = held_out_windows(tok, max_windows=windows)
    greedy = RunCSampler(0.0, 0.9, 1)
    rows = {}
    twin = with_outlier_channels(net)
    for label, q, qcfg, kv_dtype, *variant in schemes or SCHEMES:
        src = twin if variant else net
        m = quantize_model(src, q, qcfg, tok)[0] if q else src
        kvd = torch.int8 if kv_dtype == "int8" else torch.float32

        def run(n):
            return decode_loop(m, tok, greedy, "", n, write=None, stop_at_bos=False)[1]
        run(4)
        one = statistics.median(run(steps) for _ in range(repeats))
        rates = []
        for _ in range(repeats + 1):                                                    # the first warms up
            from ..engine.llm import LLM
            llm = LLM(m, tokenizer=tok, kv_cache_dtype=kv_dtype,                         # m: already quantized
                      max_num_seqs=batch, max_model_len=steps + 1)
            llm.generate([[1]] * batch, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
            dec = [s for s in llm.engine.trace.steps if s.kind == "decode"]
            rates.append(sum(s.num_decode_tokens for s in dec) / sum(s.seconds for s in dec))
        loss = pool_loss(m, x, y, kvd)
        rows[label] = {"loss": loss, "perplexity": math.exp(loss), "weight_bytes": weight_bytes(m),
                       "kv_bytes_per_token": KVCache.bytes_per_token(net.config, kvd),
                       "decode_tok_s": one, "batched_tok_s": statistics.median(rates[1:])}
    base = rows[next(iter(rows))]
    for r in rows.values():
        r.update(delta_ppl=r["perplexity"] / base["perplexity"] - 1,
                 weight_ratio=r["weight_bytes"] / base["weight_bytes"],
                 kv_ratio=r["kv_bytes_per_token"] / base["kv_bytes_per_token"],
                 decode_speedup=r["decode_tok_s"] / base["decode_tok_s"],
                 batched_speedup=r["batched_tok_s"] / base["batched_tok_s"])
    return {"bench": "quant", "model": str(model), "steps": steps, "batch": batch, "repeats": repeats,
            "windows": int(x.shape[0]), "threads": torch.get_num_threads(), "runs": rows}


def print_table(res: dict):
    cols = [("perplexity", "{:>11.3f}"), ("delta_ppl", "{:>+10.2%}"), ("weight_ratio", "{:>8.3f}"),
            ("kv_ratio", "{:>6.3f}"), ("decode_tok_s", "{:>9.1f}"), ("decode_speedup", "{:>7.2f}x"),
            ("batched_tok_s", "{:>9.0f}"), ("batched_speedup", "{:>7.2f}x")]
    print(f"{res['model']}: {res['windows']} held-out windows of 256; decode {res['steps']} steps; "
          f"batched {res['batch']} sequences")
    print(f"{'scheme':<24}{'ppl':>11}{'d ppl':>10}{'weights':>8}{'KV':>6}{'tok/s':>9}{'x fp32':>8}"
          f"{'batched':>9}{'x fp32':>8}")
    for label, r in res["runs"].items():
        print(f"{label:<24}" + "".join(fmt.format(r[c]) for c, fmt in cols))
