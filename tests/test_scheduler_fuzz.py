"""Scheduler and block-manager fuzzing with tests/hashmodel.HashModel, whose next token hashes the K/V it reads
back through the block table: outputs must equal the plain sequential reference whatever the schedule
(batching mode, block size, prefix caching, preemption by recompute or swap, n > 1 samples that do not fit
the pool together, aborts, n-gram speculation with rollback), and nothing may leak.

200 examples run with the suite; `pytest -m slow tests/test_scheduler_fuzz.py` runs MINILLM_FUZZ_EXAMPLES
(default 10,000)."""
import os

import pytest
from hashmodel import HashModel, reference
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.config import EngineConfig
from minillm.core.sampling import SamplingParams
from minillm.engine.engine import LLMEngine
from minillm.formats.loader import sample_tokenizer

V = 300

# prompts of few distinct tokens, so that they share prefixes
request = st.tuples(st.lists(st.integers(3, 12), min_size=1, max_size=30),  # prompt
                    st.integers(1, 25),                                      # max_tokens
                    st.integers(0, 6),                                       # arrival step
                    st.sampled_from([1, 1, 2, 3]),                           # n
                    st.booleans())                                           # aborted later
schedules = dict(reqs=st.lists(request, min_size=1, max_size=8), block_size=st.sampled_from([1, 2, 4, 16]),
                 mode=st.sampled_from(["continuous", "static", "chunked"]), caching=st.booleans(),
                 pool_blocks16=st.integers(4, 12), preempt=st.sampled_from(["recompute", "swap"]),
                 gamma=st.sampled_from([0, 0, 1, 3]))


def check_prefix_cache(engine):
    """Every block the prefix cache names holds the K/V of exactly its tokens (HashModel stores token ids)."""
    bm, k = engine.block_manager, engine.kv.k
    for b in range(bm.num_blocks):
        if bm.block_tokens[b] is not None:
            assert k[0, b, :, 0, 0].tolist() == list(bm.block_tokens[b]), f"block {b} is named but holds other K/V"


def run_schedule(reqs, block_size, mode, caching, pool_blocks16, preempt, gamma, inject=None, **seams):
    """inject(engine, model): arm a fault before the run (steps that raise KeyboardInterrupt are retried);
    seams: replacement parts for minillm.engine.parts.prepare (a block manager, a policy ...)."""
    tok = sample_tokenizer(V)
    model = HashModel()
    per_token = model.config.kv_bytes_per_token(8)
    kv_tokens = 64 if pool_blocks16 == 4 else pool_blocks16 * 16   # 4: exactly one full-length sequence
    spec = {"method": "ngram", "gamma": gamma} if gamma and mode != "static" else None
    cfg = EngineConfig(block_size=block_size, dtype="float64", max_model_len=64, max_num_seqs=4,
                       kv_cache_bytes=kv_tokens * per_token,
                       batching="static" if mode == "static" else "continuous",
                       enable_chunked_prefill=mode == "chunked",
                       max_num_batched_tokens=9 if mode == "chunked" else None,
                       enable_prefix_caching=caching, preemption_mode=preempt,
                       swap_bytes=(2 if preempt == "swap" else 0) * 64 * per_token, speculative=spec)
    engine = LLMEngine.from_model(model, tok, cfg, **seams)
    if inject is not None:
        inject(engine, model)
    pending = sorted(enumerate(reqs), key=lambda r: r[1][2])
    ids, step, finished, failures = {}, 0, {}, 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][1][2] <= step:
            i, (prompt, max_tokens, _, n, abort) = pending.pop(0)
            prompt = [1] + prompt[:60]
            ids[i] = engine.add_request(prompt,
                                        SamplingParams(n=n, temperature=0, max_tokens=max_tokens, ignore_eos=True))
        try:
            engine.step()
        except KeyboardInterrupt:
            failures += 1
        if caching:
            check_prefix_cache(engine)
        step += 1
        if step == 3:
            for i, r in enumerate(reqs):
                if r[4] and i in ids and ids[i] in engine.requests:  # (finished ones are popped already)
                    engine.abort(ids[i])
        for out in engine.pop_finished():
            assert out.request_id not in finished, "a request finished twice"
            finished[out.request_id] = out
        assert step < 2000, "the engine stopped making progress"
    assert set(finished) == set(ids.values())
    for i, rid in ids.items():
        prompt, max_tokens, _, n, _ = reqs[i]
        prompt = [1] + prompt[:60]
        want = reference(prompt, min(max_tokens, 64 - len(prompt)))
        for c in finished[rid].outputs:
            if c.finish_reason == "abort":
                assert c.token_ids == want[:len(c.token_ids)]
            else:
                assert c.token_ids == want, (i, c.finish_reason)
    bm = engine.block_manager
    bm.check([])
    assert bm.num_free == bm.num_blocks
    if hasattr(bm, "swap_free"):
        assert sum(bm.ref_count) == 0 and len(bm.swap_free) == bm.swap_blocks
    assert not engine.scheduler.pending_forks
    return engine, failures


@settings(deadline=None, derandomize=True, max_examples=200)
@given(**schedules)
def test_fuzz_outputs_equal_sequential_and_nothing_leaks(**kw):
    run_schedule(**kw)


@pytest.mark.slow
@settings(deadline=None, derandomize=True, database=None,
          max_examples=int(os.environ.get("MINILLM_FUZZ_EXAMPLES", "10000")))
@given(**schedules)
def test_fuzz_long(**kw):
    run_schedule(**kw)
