"""Checkers for notebook 05_batching."""
from __future__ import annotations

from .common import checker


def _engine_static_steps(lengths, max_num_seqs) -> int:
    """Model calls the engine makes to serve these output lengths under static batching, all arriving at once."""
    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    llm = LLM("random:tiny", batching="static", max_num_seqs=max_num_seqs, max_model_len=64)
    llm.generate([[1, 300 + i] for i in range(len(lengths))],
                 [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths])
    return len(llm.engine.trace.steps)


@checker
def check_static_steps(fn):
    """fn(output_lengths: list[int], max_num_seqs) -> model calls to serve them with static batching"""
    for lengths, B in [([3, 1, 7, 2], 2), ([5], 4), ([1, 1, 9, 2, 4], 3), ([4, 4, 4], 1)]:
        want = _engine_static_steps(lengths, B)
        got = fn(list(lengths), B)
        assert got == want, f"lengths {lengths}, max_num_seqs {B}: got {got}, the engine made {want} model calls"
    return "matches the engine: each batch of max_num_seqs runs as long as its longest request"


@checker
def check_latency_metrics(fn):
    """fn(arrival_time, token_times: list) -> (ttft, tpot); tpot is None for a single token"""
    cases = [(0.5, [0.9, 1.0, 1.2, 1.3]), (2.0, [2.25]), (0.0, [0.1, 0.4])]
    for arrival, times in cases:
        ttft, tpot = fn(arrival, list(times))
        want_tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        assert abs(ttft - (times[0] - arrival)) < 1e-12, \
            f"arrival {arrival}, tokens at {times}: TTFT {ttft}, expected {times[0] - arrival}"
        assert (tpot is None) == (want_tpot is None) and (tpot is None or abs(tpot - want_tpot) < 1e-12), \
            f"tokens at {times}: TPOT {tpot}, expected {want_tpot}"
    return "TTFT = first token - arrival; TPOT = mean gap between later tokens (as minillm.bench.serve)"


# ---------------------------------------------------------------- core: the reader's batching policy in the engine
# A small version of the notebook's workload (log-normal prompt and output lengths, Poisson arrivals, counted in
# engine steps here) served by the hash model (minillm.labs.hashmodel, greedy: exact outputs, no real model) with a
# token budget smaller than most prompts and a pool small enough to preempt: every rule of the policy is exercised.
BUDGET, POOL_TOKENS = 16, 64


def _policy_engine(policy):
    from ..config import EngineConfig
    from ..engine.engine import LLMEngine
    from .hashmodel import HashModel, IdTokenizer
    model = HashModel()
    per_token = model.config.kv_bytes_per_token(8)
    cfg = EngineConfig(dtype="float64", block_size=4, max_model_len=64, max_num_seqs=4, enable_chunked_prefill=True,
                       max_num_batched_tokens=BUDGET, kv_cache_bytes=POOL_TOKENS * per_token, preemption_mode="swap",
                       swap_bytes=POOL_TOKENS * per_token)
    return LLMEngine.from_model(model, IdTokenizer(), cfg, policy=policy)


class _Recorder:
    """Wraps a policy: at each schedule(), the queues as the policy found them and the rows it chose
    [(seq id, tokens)], sorted (the order of rows in a batch does not matter)."""

    def __init__(self, inner):
        self.inner, self.steps = inner, []
        self.name, self.pads = getattr(inner, "name", "policy"), getattr(inner, "pads", False)

    def schedule(self, sched):
        from ..core.batch import ScheduledBatch
        from ..core.sequence import Status
        running = [s for s in sched.running if s.status is Status.RUNNING]
        before = dict(budget=sched.budget, waiting=[s.seq_id for s in sched.waiting],
                      decoding=[s.seq_id for s in running if len(s) - s.num_computed == 1],
                      prompt_left={s.seq_id: len(s) - s.num_computed for s in list(sched.waiting) + running})
        batch = self.inner.schedule(sched)
        before["swapped_after"] = len(sched.swapped)   # a decode may preempt (swap out) someone: then admit no one
        assert isinstance(batch, ScheduledBatch), \
            f"schedule() must return a ScheduledBatch, got {type(batch).__name__} {batch!r:.60}"
        self.steps.append((before, sorted((r.seq.seq_id, r.end - r.start + r.lookahead) for r in batch.rows)))
        return batch


