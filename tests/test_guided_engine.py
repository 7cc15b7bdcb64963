"""Structured output through the one engine path, on the shipped model: every output matches its regex or validates
against its schema at T = 1 (the returned .text, as the engine decodes it), on the default backend (numba) and on
torch; jump-forward computes its forced tokens as one chunk and changes nothing else; speculative (n-gram) greedy
equals plain greedy under a constraint; bad requests are refused before anything is queued, naming the problem.
(500 samples per constraint: `python -m minillm bench guided`.)"""
import json
import re

import jsonschema
import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.guided import GuidedProcessor, compile_json, processor_of
from minillm.llama.tokenizer import BOS

PERSON = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "role": {"enum": ["lord", "lady", None]}}}
SCENE = {"type": "object", "required": ["act", "lines"],
         "properties": {"act": {"type": "integer", "minimum": 1, "maximum": 5},
                        "lines": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1,
                                  "maxItems": 2},
                        "comic": {"type": "boolean"}}}
PRICE = {"type": "object", "required": ["price", "tags"], "additionalProperties": False,
         "properties": {"price": {"type": "number", "minimum": -10, "maximum": 10},
                        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                        "note": {"type": ["string", "null"], "maxLength": 4}}}
REGEXES = [r"(Romeo|Juliet|Tybalt) (loves|hates) [a-z]+( [a-z]+)?\.", r"[0-9]{3}-[0-9]{4}",
           r"[A-Z][a-z ,]{4,30}[.!?]"]


@pytest.fixture(scope="module")
def llm():
    return LLM("shakespeare")


def complete(text: str, kind: str, spec) -> bool:
    if kind == "regex":
        return re.fullmatch(spec, text, re.ASCII) is not None
    jsonschema.validate(json.loads(text), spec)
    return True


@pytest.mark.parametrize("kind, spec", [("json", PERSON), ("json", SCENE), ("json", PRICE)] +
                         [("regex", r) for r in REGEXES])
def test_every_output_valid_at_temperature_one(llm, kind, spec):
    """30 samples at T = 1 (seeded, the default backend): each returned text fullmatches / parses and validates."""
    params = SamplingParams(temperature=1.0, max_tokens=48, seed=7,
                            **({"guided_json": spec} if kind == "json" else {"guided_regex": spec}))
    outs = llm.generate(["ROMEO:"] * 30, [SamplingParams(**{**params.__dict__, "seed": i}) for i in range(30)])
    for o in outs:
        c = o.outputs[0]
        assert c.finish_reason in ("stop", "length") and complete(c.text, kind, spec), (c.text, c.finish_reason)
    assert len({o.outputs[0].text for o in outs}) > 15                # sampled, not one forced string


def test_torch_backend_too():
    """backend='torch' runs the same processors on its logits: outputs valid there as well."""
    llm = LLM("shakespeare", backend="torch")
    outs = llm.generate(["JULIET:"] * 6, SamplingParams(temperature=1.0, max_tokens=40, guided_json=PERSON))
    outs += llm.generate(["JULIET:"] * 6, SamplingParams(temperature=1.0, max_tokens=40, guided_regex=REGEXES[0]))
    for o, (kind, spec) in zip(outs, [("json", PERSON)] * 6 + [("regex", REGEXES[0])] * 6):
        assert complete(o.outputs[0].text, kind, spec), o.outputs[0].text


def test_text_is_the_match_after_a_bos_prompt(llm):
    """A prompt that ends in BOS: llama2.c's decoder drops the first token's leading space, and the masks know it."""
    for t in (0.0, 1.0):
        outs = llm.generate([[BOS]] * 4, SamplingParams(temperature=t, max_tokens=20, guided_regex=r" ?[a-z]+ [a-z]+"))
        for o in outs:
            assert re.fullmatch(r" ?[a-z]+ [a-z]+", o.outputs[0].text), o.outputs[0].text


def test_tight_max_tokens_still_completes(llm):
    """max_tokens = the fewest tokens a match needs (+1): the length-aware masks steer every sample to a complete
    match in time (finish "stop", or "length" on an accepting state)."""
    index = compile_json(PERSON, llm.tokenizer)
    least = index.min_tokens()
    for extra in (0, 1):
        outs = llm.generate(["ROMEO:"] * 8, [SamplingParams(temperature=1.0, seed=i, max_tokens=least + extra,
                                                            guided_json=PERSON) for i in range(8)])
        for o in outs:
            assert len(o.outputs[0].token_ids) <= least + extra and complete(o.outputs[0].text, "json", PERSON)


