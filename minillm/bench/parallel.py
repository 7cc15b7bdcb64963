"""`python -m minillm bench parallel`: tensor (TP=2) and pipeline (PP=2) parallelism against one rank, on this CPU.

    decode      tokens/s at batch 1 and 8, greedy, the engine's decode steps only (its trace), one torch thread per
                rank (one rank included), configurations interleaved, the median of the repeats
    bytes       payload bytes per token handed to each collective in a decode step (minillm.parallel.comm counts
                them) beside the formula (minillm.parallel.accounting)
    loopback    the bytes the OS counted on lo during a TP prefill of 512 tokens beside the payloads times each
                algorithm's wire factor (ring all-reduce: 2 (p - 1))
    bubble      a PP prefill (8 prompts) in m = 1, 2, 4, 8 micro-batches: each rank's idle fraction, from the ranks'
                timeline, beside GPipe's (p - 1) / (m + p - 1), and the step's time beside one rank's
    GPU         the measured bytes per token at NVLink ~450 GB/s and PCIe 4.0 ~25 GB/s per direction (assumed
                bandwidths; latency, ~5-10 us per NCCL all-reduce, not included)

On two cores the ranks share the machine with everything else: TP pays a round trip through the kernel per
all-reduce (16 per decode step for the shipped model), and a speedup needs both cores free. Numbers vary from
run to run; ratios are measured side by side in one run.
"""
from __future__ import annotations

import statistics
import time

import torch

BATCHES = (1, 8)
MICRO_BATCHES = (1, 2, 4, 8)


def bench_parallel(model: str = "shakespeare", quick: bool = False) -> dict:
    from ..formats.loader import load
    from ..parallel import start_group
    group = start_group(2)                    # one torch thread per rank from here on, rank 0 (this process) too
    net, tok = load(model, None, "float32", 0)
    res = {"bench": "parallel", "model": model, "quick": quick, "ranks": group.world,
           "threads_per_rank": torch.get_num_threads()}
    res["decode"] = decode_rates(model, steps=8 if quick else 48, repeats=1 if quick else 5,
                                 max_model_len=64 if quick else 256)
    res["bytes_per_token"] = bytes_per_token(net, group, repeats=2 if quick else 5)
    res["loopback"] = loopback_check(net, group, T=64 if quick else 128)
    res["bubble"] = bubble_table(net, group, T=16 if quick else 64, repeats=1 if quick else 5)
    res["gpu_projection"] = gpu_projection(res["bytes_per_token"], group.world)
    return res


# ---------------------------------------------------------------------------- decode tokens/s
def decode_rates(model: str, steps: int, repeats: int, max_model_len: int = 256) -> dict:
    """Greedy decode tok/s per configuration and batch size: decode steps' tokens over their seconds (prefill
    excluded), the median of `repeats` runs, configurations interleaved so that load changes hit each alike."""
    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    configs = {"one rank": {}, "TP=2": {"tensor_parallel_size": 2}, "PP=2": {"pipeline_parallel_size": 2}}
    engines = {name: LLM(model, backend="torch", max_model_len=max_model_len, **kw) for name, kw in configs.items()}
    sp = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    out = {}
    for B in BATCHES:
        prompts = [[1] + [(37 * i + 11 * j) % 4000 + 10 for j in range(8)] for i in range(B)]
        for llm in engines.values():
            llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2))        # warm-up
        rates = {name: [] for name in engines}
        for _ in range(repeats):
            for name, llm in engines.items():
                first = len(llm.engine.trace.steps)
                llm.generate(prompts, sp)
                dec = [s for s in llm.engine.trace.steps[first:] if s.kind == "decode"]
                rates[name].append(sum(s.num_decode_tokens for s in dec) / sum(s.seconds for s in dec))
        out[f"batch_{B}"] = {name: statistics.median(r) for name, r in rates.items()}
    return out


# ---------------------------------------------------------------------------- bytes per token
def _decode_step(cfg, B: int, M: int = 4, block_size: int = 16):
    """A decode step's inputs: B sequences with M blocks each, one new token at the end of their last block."""
    from ..llama.attention import AttentionMetadata
    pos = torch.full((B, 1), M * block_size - 1)                                  # (B, 1)
    attn = AttentionMetadata.build(pos, torch.arange(B * M).view(B, M), torch.full((B,), M * block_size), block_size)
    return torch.randint(0, cfg.vocab_size, (B, 1)), pos, attn, torch.arange(B)


