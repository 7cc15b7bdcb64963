"""The capstone (notebook 16, `python -m minillm bench serve --score`): serve one fixed trace under a KV memory budget
and an SLO, with any of the engine's techniques switched on, scored by goodput (requests that meet the SLO per second).

    the trace   seeded; two client classes: "chat" (a shared 96-token system prompt, a short question, answers
                from a bounded Pareto: most short, a few long) and "docs" (a long document behind a shared 32-token
                instruction, a short answer)
    the budget  the KV pool holds 4 sequences of max_model_len at float32 (what a contiguous cache serves at once)
    the clock   simulated: each model call costs what RooflineCost says on a Machine (fixed: REFERENCE, shipped,
                so that a class's scores compare across laptops; or this machine's: Machine.calibrate)
    the SLO     per class, 5x the median TTFT and TPOT of its requests on the reference engine (every technique on,
                STEPS) with nothing else running (its prefix cache warm: the class's shared prefix is not recomputed)
    the load    arrivals at 0.9x the plain engine's capacity (requests per second with every request queued at
                once): the plain engine is close to full, so its queues, not its speed, decide the SLO
    the plain   FCFS, a contiguous KV cache (block_size = max_model_len), no chunked prefill, no prefix caching,
    engine      float32 weights and KV, no speculation: the engine of notebook 02

Every token is computed for real (speculation's acceptance and prefix caching's hits are the engine's own); only
time is modelled, so the same configuration gets the same score on any machine, busy or not.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import numpy as np

from ..core.batch import ScheduledBatch
from ..spec_decode.draft_model import DraftProposer
from ..workload import Request, merge, pareto_lengths, sched_metrics
from ..workload.arrivals import lognormal_lengths
from .replay import replay

MAX_MODEL_LEN = 512
SLO_SCALE = 5.0           # the SLO: this many times the unloaded TTFT and TPOT
LOAD = 0.9                # arrivals at this fraction of the plain engine's capacity
FIXED = ("kv_cache_bytes", "max_model_len", "trace", "seed")   # the task's: a configuration may not change them
PLAIN = dict(block_size=MAX_MODEL_LEN, scheduling_policy="fcfs", enable_chunked_prefill=False,
             enable_prefix_caching=False, max_num_seqs=32)


# ---------------------------------------------------------------------------- the clock
@dataclass(frozen=True)
class Machine:
    """What a model call costs on a machine: a fixed overhead, and the roofline's two rates."""
    bandwidth: float          # bytes per second read from memory
    flops: float              # floating-point operations per second (matmuls)
    overhead_s: float         # per model call: Python, dispatch, sampling
    source: str = "given"

    @classmethod
    def calibrate(cls, model, tokenizer) -> "Machine":
        """This machine as the engine sees it: notebook 05's step cost fitted here (StepCost.calibrate: decode steps
        at batch 1, 4, 16 and prefills, about a second), read as a roofline. Its per-token term is the matmuls'
        effective rate, F = 2 params / token_s; a batch-1 decode step beyond the overhead reads every weight once,
        B = weight bytes / (row_s + token_s). Effective rates, not the hardware's peaks: the engine's kernels and
        Python are in them, so the simulated clock keeps to the wall clock's scale."""
        from .step_cost import StepCost
        cost = StepCost.calibrate(model, tokenizer)
        weights = sum(t.numel() * t.element_size() for t in model.parameters() if t.numel() > 1024)
        return cls(weights / (cost.row_s + cost.token_s), 2 * model.config.num_params() / cost.token_s,
                   cost.overhead_s, "calibrated on this machine (StepCost)")


REFERENCE = Machine(bandwidth=20e9, flops=60e9, overhead_s=0.6e-3, source="fixed: the capstone's reference laptop")