def forced_positions(index, budget: int, tokens: list) -> set:
    """Replay jump-forward on a run's tokens: the output positions its GuidedProcessor appended without sampling."""
    proc, forced, i = GuidedProcessor(index, budget, after_bos=False), set(), 0
    while i < len(tokens):
        jumped = proc.jump(tokens[:i + 1])
        assert tokens[i + 1:i + 1 + len(jumped)] == jumped
        forced |= set(range(i + 1, i + 1 + len(jumped)))
        i += 1 + len(jumped)
    return forced


def run_counting_steps(llm, params) -> tuple[list, int, object]:
    engine = llm.engine
    request = engine.make_request("ROMEO:", params)
    engine.enqueue(request)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return engine.pop_finished()[0].outputs[0], steps, processor_of(request.params)


def test_jump_forward_chunk_equals_decoding_the_same_tokens(llm):
    """Greedy with jump-forward: the forced tokens (fixed keys) are appended unsampled and computed as one chunk in
    the next step. Decoding the same forced tokens one per step (jump-forward off, a processor forcing them at the
    same positions) gives the same output token for token: the chunk's K/V and logits equal the step-by-step ones
    (numba sums in a fixed order). Jump-forward needs fewer steps: one per forced token fewer."""
    params = SamplingParams(temperature=0, max_tokens=60, guided_json=PERSON)
    engine = llm.engine
    jumped, steps_jump, proc = run_counting_steps(llm, params)
    forced = forced_positions(proc.index, proc.budget, jumped.token_ids)
    assert proc.forced == len(forced) > 5 and complete(jumped.text, "json", PERSON)

    def force(ids, logits):                           # the jump run's token wherever it was forced
        if len(ids) not in forced:
            return logits
        out = torch.full_like(logits, float("-inf"))
        out[jumped.token_ids[len(ids)]] = logits[jumped.token_ids[len(ids)]]
        return out
    engine.jump_forward = False
    try:
        plain, steps_plain, _ = run_counting_steps(llm, SamplingParams(temperature=0, max_tokens=60,
                                                                       guided_json=PERSON, logits_processors=[force]))
    finally:
        engine.jump_forward = True
    assert plain.finish_reason == jumped.finish_reason == "stop" and plain.error is None
    assert plain.token_ids == jumped.token_ids and plain.text == jumped.text
    assert steps_plain - steps_jump == len(forced)


def test_speculative_ngram_greedy_equals_plain_greedy(llm):
    """Draft verification calls the mask on each draft's path: n-gram speculation under a constraint emits what plain
    greedy decoding does (jump-forward off in both: with it, speculation may tokenize a forced stretch differently,
    still valid). With jump-forward on, still valid."""
    spec = LLM("shakespeare", speculative={"method": "ngram", "gamma": 3})
    prompts = ["ROMEO: Romeo loves Juliet. Juliet loves Romeo.", "JULIET: 123-4567 123-"]
    plist = [SamplingParams(temperature=0, max_tokens=40, guided_regex=REGEXES[0]),
             SamplingParams(temperature=0, max_tokens=40, guided_regex=r"([0-9]{3}-[0-9]{4} ){2}")]
    for engine in (llm.engine, spec.engine):
        engine.jump_forward = False
    try:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, plist)]
        got = [o.outputs[0].token_ids for o in spec.generate(prompts, plist)]
    finally:
        llm.engine.jump_forward = spec.engine.jump_forward = True
    assert got == want
    assert spec.engine.spec_stats["drafted"] > 0
    for o, p in zip(spec.generate(prompts, plist), plist):
        assert re.fullmatch(p.guided_regex, o.outputs[0].text)


def test_n_samples_share_one_processor(llm):
    outs = llm.generate("TYBALT:", SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=40, guided_json=SCENE))
    texts = [c.text for c in outs[0].outputs]
    assert all(complete(t, "json", SCENE) for t in texts) and len(set(texts)) > 1


def test_stop_token_ids_only_where_the_match_is_complete(llm):
    """A text token given as a stop token ends the output only where the pattern accepts (elsewhere it is masked)."""
    stop = llm.tokenizer.lookup[b"a"]
    outs = llm.generate(["ROMEO:"] * 6, [SamplingParams(temperature=1.0, seed=i, max_tokens=30, stop_token_ids=[stop],
                                                        guided_regex=r"[a-z]{3,8}") for i in range(6)])
    for o in outs:
        assert re.fullmatch(r"[a-z]{3,8}", o.outputs[0].text), o.outputs[0].text