def bytes_per_token(net, group, repeats: int = 5) -> dict:
    """Payload bytes per decoded token handed to each op (counted) beside the formula, TP and PP, B = 1 and 8; and
    from the ranks' timeline, rank 0's seconds computing and communicating in that step (the median of repeats)."""
    from ..parallel import PipelineParallelModel, TensorParallelModel, pp_step_bytes, tp_step_bytes
    cfg, out, M = net.config, {}, 4
    for kind, cls, formula in (("tensor", TensorParallelModel, tp_step_bytes),
                               ("pipeline", PipelineParallelModel, pp_step_bytes)):
        par = cls(net, group, kv_blocks=8 * M, block_size=16)
        out[kind] = {}
        for B in BATCHES:
            tokens, pos, attn, rows = _decode_step(cfg, B, M)
            par(tokens, pos, par.kv, attn, rows=rows)
            counted = group.comm.steps[-1]
            want = formula(cfg, group.world, B, 1, M, B, kv=True, elem=4)
            out[kind][f"batch_{B}"] = {op: {"counted": counted[op] / B, "formula": n / B} for op, n in want.items()}
            times = []
            for _ in range(repeats):
                with group.recording() as rec:
                    par(tokens, pos, par.kv, attn, rows=rows)
                mine = [e for e in rec.events if e.rank == 0]
                times.append((sum(e.seconds for e in mine if e.kind == "compute"),
                              sum(e.seconds for e in mine if e.kind != "compute")))
            out[kind][f"batch_{B}"]["rank0_step_s"] = {"compute": statistics.median(t[0] for t in times),
                                                       "communication": statistics.median(t[1] for t in times)}
        par.close()
    return out