class RooflineCost:
    """seconds(step) = overhead + max(weight bytes / bandwidth, FLOPs / flops) + KV bytes read / bandwidth, plus
    each draft call of a draft model priced the same way. The engine's own weights and KV pool set the bytes, so
    int8 weights, an int8 KV cache and a smaller draft model each change what a step costs."""

    def __init__(self, machine: Machine, weight_bytes: int, params: int, kv_bytes_per_token: float,
                 draft: tuple = (0, 0)):
        self.machine, self.weight_bytes, self.params = machine, weight_bytes, params
        self.kv_bytes_per_token, (self.draft_bytes, self.draft_params) = kv_bytes_per_token, draft

    @classmethod
    def for_engine(cls, machine: Machine, engine) -> "RooflineCost":
        model, kv = engine.model, engine.kv
        weight_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]
                           if t.numel() > 1024)                     # the linears and the embedding, not tables
        draft = (0, 0)
        if isinstance(engine.proposer, DraftProposer):
            n = engine.proposer.runner.model.config.num_params()
            draft = (4 * n, n)                                     # the draft runs in float32
        return cls(machine, weight_bytes, model.config.num_params(), kv.nbytes / (kv.num_blocks * kv.block_size),
                   draft)

    def call(self, weight_bytes: int, params: int, tokens: int, context: int) -> float:
        m = self.machine
        return (m.overhead_s + max(weight_bytes / m.bandwidth, 2 * params * tokens / m.flops)
                + context * self.kv_bytes_per_token / m.bandwidth)

    def __call__(self, batch: ScheduledBatch) -> float:
        rows = batch.rows
        tokens = sum(max(1, r.end - r.start) + r.lookahead for r in rows)
        context = sum(r.end + r.lookahead for r in rows)             # positions each row's attention reads
        seconds = self.call(self.weight_bytes, self.params, tokens, context)
        k = max((r.lookahead for r in rows), default=0)
        if k and self.draft_params:                                  # the draft model's k calls for this step
            seconds += k * self.call(self.draft_bytes, self.draft_params, len(rows), context)
        return seconds


# ---------------------------------------------------------------------------- the trace
def trace(vocab_size: int, n_chat: int = 48, n_docs: int = 12, seed: int = 16, system_len: int = 96,
          preamble_len: int = 32, doc_median: float = 280) -> list[Request]:
    """The two client classes, arrivals at 1 per second (replay scales them: at_load); a request's `client` names
    its class, and docs have priority 1 (chat first, where an order reads priorities)."""
    rng = np.random.default_rng(seed)
    system = [1] + rng.integers(259, vocab_size, size=system_len - 1).tolist()
    preamble = [1] + rng.integers(259, vocab_size, size=preamble_len - 1).tolist()
    chat = [Request(float(t), system + rng.integers(259, vocab_size, size=int(q)).tolist(), int(o), "chat", 0)
            for t, q, o in zip(np.cumsum(rng.exponential(1.0, n_chat)), lognormal_lengths(rng, n_chat, 16, 0.5, 4, 48),
                               pareto_lengths(rng, n_chat, 1.1, 8, 240))]
    docs = [Request(float(t), preamble + rng.integers(259, vocab_size, size=int(d)).tolist(), int(o), "docs", 1)
            for t, d, o in zip(np.cumsum(rng.exponential(n_chat / n_docs, n_docs)),
                               lognormal_lengths(rng, n_docs, doc_median, 0.3, 120, 400),
                               lognormal_lengths(rng, n_docs, 12, 0.4, 4, 32))]
    return merge(chat, docs)


def at_load(workload: list[Request], rate: float) -> list[Request]:
    """The trace with its arrivals scaled to `rate` requests per second (the order and gaps' shape kept)."""
    span = workload[-1].arrival - workload[0].arrival
    scale = (len(workload) - 1) / rate / span
    return [replace(r, arrival=(r.arrival - workload[0].arrival) * scale) for r in workload]


# ---------------------------------------------------------------------------- the SLO and the score
def kv_budget(model) -> int:
    return 4 * MAX_MODEL_LEN * model.config.kv_bytes_per_token(4)


