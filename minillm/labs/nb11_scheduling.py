"""Checkers for notebook 11_scheduling_policies."""
from __future__ import annotations

import math

from .common import checker


@checker
def check_goodput(fn):
    """fn(ttfts, tpots, slo_ttft, slo_tpot, seconds) -> requests per second that met BOTH targets (a tpot of None:
    one output token, no gap to miss)"""
    from ..core.outputs import CompletionOutput, RequestOutput
    from ..core.sequence import RequestMetrics
    from ..workload import Request, sched_metrics
    cases = [([0.1, 0.5, 0.2, 0.05], [0.02, 0.01, None, 0.09], 0.3, 0.05, 2.0),
             ([1.0, 2.0, 0.1], [0.01, 0.01, 0.2], 0.5, 0.05, 4.0), ([0.2, 0.2, 0.2], [None, None, 0.2], 0.2, 0.1, 0.5)]
    wants, gots = [], []
    for ttfts, tpots, slo_ttft, slo_tpot, seconds in cases:
        outs, wl = [], []                               # the bench's own metric on the same requests
        for i, (a, b) in enumerate(zip(ttfts, tpots)):
            times = [a] if b is None else [a, a + b]
            m = RequestMetrics(0.0, 0.0, a, times, seconds if i == 0 else times[-1])
            outs.append(RequestOutput(str(i), None, [1], [CompletionOutput(0, "", [5] * len(times), "length")],
                                      True, m))
            wl.append(Request(0.0, [1], len(times)))
        wants.append(sched_metrics(outs, wl, slo_ttft, slo_tpot)["goodput"])
        got = fn(list(ttfts), list(tpots), slo_ttft, slo_tpot, seconds)
        assert isinstance(got, (int, float)), f"returned {got!r}, not a number of requests per second"
        gots.append(got)
    if all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(gots, wants)):
        return "requests meeting TTFT <= target AND TPOT <= target, per second (DistServe's goodput)"
    mistakes = {  # what a common mistake computes on every case, and what it is
        "counts requests meeting EITHER target; goodput needs both":
            lambda t, p, a, b, s: sum(1 for x, y in zip(t, p) if x <= a or (y or 0) <= b) / s,
        "is a count of requests; goodput is per second (divide by the run's seconds)":
            lambda t, p, a, b, s: sum(1 for x, y in zip(t, p) if x <= a and (y or 0) <= b),
        "drops the one-token requests (TPOT None): with no second token they miss no TPOT target":
            lambda t, p, a, b, s: sum(1 for x, y in zip(t, p) if x <= a and y is not None and y <= b) / s}
    for why, wrong in mistakes.items():
        if all(math.isclose(g, wrong(*c), rel_tol=1e-9) for g, c in zip(gots, cases)):
            raise AssertionError(f"your goodput {why} (TTFTs {cases[0][0]}, TPOTs {cases[0][1]}: got {gots[0]}, "
                                 f"expected {wants[0]})")
    i = next(i for i, (g, w) in enumerate(zip(gots, wants)) if not math.isclose(g, w, rel_tol=1e-9))
    t, p, a, b, s = cases[i]
    raise AssertionError(f"TTFTs {t}, TPOTs {p}, targets ({a}, {b}), {s} s: got {gots[i]}, expected {wants[i]}")


# ---------------------------------------------------------------- core: the reader's MLFQ order in the engine
# A small heavy-tailed workload (bounded-Pareto output lengths, Poisson arrivals counted in engine steps) served by
# the hash model (minillm.labs.hashmodel: greedy, exact outputs, no real model) with two seats, so that long
# requests hold every seat and a preemptive order has to make room.
QUANTUM, LEVELS = 2, 4


def _engine(policy, clock):
    from ..config import EngineConfig
    from ..engine.engine import LLMEngine
    from .hashmodel import HashModel, IdTokenizer
    model = HashModel()
    per_token = model.config.kv_bytes_per_token(8)
    cfg = EngineConfig(dtype="float64", block_size=4, max_model_len=64, max_num_seqs=2, kv_cache_bytes=256 * per_token,
                       preemption_mode="swap", swap_bytes=256 * per_token)
    return LLMEngine.from_model(model, IdTokenizer(), cfg, clock=clock, policy=policy)


def _workload():
    """[(arrival step, prompt ids, max_tokens)]: 14 requests, about one every 3 steps, outputs 1 to 40 tokens."""
    from ..workload import heavy_tailed
    from .hashmodel import V
    wl = heavy_tailed(14, V, rate=0.35, prompt_median=5, output_lo=1, output_hi=40, alpha=0.7, max_len=64, seed=4)
    return [(int(r.arrival), r.prompt_ids, r.max_tokens) for r in wl]


def _serve(order, workload):
    """Feed the workload by arrival step -> (per step: the sorted ids that ran, {request: output}, error)."""
    from ..core.policies import Continuous
    from ..core.sampling import SamplingParams
    from .hashmodel import reference
    step = 0
    engine = _engine(Continuous(order), clock=lambda: float(step))     # time counted in engine steps
    pending, outs, error = list(workload), {}, None
    try:
        while pending or engine.has_unfinished_requests():
            while pending and pending[0][0] <= step:
                _, prompt, n = pending.pop(0)
                engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            engine.step()
            outs.update((o.request_id, o) for o in engine.pop_finished())
            step += 1
            assert step < 600, f"after {step} steps requests are still unfinished: some never get scheduled"
    except NotImplementedError:
        raise
    except AssertionError as e:
        error = f"step {step}: {e}"
    except Exception as e:
        error = f"step {step}: the engine raised {type(e).__name__}: {e}"
    for i, (_, prompt, n) in enumerate(workload):
        if str(i) in outs:
            assert outs[str(i)].outputs[0].token_ids == reference(prompt, n), \
                f"request {i}'s tokens changed: an order may change when a request runs, never what it computes"
    return [sorted(s.seq_ids) for s in engine.trace.steps], outs, error


