"""`python -m minillm bench gptq`: GPTQ beside round-to-nearest int4 and AWQ at the same group size, on one model.

Per scheme: perplexity on the held-out split (bench quant's windows, every window prefilled through the engine's KV
pool: bench.quant.pool_loss), its change against float32, and the wall-clock seconds quantize_model took (the
calibration forwards included). GPTQ and round-to-nearest store the same Int4Linear layout, so their decode speed is
int4's (`bench quant`); what GPTQ changes is which int4 values are stored, and the time it takes to choose them.
"""
from __future__ import annotations

import math
import time

import torch

from ..formats.loader import load
from ..quantization.quantize import quantize_model
from ..threads import auto_threads
from .quant import held_out_windows, pool_loss


def gptq_schemes(groups=(32, 128), act_order: bool = True) -> list:
    """(label, quantization, quant_config) rows: float32, then per group size RTN int4, AWQ, GPTQ (and with
    act_order)."""
    rows = [("fp32", None, None)]
    for g in groups:
        rows += [(f"int4 g{g}", "int4", {"group_size": g}), (f"awq g{g}", "awq", {"group_size": g}),
                 (f"gptq g{g}", "gptq", {"group_size": g})]
        if act_order:
            rows.append((f"gptq g{g} act-order", "gptq", {"group_size": g, "act_order": True}))
    return rows


def bench_gptq(model: str = "shakespeare", tokenizer=None, windows: int = 25, schemes=None) -> dict:
    """Every row of `schemes` (default gptq_schemes()): perplexity on `windows` held-out windows of 256 tokens,
    delta against the first row, and quantization seconds. -> {"runs": {label: {...}}, ...}."""
    auto_threads()              # every row on the same thread count (GPTQ would set it on its first row)
    net, tok = load(model, tokenizer)
    x, y = held_out_windows(tok, max_windows=windows)
    rows = {}
    for label, q, qcfg in schemes or gptq_schemes():
        t0 = time.perf_counter()
        m, report = quantize_model(net, q, qcfg, tok) if q else (net, None)
        seconds = time.perf_counter() - t0 if q else 0.0
        loss = pool_loss(m, x, y)
        rows[label] = {"loss": loss, "perplexity": math.exp(loss), "quant_seconds": seconds}
        if report and "output_error" in report:                    # GPTQ: mean output error ratio to RTN's
            errs = report["output_error"].values()
            rows[label]["output_error_vs_rtn"] = sum(e["gptq"] / e["rtn"] for e in errs) / len(errs)
    base = rows[next(iter(rows))]
    for r in rows.values():
        r["delta_ppl"] = r["perplexity"] / base["perplexity"] - 1
    return {"bench": "gptq", "model": str(model), "windows": int(x.shape[0]), "threads": torch.get_num_threads(),
            "runs": rows}


def print_table(res: dict):
    print(f"{res['model']}: {res['windows']} held-out windows of 256; {res['threads']} threads")
    print(f"{'scheme':<22}{'ppl':>9}{'d ppl':>9}{'quant s':>9}{'out err / RTN':>15}")
    for label, r in res["runs"].items():
        ratio = r.get("output_error_vs_rtn")
        print(f"{label:<22}{r['perplexity']:>9.3f}{r['delta_ppl']:>+9.2%}{r['quant_seconds']:>9.1f}"
              + (f"{ratio:>15.2f}" if ratio is not None else f"{'':>15}"))


# ---------------------------------------------------------------------------- python -m minillm bench gptq
def add_parser(sub):
    """`bench gptq`: its options, and run_cli to run it."""
    p = sub.add_parser("gptq", help="GPTQ beside round-to-nearest int4 and AWQ at g32 and g128: delta perplexity, "
                                    "quantization time")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--windows", type=int, default=25, help="held-out windows of 256 tokens for perplexity")
    p.add_argument("--quick", action="store_true",
                   help="1 window, g128 only, GPTQ on 256 calibration tokens, no AWQ or act-order: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    quick = [(label, q, dict(cfg, calibration_tokens=256) if q == "gptq" else cfg)
             for label, q, cfg in gptq_schemes((128,), act_order=False) if q != "awq"]
    res = bench_gptq(a.model, a.tokenizer, 1 if a.quick else a.windows, quick if a.quick else None)
    print_table(res)
    return res
