"""LoRA in the engine: LLM(..., enable_lora=True).generate(prompts, params, lora=...). Several adapters in one batch
== each adapter's merged model (float64: tokens and logprobs; float32: logprobs within a stated tolerance), with
chunked prefill and prefix caching; the prefix cache never shares a block across adapters; adapters beyond max_loras
wait for a slot; bad input is refused with the request and nothing else lost."""
import pytest
from test_lora import random_adapter

from minillm import LLM, SamplingParams
from minillm.lora.adapters import MODULES, merge_lora

PROMPTS = ["The cat sat on the mat and then", "Once upon a time", "A dog barked at the moon", "To be or not",
           "The cat sat on the mat and then"]


@pytest.fixture(scope="module")
def adapters(tiny64):
    model, _ = tiny64
    cfg = model.config
    return [random_adapter(cfg, 4, 1, name="a", scale=0.1), random_adapter(cfg, 8, 2, MODULES[:4], "b", 0.1),
            random_adapter(cfg, 2, 3, MODULES[4:], "c", 0.1)]


def merged_outputs(model, tok, adapter, prompts, params, dtype):
    llm = LLM(merge_lora(model, adapter) if adapter else model, tokenizer=tok, dtype=dtype, backend="torch")
    return llm.generate(prompts, params)


def test_mixed_adapters_in_one_batch_equal_each_merged_model_float64(tiny64, adapters):
    model, tok = tiny64
    a, b, c = adapters
    lora = [a, b, None, c, b]
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=0)
    llm = LLM(model, tokenizer=tok, dtype="float64", enable_lora=True, max_loras=4, enable_chunked_prefill=True,
              max_num_batched_tokens=8, enable_prefix_caching=True, block_size=4)
    assert "'torch'" in llm.engine.backend_choice
    outs = llm.generate(PROMPTS, params, lora=lora)
    for p, ad, out in zip(PROMPTS, lora, outs):
        want = merged_outputs(model, tok, ad, [p], params, "float64")[0].outputs[0]
        got = out.outputs[0]
        assert got.token_ids == want.token_ids, f"adapter {ad and ad.name} on {p!r}"
        for g, w in zip(got.logprobs, want.logprobs):     # float64: only summation order differs (~1e-16 per op)
            assert abs(g[next(iter(g))] - w[next(iter(w))]) < 1e-9


def test_mixed_adapters_float32_logprobs_within_tolerance(tiny64, adapters):
    model, tok = tiny64
    lora = [adapters[0], adapters[1], None, adapters[2]]
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1)
    llm = LLM(model, tokenizer=tok, dtype="float32", enable_lora=True, enable_chunked_prefill=True,
              max_num_batched_tokens=8, enable_prefix_caching=True, block_size=4)
    outs = llm.generate(PROMPTS[:4], params, lora=lora)
    compared = 0
    for p, ad, out in zip(PROMPTS, lora, outs):
        want = merged_outputs(model, tok, ad, [p], params, "float32")[0].outputs[0]
        got = out.outputs[0]
        for i, (g, w) in enumerate(zip(got.logprobs, want.logprobs)):
            top = sorted(w.values(), reverse=True)
            # float32: batch shape and the merged W + s B A change rounding (~1e-7 relative per op, logits O(10)):
            # 1e-3 on a logprob; tokens compared while the reference's top-2 margin exceeds 1e-3 (DESIGN rule 7)
            assert abs(g[got.token_ids[i]] - w[want.token_ids[i]]) < 1e-3
            if len(top) > 1 and top[0] - top[1] < 1e-3:
                break
            assert got.token_ids[i] == want.token_ids[i]
            compared += 1
    assert compared >= 24                       # most steps compared (8 steps x 4 prompts at most)


def test_prefix_cache_is_not_shared_across_adapters(tiny64, adapters):
    model, tok = tiny64
    llm = LLM(model, tokenizer=tok, dtype="float64", enable_lora=True, enable_prefix_caching=True, block_size=4)
    prompt, params = PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=4)
    first = llm.generate(prompt, params, lora=adapters[0])[0]
    other = llm.generate(prompt, params, lora=adapters[1])[0]           # same tokens, another adapter
    base = llm.generate(prompt, params)[0]
    again = llm.generate(prompt, params, lora=adapters[0])[0]
    assert other.metrics.num_cached_tokens == 0 and base.metrics.num_cached_tokens == 0
    assert again.metrics.num_cached_tokens > 0 and again.outputs[0].token_ids == first.outputs[0].token_ids
    want = merged_outputs(model, tok, adapters[1], [prompt], params, "float64")[0]
    assert other.outputs[0].token_ids == want.outputs[0].token_ids