def unloaded(cost: RooflineCost, r: Request, cached: int = 0) -> tuple[float, float]:
    """(TTFT, TPOT) of r alone on an engine priced by cost: its prompt in one call (less `cached` tokens its prefix
    cache holds), then one call per token."""
    p = len(r.prompt_ids)
    ttft = cost.call(cost.weight_bytes, cost.params, p - cached, p)
    tpot = cost.call(cost.weight_bytes, cost.params, 1, p + r.max_tokens // 2)
    return ttft, tpot


def shared_prefix(workload: list, client: str) -> int:
    """The tokens every request of a class starts with (its system prompt or instruction)."""
    prompts = [r.prompt_ids for r in workload if r.client == client]
    n = min(map(len, prompts))
    return next((i for i in range(n) if len({p[i] for p in prompts}) > 1), n)


@dataclass
class Setup:
    """Everything a score is measured against: the trace at its load, the SLO per class, the plain engine's run."""
    workload: list
    slo: dict                 # class -> (TTFT seconds, TPOT seconds)
    capacity: float           # the plain engine's requests started per second, all queued at once
    rate: float               # arrivals per second: LOAD x capacity
    machine: Machine


def setup(model, tokenizer, machine: Machine = REFERENCE, **trace_options) -> Setup:
    """Price the plain engine on this machine: its capacity (one replay with every request queued at t = 0) and
    its unloaded TTFT and TPOT per class (from the cost model, one request at a time)."""
    base = trace(model.config.vocab_size, **trace_options)
    ref, block = _engine_cost(model, tokenizer, machine, REFERENCE_OPTIONS), REFERENCE_OPTIONS["block_size"]
    slo = {}
    for c in sorted({r.client for r in base}):
        cached = shared_prefix(base, c) // block * block                    # whole blocks of its shared prefix
        ttft, tpot = zip(*(unloaded(ref, r, cached) for r in base if r.client == c))
        slo[c] = (SLO_SCALE * statistics.median(ttft), SLO_SCALE * statistics.median(tpot))
    _, _, outs = _replay(model, tokenizer, [replace(r, arrival=0.0) for r in base], machine, {})
    capacity = len(base) / max(o.metrics.first_token_time for o in outs)    # admitted per second while saturated:
                                                                           # the drain after the last admission
                                                                           # (a few long answers) is not capacity
    return Setup(at_load(base, LOAD * capacity), slo, capacity, LOAD * capacity, machine)


def serve_all_at_once(model, tokenizer, options: dict | None = None, machine: Machine | None = None) -> float:
    """Seconds to serve the whole trace queued at once (the capacity measurement), on machine's clock, or on the
    wall clock (machine None): the one check of the simulated clock against the real one."""
    queued = [replace(r, arrival=0.0) for r in trace(model.config.vocab_size)]
    _, _, outs = _replay(model, tokenizer, queued, machine, options or {})
    return max(o.metrics.finished_time for o in outs)


def _engine_cost(model, tokenizer, machine, options) -> RooflineCost:
    from ..config import EngineConfig
    from ..engine.engine import LLMEngine
    engine = LLMEngine.from_model(model, tokenizer, EngineConfig(**_options(model, options)))
    return RooflineCost.for_engine(machine, engine)


def _options(model, options: dict) -> dict:
    return {**PLAIN, "max_model_len": MAX_MODEL_LEN, "kv_cache_bytes": kv_budget(model), "trace": True, **options}


def _replay(model, tokenizer, workload, machine, options, policy=None):
    """machine None: the wall clock times every step, as it happens."""
    cost = _Bound(machine) if machine is not None else None
    return replay(model, tokenizer, workload, return_engine=True, step_cost=cost, policy=policy,
                  **_options(model, options))


class _Bound:
    """A step cost that prices with the engine replay built (RooflineCost.for_engine on its first call)."""

    def __init__(self, machine: Machine):
        self.machine, self.cost = machine, None

    def bind(self, engine):
        self.cost = RooflineCost.for_engine(self.machine, engine)

    def __call__(self, batch) -> float:
        return self.cost(batch)


def score(model, tokenizer, options: dict | None = None, policy=None, setup_: Setup | None = None,
          label: str = "", wall_clock: bool = False) -> dict:
    """One configuration (EngineConfig options over the plain engine's, and optionally a scheduling policy object)
    served on the capstone's trace -> goodput, SLO attainment, p99 latencies, peak KV bytes, per class.
    wall_clock: time the steps as they happen instead of by the setup's machine (one check, not a score)."""
    fixed = sorted(set(options or {}) & set(FIXED))
    if fixed:
        raise ValueError(f"{fixed}: the KV budget, the context and the trace are the capstone's, not a configuration's")
    s = setup_ or setup(model, tokenizer)
    res, engine, outs = _replay(model, tokenizer, s.workload, None if wall_clock else s.machine, options or {},
                                policy)
    per_class, good = {}, 0
    by_id = sorted(s.workload, key=lambda r: r.arrival)
    for c, (ttft_slo, tpot_slo) in s.slo.items():
        mine = [o for o in outs if by_id[int(o.request_id)].client == c]
        m = sched_metrics(mine, s.workload, ttft_slo, tpot_slo)
        met = round(m["slo_attained"] * len(mine))
        good += met
        per_class[c] = {"requests": len(mine), "met_slo": met, "ttft_p99": m["ttft_p99"], "tpot_p99": m["tpot_p99"]}
    steps = engine.trace.steps
    return {"label": label or _describe(options, policy), "goodput": good / res.seconds,
            "slo_attained": good / len(outs), "seconds": res.seconds, "throughput": res.throughput,
            "ttft_p99": res.ttft_p99, "tpot_p99": res.tpot_p99,
            "peak_kv_bytes": max(st.kv_bytes_filled for st in steps), "preemptions": res.preemptions,
            "cached_tokens": res.cached_tokens, "per_class": per_class, "options": dict(options or {})}


def _describe(options, policy) -> str:
    parts = [f"{k}={v}" for k, v in (options or {}).items()] + ([type(policy).__name__] if policy is not None else [])
    return ", ".join(parts) or "plain"


# ---------------------------------------------------------------------------- the reference answer, one step at a time
STEPS = [("paged KV (block 16)", dict(block_size=16)),
         ("+ prefix caching", dict(enable_prefix_caching=True)),
         ("+ chunked prefill", dict(enable_chunked_prefill=True, max_num_batched_tokens=256)),
         ("+ int8 KV cache", dict(kv_cache_dtype="int8")),
         ("+ int8 weights", dict(quantization="int8")),
         ("+ priority order", dict(scheduling_policy="priority"))]


def waterfall(model, tokenizer, setup_: Setup | None = None, steps=STEPS, plain: dict | None = None) -> list[dict]:
    """The plain engine (its score, if already measured), then each technique switched on over the ones before (the
    reference configuration is the last): what each adds to goodput, peak KV memory and p99 latency."""
    s = setup_ or setup(model, tokenizer)
    out, options = [plain or score(model, tokenizer, {}, setup_=s, label="plain")], {}
    for label, extra in steps:
        options = {**options, **extra}
        out.append(score(model, tokenizer, options, setup_=s, label=label))
    return out


REFERENCE_OPTIONS = {k: v for _, extra in STEPS for k, v in extra.items()}


# ---------------------------------------------------------------------------- a student's policy, and the report
def load_policy(path: str, options: dict, model):
    """A student's policy file -> the scheduling policy it makes. The file defines `order()` -> an Order (notebook
    11's seam: who comes first) or `policy(config)` -> a SchedulingPolicy (notebook 05's). ValueError naming the
    file and what went wrong: no such file, neither function, or one that raises."""
    import importlib.util
    import os

    from ..config import EngineConfig
    from ..core.order import Order
    from ..core.policies import batching_policy
    if not os.path.isfile(path):
        raise ValueError(f"--policy {path}: no such file")
    try:
        spec = importlib.util.spec_from_file_location("capstone_policy", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = EngineConfig(**_options(model, options))
        if hasattr(module, "policy"):
            return module.policy(config)
        if hasattr(module, "order"):
            order = module.order()
            if not isinstance(order, Order):
                raise TypeError(f"order() returned a {type(order).__name__}, not a minillm.core.order.Order")
            return batching_policy(replace(config, scheduling_policy="fcfs"), order)
    except Exception as e:
        raise ValueError(f"--policy {path}: {type(e).__name__}: {e}") from None
    raise ValueError(f"--policy {path}: defines neither order() (an Order) nor policy(config) (a SchedulingPolicy)")


def report(model, tokenizer, options: dict | None = None, policy_file: str | None = None,
           machine: Machine = REFERENCE) -> dict:
    """`bench serve --score`: the configuration's goodput beside the plain engine's and the reference
    configuration's, on the same trace, budget, SLO and clock. A policy that raises inside the engine is graded
    "fail: <reason>", as the labs grade a student's code."""
    options = dict(options or {})
    s = setup(model, tokenizer, machine)
    plain = score(model, tokenizer, {}, setup_=s, label="plain FCFS")
    ref = score(model, tokenizer, REFERENCE_OPTIONS, setup_=s, label="reference")
    out = {"bench": "serve --score", "machine": vars(machine), "capacity": s.capacity, "rate": s.rate,
           "slo": {c: {"ttft": a, "tpot": b} for c, (a, b) in s.slo.items()}, "plain": plain, "reference": ref,
           "reference_vs_plain": ratio(ref["goodput"], plain["goodput"])}
    try:
        policy = load_policy(policy_file, options, model) if policy_file else None
        mine = score(model, tokenizer, options, policy, setup_=s, label="yours")
    except Exception as e:                      # a bad option or a policy that breaks: graded, not a traceback
        out.update(yours={"label": "yours", "fail": f"{type(e).__name__}: {e}"}, score=0.0, verdict=f"fail: {e}")
        return out
    out.update(yours=mine, score=mine["goodput"], vs_plain=ratio(mine["goodput"], plain["goodput"]),
               vs_reference=ratio(mine["goodput"], ref["goodput"]),
               verdict="pass" if mine["goodput"] >= ref["goodput"] else "below the reference")
    return out


def ratio(a: float, b: float):
    """a / b, or None where b is 0 (the plain engine may meet no SLO at all: JSON has no infinity)."""
    return a / b if b > 0 else None


def times(x) -> str:
    return "inf" if x is None else f"{x:.2f}x"


def print_report(res: dict):
    def line(r):
        return (f"{r['label']:12s} goodput {r['goodput']:6.2f} req/s  SLO met {r['slo_attained']:5.1%}  "
                f"TTFT p99 {r['ttft_p99'] * 1e3:6.0f} ms  TPOT p99 {r['tpot_p99'] * 1e3:5.1f} ms  "
                f"peak KV {r['peak_kv_bytes'] / 2**20:5.1f} MiB")
    m = res["machine"]
    print(f"capstone trace at {res['rate']:.1f} req/s (0.9x the plain engine's {res['capacity']:.1f}); clock: "
          f"{m['bandwidth'] / 1e9:.0f} GB/s, {m['flops'] / 1e9:.0f} GFLOP/s, {m['overhead_s'] * 1e3:.1f} ms per call "
          f"({m['source']})")
    print("SLO: " + ", ".join(f"{c} TTFT <= {v['ttft'] * 1e3:.0f} ms and TPOT <= {v['tpot'] * 1e3:.1f} ms"
                              for c, v in res["slo"].items()))
    for key in ("plain", "reference"):
        print(line(res[key]))
    if "fail" in res["yours"]:
        print(f"yours        fail: {res['yours']['fail']}")
    else:
        print(line(res["yours"]))
        print(f"score {res['score']:.2f} req/s: {times(res['vs_plain'])} plain, {times(res['vs_reference'])} the "
              f"reference ({res['verdict']})")