# ---------------------------------------------------------------------------- what the OS counted
def loopback_check(net, group, B: int = 4, T: int = 128, repeats: int = 3) -> dict:
    """lo's tx bytes (every process's) during TP prefills beside the wire formula; the run with the fewest
    bytes counts (other processes' loopback traffic only adds)."""
    from ..parallel import TensorParallelModel, wire_bytes
    from ..parallel.accounting import loopback_bytes
    if loopback_bytes() is None:
        return {"skipped": "no /proc/net/dev with an 'lo' line (not Linux): the OS's loopback counters are unreadable"}
    tp = TensorParallelModel(net, group)
    tokens = torch.randint(0, net.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    best = None
    for _ in range(repeats):
        before = group.comm_stats()
        tx0 = loopback_bytes()[1]
        tp(tokens)
        group.comm_stats()                        # every rank has finished sending
        tx1 = loopback_bytes()[1]
        after = group.comm_stats()
        counted = [{op: a["totals"][op] - b["totals"][op] for op in a["totals"]} for a, b in zip(after, before)]
        run = {"tokens": B * T, "payload_bytes_rank0": sum(counted[0].values()),
               "expected_wire_bytes": wire_bytes(counted), "os_counted_tx_bytes": tx1 - tx0}
        run["ratio"] = run["os_counted_tx_bytes"] / run["expected_wire_bytes"]
        if best is None or run["os_counted_tx_bytes"] < best["os_counted_tx_bytes"]:
            best = run
    tp.close()
    return best


# ---------------------------------------------------------------------------- the pipeline bubble
def bubble_table(net, group, B: int = 8, T: int = 64, repeats: int = 5) -> list:
    """A PP prefill of B prompts of T tokens (logits of each prompt's last token) in m micro-batches: per rank the
    idle fraction of the step (its timeline), the median over repeats, beside (p - 1) / (m + p - 1); and the step's
    seconds beside one rank's forward of the same batch."""
    from ..parallel import PipelineParallelModel, bubble, gpipe_bubble
    tokens = torch.randint(0, net.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    rows = torch.arange(B) * T + T - 1
    pp = PipelineParallelModel(net, group)
    pp(tokens, rows=rows)                                                          # warm-up
    with torch.inference_mode():
        net(tokens, rows=rows)
    table = []
    for m in MICRO_BATCHES:
        pp.micro_batches = m
        idle, secs, one = {0: [], 1: []}, [], []
        for _ in range(repeats):
            with group.recording() as rec:
                t0 = time.perf_counter()
                pp(tokens, rows=rows)
                secs.append(time.perf_counter() - t0)
            for rank, f in bubble([e for e in rec.events if e.kind != "broadcast"]).items():
                idle[rank].append(f["idle_fraction"])
            t0 = time.perf_counter()
            with torch.inference_mode():
                net(tokens, rows=rows)
            one.append(time.perf_counter() - t0)
        table.append({"m": m, "formula": gpipe_bubble(group.world, m),
                      **{f"idle_rank{r}": statistics.median(v) for r, v in idle.items()},
                      "step_s": statistics.median(secs), "one_rank_s": statistics.median(one)})
    pp.close()
    return table


# ---------------------------------------------------------------------------- what a GPU link would take
def gpu_projection(per_token: dict, p: int) -> dict:
    """Seconds per decoded token (batch 8) to move the measured payloads over NVLink and PCIe, per rank: a ring
    all-reduce sends 2 (p - 1) / p of its payload from each rank, a ring all-gather (p - 1) shards; a pipeline
    stage sends its activations and the last one the logits."""
    from ..parallel.accounting import LINKS, link_seconds
    tp, pp = per_token["tensor"]["batch_8"], per_token["pipeline"]["batch_8"]
    tp_rank = 2 * (p - 1) / p * tp["all_reduce"]["counted"] + (p - 1) * tp["all_gather"]["counted"]
    pp_rank = max(pp["send"]["counted"], pp["recv"]["counted"])          # the busiest link: the logits coming back
    return {"assumptions": "bandwidth per direction per GPU: " + ", ".join(LINKS) + "; latency not included",
            "tensor": {"bytes_per_token_per_rank": tp_rank, "seconds": link_seconds(tp_rank)},
            "pipeline": {"bytes_per_token_per_rank": pp_rank, "seconds": link_seconds(pp_rank)}}


def print_report(res: dict):
    print(f"{res['model']} on {res['ranks']} gloo ranks, {res['threads_per_rank']} torch thread each"
          f"{' (--quick)' if res['quick'] else ''}")
    print("decode tok/s (median)   " + "".join(f"{name:>10}" for name in next(iter(res["decode"].values()))))
    for batch, rates in res["decode"].items():
        print(f"  {batch:<22}" + "".join(f"{r:>10.1f}" for r in rates.values()))
    print("payload bytes per decoded token: counted (formula)")
    for kind, batches in res["bytes_per_token"].items():
        for batch, ops in batches.items():
            t = ops["rank0_step_s"]
            print(f"  {kind:<8} {batch:<8} " + "  ".join(f"{op} {v['counted']:,.0f} ({v['formula']:,.0f})"
                                                       for op, v in ops.items() if op != "rank0_step_s") +
                  f"; rank 0: {t['compute'] * 1e3:.2f} ms computing, {t['communication'] * 1e3:.2f} ms communicating")
    lo = res["loopback"]
    if "skipped" in lo:
        print(f"loopback: skipped ({lo['skipped']})")
    else:
        print(f"loopback, TP prefill of {lo['tokens']} tokens: expected on the wire {lo['expected_wire_bytes']:,} "
              f"bytes, the OS counted {lo['os_counted_tx_bytes']:,} (x{lo['ratio']:.3f})")
    print(f"{'micro-batches':>14}{'GPipe bubble':>14}{'idle rank 0':>13}{'idle rank 1':>13}{'PP step ms':>12}"
          f"{'1 rank ms':>11}")
    for r in res["bubble"]:
        print(f"{r['m']:>14}{r['formula']:>14.2f}{r['idle_rank0']:>13.2f}{r['idle_rank1']:>13.2f}"
              f"{r['step_s'] * 1e3:>12.1f}{r['one_rank_s'] * 1e3:>11.1f}")
    g = res["gpu_projection"]
    print(f"GPU projection per decoded token at batch 8 ({g['assumptions']}):")
    for kind in ("tensor", "pipeline"):
        secs = "; ".join(f"{name.split(' (')[0]} {s * 1e6:.2f} us" for name, s in g[kind]["seconds"].items())
        print(f"  {kind:<8} {g[kind]['bytes_per_token_per_rank']:,.0f} bytes per rank: {secs}")


# ---------------------------------------------------------------------------- python -m minillm bench parallel
def add_parser(sub):
    """`bench parallel`: its options, and run_cli to run it."""
    p = sub.add_parser("parallel", help="tensor (TP=2) and pipeline (PP=2) parallelism vs one rank: decode tok/s, "
                                        "bytes per token per collective, loopback bytes, the pipeline bubble")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--quick", action="store_true", help="8 decode steps, 1 repeat, short prompts: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    res = bench_parallel(a.model, a.quick)
    print_report(res)
    return res