def test_more_adapters_than_slots_wait_for_one(tiny64, adapters):
    model, tok = tiny64
    llm = LLM(model, tokenizer=tok, dtype="float64", enable_lora=True, max_loras=1)
    engine, params = llm.engine, SamplingParams(temperature=0.0, max_tokens=6)
    ra = engine.add_request(PROMPTS[1], params, lora=adapters[0])
    rb = engine.add_request(PROMPTS[2], params, lora=adapters[1])
    rn = engine.add_request(PROMPTS[3], params)                          # the base model needs no slot
    engine.step()
    status = {rid: engine.requests[rid].seqs[0].status.value for rid in (ra, rb, rn)}
    assert status == {ra: "running", rb: "waiting", rn: "waiting"}      # fcfs: b blocks the queue behind it
    done = {}
    while engine.has_unfinished_requests():
        engine.step()
        done.update({o.request_id: o for o in engine.pop_finished()})
    slots = engine.parts.lora
    assert slots.loads == 2 and slots.evictions == 1
    for rid, p, ad in ((ra, PROMPTS[1], adapters[0]), (rb, PROMPTS[2], adapters[1]), (rn, PROMPTS[3], None)):
        want = merged_outputs(model, tok, ad, [p], params, "float64")[0]
        assert done[rid].outputs[0].token_ids == want.outputs[0].token_ids


def test_an_unknown_adapter_is_refused_and_others_keep_running(tiny64, adapters):
    model, tok = tiny64
    llm = LLM(model, tokenizer=tok, dtype="float64", enable_lora=True)
    engine, params = llm.engine, SamplingParams(temperature=0.0, max_tokens=5)
    with pytest.raises(ValueError, match="unknown LoRA adapter 'no-such-adapter'"):
        llm.generate(PROMPTS[:2], params, lora=[adapters[0], "no-such-adapter"])
    assert not engine.requests and not engine.has_unfinished_requests()   # validated first: nothing queued
    good = engine.add_request(PROMPTS[0], params, lora=adapters[0])
    engine.step()
    with pytest.raises(ValueError, match="unknown LoRA adapter"):
        engine.add_request(PROMPTS[1], params, lora="no-such-adapter")
    while engine.has_unfinished_requests():
        engine.step()
    out = engine.pop_finished()
    assert [o.request_id for o in out] == [good] and out[0].outputs[0].finish_reason == "length"


def test_lora_options_are_checked(tiny64, adapters):
    model, tok = tiny64
    plain = LLM(model, tokenizer=tok, dtype="float64")
    with pytest.raises(ValueError, match="needs an engine made with enable_lora=True"):
        plain.generate(PROMPTS[0], lora=adapters[0])
    with pytest.raises(ValueError, match="backend='numba' does not run enable_lora=True yet; backends that do: torch"):
        LLM(model.float(), tokenizer=tok, enable_lora=True, backend="numba")
    auto = LLM(model.float(), tokenizer=tok, enable_lora=True)
    assert "chose 'torch'" in auto.engine.backend_choice and "numba: does not run enable_lora=True" in \
        auto.engine.backend_choice
    small = LLM(model, tokenizer=tok, dtype="float64", enable_lora=True, max_lora_rank=4)
    with pytest.raises(ValueError, match="rank r=8, more than max_lora_rank=4"):
        small.generate(PROMPTS[0], lora=adapters[1])
    with pytest.raises(ValueError, match="1 prompts but 2 values of lora="):
        small.generate(PROMPTS[0], lora=[adapters[0], adapters[2]])
    assert not small.engine.requests


def test_n_samples_keep_their_adapter(tiny64, adapters):
    model, tok = tiny64
    llm = LLM(model, tokenizer=tok, dtype="float64", enable_lora=True)
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6)
    got = llm.generate(PROMPTS[1], params, lora=adapters[2])[0]
    want = merged_outputs(model, tok, adapters[2], [PROMPTS[1]], params, "float64")[0]
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in want.outputs]   # forks share the adapter