@pytest.mark.parametrize("params, named", [
    (dict(guided_regex="(?=a)abc"), "lookahead"), (dict(guided_regex=r"(a)\1"), "backreference"),
    (dict(guided_regex="a^b"), "anchor"), (dict(guided_json={"type": "string", "format": "email"}), "'format'"),
    (dict(guided_regex="ab\x00c"), "no sequence of this tokenizer's tokens"),
    (dict(guided_json=PERSON, max_tokens=4), "shortest complete match takes"),
    (dict(guided_regex="a+", ignore_eos=True), "ignore_eos"), (dict(guided_choice=["yes"], stop=["x"]), "stop"),
    (dict(guided_json="{oops"), "not valid JSON"),
])
def test_bad_requests_refused_before_queueing(llm, params, named):
    engine = llm.engine
    free = engine.block_manager.num_free
    with pytest.raises(ValueError, match=re.escape(named)):
        llm.generate(["ROMEO:", "JULIET:"], [SamplingParams(max_tokens=8), SamplingParams(**params)])
    assert not engine.requests and not engine.has_unfinished_requests()
    assert engine.block_manager.num_free == free


def test_two_constraints_at_once_refused():
    with pytest.raises(ValueError, match="guided_regex and guided_json"):
        SamplingParams(guided_regex="a", guided_json={"type": "null"})


def test_choice(llm):
    outs = llm.generate(["ROMEO: Wilt thou?"] * 5, [SamplingParams(temperature=1.0, seed=i, max_tokens=8,
                                                                   guided_choice=["ay", "no", "perchance"])
                                                    for i in range(5)])
    assert all(o.outputs[0].text in ("ay", "no", "perchance") and o.outputs[0].finish_reason == "stop" for o in outs)


def test_composes_with_penalties_and_truncation(llm):
    """The mask comes before penalties, temperature, top-k, top-p and min-p: a masked logit stays -inf through all."""
    p = dict(temperature=1.5, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.3, frequency_penalty=0.5,
             presence_penalty=-0.5, max_tokens=48, guided_json=SCENE)
    outs = llm.generate(["ROMEO:"] * 8, [SamplingParams(seed=i, **p) for i in range(8)])
    assert all(complete(o.outputs[0].text, "json", SCENE) for o in outs)


def test_logprobs_turn_jump_forward_off(llm):
    """Forced tokens have no logits of their own: a request asking for logprobs samples every token (one logprob
    entry per token), still valid."""
    out = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=48, logprobs=2, guided_json=PERSON))[0]
    c = out.outputs[0]
    assert complete(c.text, "json", PERSON) and len(c.logprobs) == len(c.token_ids)


@pytest.mark.parametrize("options", [dict(enable_chunked_prefill=True, max_num_batched_tokens=16),
                                     dict(batching="static"), dict(enable_prefix_caching=True, block_size=4)])
def test_jumped_tokens_under_other_schedules(llm, options):
    """Jump-forward's tokens are computed like a prompt's rest: chunked to the step's token budget, in a static batch
    (a finished sequence's padding row recomputes its last COMPUTED position), through the prefix cache. Greedy
    output equals the default schedule's (numba: batch-independent logits)."""
    want = llm.generate(["ROMEO:", "JULIET:"], SamplingParams(temperature=0, max_tokens=48, guided_json=PERSON))
    got = LLM("shakespeare", **options).generate(["ROMEO:", "JULIET:"], SamplingParams(temperature=0, max_tokens=48,
                                                                                      guided_json=PERSON))
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert all(complete(o.outputs[0].text, "json", PERSON) for o in got)


def test_draft_model_speculation_stays_valid():
    """The draft samples unmasked (q); verification uses the masked p, so a draft token the mask forbids is always
    rejected and the residual has only allowed tokens: outputs valid at T = 1."""
    spec = LLM("shakespeare", speculative={"method": "draft", "gamma": 3})
    outs = spec.generate(["ROMEO:"] * 6, [SamplingParams(temperature=1.0, seed=i, max_tokens=48, guided_json=SCENE)
                                          for i in range(6)])
    assert all(complete(o.outputs[0].text, "json", SCENE) for o in outs)
    assert spec.engine.spec_stats["drafted"] > 0


def test_a_tokenizer_without_token_bytes_is_refused():
    from minillm.config import EngineConfig
    from minillm.engine.engine import LLMEngine
    from minillm.labs.hashmodel import HashModel, IdTokenizer
    engine = LLMEngine.from_model(HashModel(), IdTokenizer(), EngineConfig(dtype="float64", backend="torch"))
    with pytest.raises(ValueError, match="needs a tokenizer whose tokens. bytes it knows"):
        engine.add_request([BOS, 5, 6], SamplingParams(guided_regex="a+"))
    assert not engine.requests