def _seq(i, prompt_len, served, arrival):
    from ..core.sampling import SamplingParams
    from ..core.sequence import Sequence
    s = Sequence(i, str(i), 0, [1] + [7] * (prompt_len - 1), SamplingParams(max_tokens=64), 0, float(arrival))
    s.output_ids = [5] * served
    return s


def _check_levels(order):
    def want(n):                       # demoted after q, q + 2q, q + 2q + 4q ... tokens; capped at the last queue
        return min(LEVELS - 1, int(math.log2(n / QUANTUM + 1)))
    for n in (0, 1, 2, 3, 5, 6, 13, 14, 29, 30, 1000):
        got = order.level(n)
        assert isinstance(got, int) or hasattr(got, "__index__"), f"level({n}) returned {got!r}, not an integer"
        if got == want(n):
            continue
        assert got != min(n // QUANTUM, LEVELS - 1), \
            (f"level({n}) = {got}, expected {want(n)} (quantum {QUANTUM}): every queue's quantum is twice the one "
             f"before ({QUANTUM}, {2 * QUANTUM}, {4 * QUANTUM} tokens ...), so a request is demoted after "
             f"{QUANTUM}, {3 * QUANTUM}, {7 * QUANTUM} tokens served, not every {QUANTUM}")
        assert got < LEVELS, f"level({n}) = {got}: there are only {LEVELS} queues (0 .. {LEVELS - 1}); cap it"
        assert not (got < want(n) and n == QUANTUM * (2 ** want(n) - 1)), \
            (f"level({n}) = {got}, expected {want(n)}: a request that has been served its quantum exactly is "
             f"demoted (>=, not >)")
        raise AssertionError(f"level({n}) = {got}, expected {want(n)} (quantum {QUANTUM}, {LEVELS} queues)")


def _check_keys(order):
    a, b = _seq(4, 4, 1, 2.0), _seq(5, 4, 1, 3.0)                        # same level, a arrived first
    assert order.key(a) < order.key(b), \
        ("two requests in the same queue got keys that do not order them by arrival: end the key with "
         "self.tiebreak(seq) (arrival time, then id), so each queue is first come, first served")
    fresh, long_prompt = _seq(0, 2, 0, 1.0), _seq(1, 20, 0, 0.0)          # both served nothing: level 0
    assert order.key(long_prompt) < order.key(fresh), \
        ("key() ranks a request with a 20-token prompt and no output below a later one with a 2-token prompt: "
         "tokens served are output tokens (len(seq.output_ids)); the prompt is not service received")
    low, high = _seq(2, 4, 0, 5.0), _seq(3, 4, 2 * QUANTUM + 1, 0.0)     # level 0 (arrived later) and level 1
    assert order.key(low) < order.key(high), \
        ("key() ranks a request at level 1 before one at level 0: the less a request has been served, the "
         "higher its queue (lower level runs first), whatever its arrival")


@checker(kind="core", allow=("minillm.scheduling.orders.Order",))
def check_mlfq_order(order_cls):
    """order_cls: an Order class taking (quantum, levels), with level(served) and key(seq): a multi-level feedback
    queue that ranks requests by output tokens served (FastServe without skip-join or promotion). Its levels and
    keys are checked, then it runs the engine (Continuous(order_cls(...))) on a heavy-tailed workload: every step
    must run the same sequences as the engine's own MLFQ, and every request its own tokens."""
    from ..scheduling.orders import FCFS, MLFQ
    order = order_cls(quantum=QUANTUM, levels=LEVELS)                  # a fresh object
    _check_levels(order)
    _check_keys(order)
    assert getattr(order, "preemptive", False), \
        ("preemptive is False: a short request that arrives while long ones hold every seat waits behind them; "
         "an MLFQ preempts a lower queue for a higher one (preemptive = True)")
    workload = _workload()
    ref_steps, ref_outs, ref_error = _serve(MLFQ(levels=LEVELS, quantum=QUANTUM, prompt_weight=0.0,
                                                 starve_steps=10 ** 9), workload)
    assert ref_error is None, f"the reference order failed: {ref_error}"
    steps, outs, error = _serve(order_cls(quantum=QUANTUM, levels=LEVELS), workload)
    for i, (mine, ref) in enumerate(zip(steps, ref_steps)):
        assert mine == ref, f"step {i}: sequences {mine} ran, the engine's MLFQ ran {ref}"
    assert error is None, error
    assert len(steps) == len(ref_steps), f"{len(steps)} steps, the engine's MLFQ took {len(ref_steps)}"
    fcfs_steps, fcfs_outs, _ = _serve(FCFS(), workload)

    def mean_jct(o):                 # in engine steps (the clock these engines run on)
        return sum(x.metrics.finished_time - x.metrics.arrival_time for x in o.values()) / len(o)
    preempted = sum(o.metrics.num_preemptions for o in outs.values())
    return (f"{len(workload)} requests, {len(steps)} steps, the same sequences as the engine's MLFQ at every step "
            f"({preempted} preemptions) and the same tokens; mean JCT {mean_jct(outs):.1f} steps against FCFS's "
            f"{mean_jct(fcfs_outs):.1f}")
