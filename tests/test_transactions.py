"""A step is a transaction (DESIGN.md "One path through the engine"): an exception anywhere in it, KeyboardInterrupt
inside the model call included, leaves every sequence where the next step computes exactly what an uninterrupted
run computes, and nothing unwritten enters the prefix cache. A request's own mistake finishes it with "error"
while the others go on; LLM.generate aborts its requests when a step raises and the engine stays usable."""
import pytest
import torch
from hashmodel import HashModel, reference
from test_scheduler_fuzz import run_schedule

import minillm.engine.engine
from minillm import LLM, SamplingParams

# A schedule that exercises every kind of state a step touches: shared prompts (prefix caching), n = 2 forks,
# a pool of one full-length sequence (preemption), a late arrival, an abort and n-gram speculation.
REQS = [([3, 4, 5, 3, 4, 5, 3, 4, 5, 6], 20, 0, 2, False), ([3, 4, 5, 3, 4, 5, 7, 8], 14, 0, 1, False),
        ([9, 9, 9, 10, 11], 25, 1, 1, False), ([3, 4, 5, 3, 4, 5, 3, 4], 9, 2, 3, True), ([12] * 20, 18, 4, 1, False)]
SCHEDULES = {
    "continuous-swap": dict(block_size=4, mode="continuous", caching=True, pool_blocks16=4, preempt="swap", gamma=0),
    "recompute-spec": dict(block_size=2, mode="continuous", caching=True, pool_blocks16=4, preempt="recompute",
                           gamma=3),
    "chunked-spec": dict(block_size=4, mode="chunked", caching=True, pool_blocks16=5, preempt="swap", gamma=2),
    "static": dict(block_size=16, mode="static", caching=True, pool_blocks16=4, preempt="recompute", gamma=0),
}


def fail_once(obj, name: str, at: int, after: bool = False):
    """Make obj.name raise KeyboardInterrupt on its at-th call, before or after doing its work."""
    real, calls = getattr(obj, name), [0]

    def wrapper(*args, **kw):
        calls[0] += 1
        if calls[0] == at and not after:
            raise KeyboardInterrupt(f"injected before {name}")
        out = real(*args, **kw)
        if calls[0] == at and after:
            raise KeyboardInterrupt(f"injected after {name}")
        return out
    setattr(obj, name, wrapper)


def run_through_failures(engine, max_steps: int = 2000) -> int:
    """Step the engine until nothing is left, carrying on after each injected KeyboardInterrupt. -> how many.
    A run that does not end within max_steps fails (a broken rollback can leave a request that never finishes)."""
    failures = 0
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return failures
        try:
            engine.step()
        except KeyboardInterrupt:
            failures += 1
    raise AssertionError(f"requests still unfinished after {max_steps} steps")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("where", ["before", "after"])
def test_an_interrupted_model_call_changes_no_output(schedule, where):
    """The model call raises at its 1st, 2nd, ... 12th call, before or after writing K/V: every run's outputs equal
    the sequential reference (run_schedule checks them, the blocks, and the prefix cache after every step)."""
    for at in range(1, 13):
        def inject(engine, model):
            model.fail_at = (at, where)
        _, failures = run_schedule(REQS, inject=inject, **SCHEDULES[schedule])
        assert failures == 1


STAGES = [("runner", "move_blocks", False), ("runner", "move_blocks", True), ("proposer", "propose", True),
          ("runner", "run", True), ("runner", "commit", True), ("proposer", "observe", True)]


@pytest.mark.parametrize("schedule", ["continuous-swap", "recompute-spec", "chunked-spec"])
@pytest.mark.parametrize("owner,name,after", STAGES,
                         ids=[f"{o}.{n}-{'after' if a else 'before'}" for o, n, a in STAGES])
def test_an_exception_at_any_stage_changes_no_output(schedule, owner, name, after):
    for at in (1, 3, 7):
        def inject(engine, model):
            fail_once(getattr(engine, owner), name, at, after)
        _, failures = run_schedule(REQS, inject=inject, **SCHEDULES[schedule])
        assert failures == 1


