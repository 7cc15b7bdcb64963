"""A fault anywhere in a step leaves nothing different (DESIGN.md "One path": a step is a transaction).

KeyboardInterrupt is raised at every statement boundary of what runs after the model call: the verdict
post-processors' before_update and on_update, Scheduler.update and everything of minillm's it calls (stop checks,
finish, the block manager, KV eviction), and the trace's record. A tracer (sys.settrace) raises it when a chosen
line of minillm's code is about to run in a step. After each fault the engine must be exactly as the step's
schedule left it (every queue, sequence, generator, block, prefix-cache name and trace counter compared), the
retried step runs clean, and at the end every output (tokens, text, finish reasons, logprobs) equals the
uninterrupted run's and every block is back. Seeded sampling with n > 1 and prefix caching, n-gram speculation,
beam search, static batching's padding and H2O's KV eviction each get a workload; every line a clean run executes
in the region is a target (one run each, a fault in every step that reaches it)."""
import enum
import os
import sys
from collections import deque
from contextlib import contextmanager

import pytest
import torch

import minillm
from minillm import LLM, SamplingParams

PACKAGE = os.path.dirname(minillm.__file__)
SAMPLED = dict(temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
PROMPTS = ["ACT I. Scene I. Elsinore. A platform", "ACT I. Scene I. Elsinore. Enter", "Who's there?"]


def workload(name: str):
    """-> (engine kwargs, a function that queues the requests on an engine)."""
    def plain(engine, params):
        for p, sp in zip(PROMPTS, params):
            engine.add_request(p, sp)

    if name == "seeded-sampling":       # n = 2 forks, logprobs, a stop string, a small pool: preemption
        params = [SamplingParams(n=2, max_tokens=14, logprobs=2, **SAMPLED),
                  SamplingParams(max_tokens=12, stop=["e"], prompt_logprobs=1, **SAMPLED),
                  SamplingParams(best_of=2, max_tokens=10, **SAMPLED)]
        return dict(block_size=4, enable_prefix_caching=True, kv_cache_bytes=64 * 1024, max_model_len=64), \
            lambda e: plain(e, params)         # 16 blocks of 4 tokens
    if name == "speculation":
        params = [SamplingParams(max_tokens=16, **SAMPLED), SamplingParams(temperature=0, max_tokens=16),
                  SamplingParams(n=2, max_tokens=12, logprobs=1, **SAMPLED)]
        return dict(block_size=2, speculative={"method": "ngram", "gamma": 3}), lambda e: plain(e, params)
    if name == "beam":
        def beams(engine):
            engine.enqueue(engine.make_beam_request(PROMPTS[0], 3, 8))
            engine.enqueue(engine.make_beam_request(PROMPTS[2], 2, 6))
            engine.add_request(PROMPTS[1], SamplingParams(max_tokens=9, **SAMPLED))
        return dict(block_size=4, enable_prefix_caching=True), beams
    if name == "static-padding":        # static batching: finished sequences hold their slot until the batch ends
        params = [SamplingParams(max_tokens=5, **SAMPLED), SamplingParams(max_tokens=11, **SAMPLED),
                  SamplingParams(n=2, max_tokens=8, **SAMPLED)]
        return dict(block_size=4, enable_prefix_caching=True, batching="static"), lambda e: plain(e, params)
    if name == "h2o-eviction":          # blocks leave the cache in the update, by the attention they received
        params = [SamplingParams(max_tokens=30, **SAMPLED), SamplingParams(n=2, max_tokens=24, **SAMPLED)]
        return dict(block_size=4, backend="torch", kv_eviction={"method": "h2o", "sinks": 4, "window": 16}), \
            lambda e: plain(e, params)
    raise KeyError(name)


WORKLOADS = ["seeded-sampling", "speculation", "beam", "static-padding", "h2o-eviction"]
EXERCISED = {   # what each workload is there for, seen in a clean run
    "seeded-sampling": lambda e: e.block_manager.prefix_hits > 0 and any(
        s.metrics.num_preemptions for r in e.requests.values() for s in r.seqs),
    "speculation": lambda e: e.spec_stats["drafted"] > 0,
    "beam": lambda e: any(st.pruned for st in e.trace.steps),
    "static-padding": lambda e: any(st.num_padding for st in e.trace.steps),
    "h2o-eviction": lambda e: e.block_manager.num_evicted > 0,
}


# ---------------------------------------------------------------------------- the engine's whole state
def plain(v):
    """A value as plain comparable data (sequences by id, containers in their order, tensors as lists)."""
    if isinstance(v, minillm.core.sequence.Sequence):
        return ("seq", v.seq_id)
    if isinstance(v, (list, tuple, deque)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return [(plain(k), plain(x)) for k, x in v.items()]
    if torch.is_tensor(v):
        return v.tolist()
    if isinstance(v, enum.Enum):
        return v.value
    if hasattr(v, "__dataclass_fields__"):
        return plain(vars(v))
    return v


def sequence_state(s) -> dict:
    state = {k: plain(v) for k, v in vars(s).items() if k not in ("params", "generator", "lora")}
    return state | {"generator": s.generator.get_state().tolist()}


def fingerprint(engine) -> dict:
    sched, bm = engine.scheduler, engine.block_manager
    seqs = {s.seq_id: s for r in engine.requests.values() for s in r.seqs}
    seqs |= {s.seq_id: s for q in (sched.running, sched.waiting, sched.swapped, sched.padding) for s in q}
    seqs |= {s.seq_id: s for v in sched.pending_forks.values() for s in v}
    groups = {rid: (plain(g.live), plain(g.cum), [plain(vars(h)) for h in g.hyps], g.done)
              for rid, g in sched.groups.items()}
    trace = engine.trace
    return {"queues": plain([sched.running, sched.waiting, sched.swapped, sched.padding]),
            "forks": plain(sched.pending_forks), "groups": groups, "requests": sorted(engine.requests),
            "seqs": {i: sequence_state(s) for i, s in sorted(seqs.items())},
            "blocks": {k: plain(v) for k, v in vars(bm).items()},
            "trace": (trace.count, len(trace.steps), trace.dropped, dict(trace.spec_stats))}


# ---------------------------------------------------------------------------- the fault
class Faults:
    """Between a step's model call (the trace's before_update) and the end of its transaction, raise
    KeyboardInterrupt when the line `target` (filename, lineno) of minillm's code is about to run; the retried step
    runs clean, the step after it is armed again. target None: a clean run that records the lines the region runs."""

    def __init__(self, engine, target=None):
        self.engine, self.target, self.armed, self.seen, self.fired = engine, target, True, set(), 0
        self.before = None
        real_schedule, real_before = engine.scheduler.schedule, engine.trace.before_update

        def schedule(*args):
            batch = real_schedule(*args)
            self.before = fingerprint(engine)             # the state a failed step must leave
            return batch

        def before_update(*args):
            sys._getframe(1).f_trace = self.line          # LLMEngine.advance's own lines after this call
            sys.settrace(self.call)
            return real_before(*args)
        real_transaction = engine._transaction

        @contextmanager
        def transaction(batch):
            with real_transaction(batch):
                yield
            sys.settrace(None)                            # committed: a fault from here on is between steps
        engine.scheduler.schedule, engine.trace.before_update = schedule, before_update
        engine._transaction = transaction

    def call(self, frame, event, arg):
        return self.line if frame.f_code.co_filename.startswith(PACKAGE) else None

    def line(self, frame, event, arg):
        if event != "line":
            return self.line
        where = (frame.f_code.co_filename, frame.f_lineno)
        self.seen.add(where)
        if self.armed and where == self.target:
            self.armed, self.fired = False, self.fired + 1
            raise KeyboardInterrupt(f"injected at {where}")
        return self.line

    def step(self) -> bool:
        """One step. -> did it fail (and leave the engine as its schedule left it)?"""
        try:
            self.engine.step()
        except KeyboardInterrupt:
            assert fingerprint(self.engine) == self.before, f"a fault at {self.target} changed the engine"
            return True
        finally:
            sys.settrace(None)
        self.armed = True
        return False


def run(name: str, target=None):
    """-> (outputs as plain data, the Faults object) of the workload with faults at target."""
    kwargs, queue = workload(name)
    llm = LLM("random:tiny", dtype="float64", max_num_seqs=4, **kwargs)
    engine = llm.engine
    queue(engine)
    faults, failures = Faults(engine, target), 0
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        failures += faults.step()
    assert not engine.has_unfinished_requests()
    assert failures == faults.fired
    outs = {}
    for rid, r in engine.requests.items():
        if r.beam is not None:
            outs[rid] = plain(r.beam.result())
        else:
            o = r.output()
            outs[rid] = [(c.token_ids, c.text, c.finish_reason, c.stop_reason, plain(c.logprobs), c.cumulative_logprob)
                         for c in o.outputs] + [plain(o.prompt_logprobs)]
    bm = engine.block_manager
    bm.check([])
    assert bm.num_free == bm.num_blocks and not engine.scheduler.pending_forks
    return outs, faults


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_fault_at_any_line_after_the_model_call_changes_nothing(name):
    want, clean = run(name)                      # the lines of minillm a clean run runs after the model call
    lines = sorted(clean.seen)
    assert EXERCISED[name](clean.engine)
    assert len(lines) > 60                       # the update, the block manager, the detokenizer, the trace ...
    update = minillm.core.scheduler.Scheduler.update.__code__
    body = {n for _, _, n in update.co_lines() if n is not None and n > update.co_firstlineno + 2}
    assert len(body & {n for f, n in lines if f == update.co_filename}) >= 10   # the update itself is targeted
    fired = 0
    for target in lines:
        outs, faults = run(name, target)
        assert outs == want, f"a fault at {target} changed the outputs"
        assert faults.fired >= 1, f"line {target} never ran again"
        fired += faults.fired
    print(f"{name}: {len(lines)} lines, {fired} faults, every output equal")
    assert fired >= 100