def _serve(policy, workload):
    """Feed the workload by arrival step; -> (recorded steps, {request: token ids}, the error that stopped it)."""
    from ..core.sampling import SamplingParams
    rec = _Recorder(policy)
    engine = _policy_engine(rec)
    pending, outs, step, error = list(workload), {}, 0, None
    try:
        while pending or engine.has_unfinished_requests():
            while pending and pending[0][0] <= step:
                _, prompt, n = pending.pop(0)
                engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            engine.step()
            outs.update((o.request_id, o.outputs[0].token_ids) for o in engine.pop_finished())
            step += 1
            if step > 400:
                raise AssertionError(f"after {step} steps requests are still unfinished: some never get scheduled")
    except NotImplementedError:
        raise
    except AssertionError as e:
        error = f"step {step}: {e}"
    except Exception as e:
        error = f"step {step}: the engine raised {type(e).__name__}: {e}"
    return rec.steps, outs, error


def _workload():
    """[(arrival step, prompt ids, max_tokens)]: make_workload's lengths and Poisson arrivals, 1 request / 2 steps."""
    from ..workload import make_workload
    from .hashmodel import V
    wl = make_workload(16, V, rate=0.5, prompt_median=20, output_median=8, output_sigma=0.8, max_len=64, seed=5)
    return [(int(r.arrival - wl[0].arrival), r.prompt_ids, r.max_tokens) for r in wl]


def _step_difference(i, before, mine, ref) -> str:
    """Why the reader's step i differs from the reference policy's (both found the same queues)."""
    budget, waiting, decoding = before["budget"], before["waiting"], before["decoding"]
    got, want = dict(mine), dict(ref)
    used = sum(got.values())
    prompt = {s: n for s, n in got.items() if s not in decoding}
    if used > budget:
        whole = [s for s in prompt if s in waiting and got[s] == before["prompt_left"][s] and got[s] > budget]
        return (f"step {i}: {used} tokens scheduled, over the budget of {budget} tokens per step "
                f"(max_num_batched_tokens)" + (f"; sequence {whole[0]}'s whole prompt was admitted: "
                                                f"admit(..., chunk=True) cuts it to the budget" if whole else ""))
    missing = [s for s in decoding if s not in got]
    if missing and prompt:
        return (f"step {i}: running sequence(s) {missing} got no decode token while {sum(prompt.values())} prompt "
                f"tokens were scheduled: decodes go first (one token each), prompts get what is left of the budget")
    admitted = [s for s in got if s in waiting]
    if admitted != waiting[:len(admitted)]:
        return (f"step {i}: admitted {admitted} from the waiting queue {waiting}: admit the oldest first, and stop at "
                f"the first that does not fit")
    if admitted and before["swapped_after"]:
        return (f"step {i}: admitted {admitted} although {before['swapped_after']} preempted sequence(s) wait in "
                f"sched.swapped to come back: admit nothing new until they are back")
    if used < sum(want.values()):
        for s, n in want.items():
            if s in waiting and s not in got:
                return (f"step {i}: sequence {s} was waiting and fit ({budget - used} tokens of the budget left), but "
                        f"was not admitted: admit waiting requests (chunk=True) while budget remains")
            if got.get(s, 0) < n:
                return (f"step {i}: sequence {s} computed {got.get(s, 0)} prompt tokens; the budget left room for "
                        f"{n}: a prompt is cut to what is left of the budget, not skipped")
    fmt = lambda rows: ", ".join(f"seq {s}: {n}" for s, n in rows) or "nothing"  # noqa: E731
    return f"step {i}: your batch ({fmt(mine)} tokens) differs from the reference policy's ({fmt(ref)})"


@checker(kind="core", allow=("minillm.core.batch.ScheduledBatch", "minillm.core.policies.SchedulingPolicy",
                             "minillm.core.sequence.Status"))
def check_chunked_policy(policy):
    """policy: a SchedulingPolicy class with schedule(sched) -> ScheduledBatch: continuous batching
    with a token budget (chunked prefill). Plugged into the engine (policy=...) on a small version of the notebook's
    workload; each step's batch must equal the reference policy's (minillm.core.policies.Chunked), and so must
    every request's tokens."""
    from ..core.policies import Chunked
    workload = _workload()
    ref_steps, ref_outs, ref_error = _serve(Chunked(), workload)
    assert ref_error is None, f"the reference policy failed: {ref_error}"
    steps, outs, error = _serve(policy(), workload)                  # a fresh object
    for i, ((before, mine), (_, ref)) in enumerate(zip(steps, ref_steps)):
        if mine != ref:
            raise AssertionError(_step_difference(i, before, mine, ref))
    assert error is None, error
    assert len(steps) == len(ref_steps), f"{len(steps)} steps, the reference policy took {len(ref_steps)}"
    assert outs == ref_outs, "same steps as the reference policy but other tokens"
    most = max(sum(n for _, n in rows) for _, rows in steps)
    return (f"{len(workload)} requests, {len(steps)} steps, the same batch as the reference policy at every step "
            f"(at most {most} of {BUDGET} budget tokens; decodes first, then prompt chunks, oldest first) and the "
            f"same tokens")