def test_an_exception_in_verification_restores_the_generators(monkeypatch):
    """Seeded sampling: verification draws from each sequence's generator, then the step fails; the retried step
    must draw the same numbers, so the output equals the uninterrupted run's."""
    sp = SamplingParams(n=2, temperature=1.0, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True)
    want = [c.token_ids for c in LLM("random:tiny", dtype="float64").generate("Who's there?", sp)[0].outputs]
    for at in (1, 2, 5):
        llm = LLM("random:tiny", dtype="float64", speculative={"method": "ngram", "gamma": 2})
        monkeypatch.setattr(minillm.engine.engine, "verify", minillm.core.verify.verify)
        fail_once(minillm.engine.engine, "verify", at, after=True)
        engine = llm.engine
        engine.add_request("Who's there?", sp)
        failures = run_through_failures(engine)
        assert failures == 1 and [c.token_ids for c in engine.pop_finished()[0].outputs] == want


def test_a_failing_logits_processor_ends_only_its_request():
    def bad(ids, logits):
        if len(ids) == 3:
            raise RuntimeError("processor broke at the 4th token")
        return logits

    llm = LLM("random:tiny", dtype="float64")
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    want = [o.token_ids for o in llm.generate(["To be", "Hamlet"], greedy)]
    outs = llm.generate(["To be", "Who's there?", "Hamlet"],
                        [greedy, SamplingParams(n=2, temperature=0, max_tokens=10, logits_processors=[bad]), greedy])
    assert [outs[0].token_ids, outs[2].token_ids] == want
    for c in outs[1].outputs:
        assert c.finish_reason == "error" and "processor broke at the 4th token" in c.error and len(c.token_ids) == 3
    bm = llm.engine.block_manager
    assert bm.num_free == bm.num_blocks
    assert [o.token_ids for o in llm.generate(["To be", "Hamlet"], greedy)] == want


def test_a_logits_processor_returning_garbage_is_that_requests_error():
    llm = LLM("random:tiny")
    out = llm.generate("To be", SamplingParams(max_tokens=4, logits_processors=[lambda ids, logits: logits[:3]]))[0]
    assert out.outputs[0].finish_reason == "error" and "must return a tensor of shape (512,)" in out.outputs[0].error


def test_generate_aborts_its_requests_when_a_step_raises_and_the_engine_stays_usable():
    from minillm.formats.loader import sample_tokenizer
    model, tok = HashModel(), sample_tokenizer(300)
    llm = LLM(model, tokenizer=tok, dtype="float64", max_model_len=64, block_size=4, enable_prefix_caching=True)
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[1, 5, 6, 7, 8, 9, 10], [1, 5, 6, 7, 8, 11]]
    model.fail_at = (3, "after")
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, sp)
    engine = llm.engine
    assert not engine.has_unfinished_requests() and not engine.requests
    assert engine.block_manager.num_free == engine.block_manager.num_blocks
    assert [o.token_ids for o in llm.generate(prompts, sp)] == [reference(p, 12) for p in prompts]


def test_keyboard_interrupt_inside_the_torch_model_leaves_no_trace():
    """A real model, interrupted in its third layer's attention during a prefill: the next run is unchanged."""
    llm = LLM("random:tiny", dtype="float64", enable_prefix_caching=True, block_size=4)
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = ["ACT I. Scene I. Elsinore.", "ACT I. Scene II. A room of state."]
    want = [o.token_ids for o in LLM("random:tiny", dtype="float64").generate(prompts, sp)]
    layer = llm.model.layers[1].attention
    calls = [0]

    def hook(module, args):
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt("Ctrl-C")
    handle = layer.register_forward_pre_hook(hook)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, sp)
    handle.remove()
    assert [o.token_ids for o in llm.generate(prompts, sp)] == want
    assert torch.is_tensor(llm.engine.kv.k)
