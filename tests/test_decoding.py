"""Decoding strategies (issue 17): min-p, penalties, logits processors, logprobs / prompt_logprobs, best_of.

Formulas are checked on tiny hand-computed logits (and against HF transformers' processors, where vLLM's sampler
took them from); the engine's logprobs against log_softmax of a plain forward of the same tokens; equalities
(greedy + penalties == a plain greedy loop, speculative == plain, alone == in a batch) on the float64 tiny model,
and bit for bit on the numba backend."""
import math

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.core.batch import Draft
from minillm.core.logprobs import entries, score
from minillm.core.sampling import apply_penalties, probs_from_logits, sample, transform_logits
from minillm.core.sequence import Sequence
from minillm.core.verify import verify_row

PROMPTS = ["To be, or not to be", "Hamlet", "Who's there?", "O, what a rogue and peasant slave am I!"]
LONG = "To be, or not to be, that is the question: whether 'tis nobler in the mind"


@pytest.fixture(scope="module")
def tiny(tiny64):
    return tiny64


def make(tiny, **kw):
    model, tok = tiny
    return LLM(model, tokenizer=tok, dtype="float64", **kw)


@pytest.fixture(scope="module")
def shakespeare():
    """The shipped model on each backend, built once: {backend: LLM}."""
    return {b: LLM("shakespeare", backend=b) for b in ("torch", "numba")}


def plain_logprobs(model, ids) -> torch.Tensor:
    """log_softmax of one plain forward over the whole sequence (no cache, no batch): (T, V) float64."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids]))[0].double(), -1)


# ---------------------------------------------------------------- the formulas, by hand
def test_repetition_frequency_presence_penalties_by_hand():
    """CTRL's repetition penalty divides a positive logit and multiplies a negative one, for tokens in the prompt OR
    the output; frequency and presence count the output only (vLLM's apply_penalties, OpenAI's definition)."""
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0], dtype=torch.float64)
    prompt, output = [0, 5], [1, 2, 2]
    got = apply_penalties(logits, prompt, output, repetition=2.0, frequency=0.5, presence=0.25)
    want = torch.tensor([
        2.0 / 2,                    # 0: prompt only, positive: halved, no frequency/presence (not in the output)
        -1.0 * 2 - 0.5 * 1 - 0.25,  # 1: output once, negative: doubled, then -freq*1 - pres
        0.5 / 2 - 0.5 * 2 - 0.25,   # 2: output twice
        -3.0,                       # 3: unseen
        1.0,                        # 4: unseen
        0.0,                        # 5: prompt, zero stays zero (0 * 2)
    ], dtype=torch.float64)
    assert torch.equal(got, want), (got, want)
    # each alone is the identity where off
    assert torch.equal(apply_penalties(logits, prompt, output), logits)


def test_min_p_keeps_tokens_within_a_ratio_of_the_top_after_temperature():
    """p = softmax(logits / T) = [0.5, 0.25, 0.125, 0.125] at T = 2 (logits 2 * ln of those); min_p = 0.3 keeps
    p >= 0.15: the first two, renormalised to [2/3, 1/3]. At T = 1 the same logits give [0.64, 0.16, 0.04, 0.04]
    (squared then normalised) and min_p = 0.3 keeps p >= 0.19: the first only."""
    logits = 2 * torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64))
    p = probs_from_logits(logits, 2.0, min_p=0.3)
    assert torch.allclose(p, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0]), atol=1e-6), p
    assert torch.equal(probs_from_logits(logits, 1.0, min_p=0.3) > 0, torch.tensor([True, False, False, False]))
    kept = torch.tensor([True, True, False, False])                     # min_p = 0.5: p = 0.25 = 0.5 * 0.5 is kept
    assert torch.equal(probs_from_logits(logits, 2.0, min_p=0.5) > 0, kept)
    assert torch.allclose(probs_from_logits(logits, 2.0, min_p=0.0), torch.softmax(logits / 2, -1).float())


def test_order_is_top_k_then_top_p_then_min_p():
    """p = [0.4, 0.3, 0.2, 0.1]. top_k=3 -> [4/9, 3/9, 2/9]; top_p=0.7 keeps the first two (4/9 < 0.7 <= 7/9)
    -> [4/7, 3/7]; min_p=0.8 then keeps p >= 0.8 * 4/7: 3/7 < 3.2/7, so the first alone."""
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64))
    assert torch.allclose(probs_from_logits(logits, 1.0, 3, 0.7), torch.tensor([4 / 7, 3 / 7, 0, 0]), atol=1e-6)
    assert torch.equal(probs_from_logits(logits, 1.0, 3, 0.7, 0.8), torch.tensor([1.0, 0, 0, 0]))
    assert torch.allclose(probs_from_logits(logits, 1.0, 3, 0.7, 0.7), torch.tensor([4 / 7, 3 / 7, 0, 0]), atol=1e-6)


def test_processors_then_penalties_then_temperature():
    """The user's processor runs on the raw logits, before penalties (vLLM's order): a processor that adds 1 to
    token 0 makes it positive, so the repetition penalty then divides it (2 -> 1), not multiplies (-1 -> -2)."""
    logits = torch.tensor([-1.0, 0.5, 0.0])
    params = SamplingParams(temperature=0.5, repetition_penalty=2.0,
                            logits_processors=[lambda ids, x: x + torch.tensor([3.0, 0, 0])])
    got = transform_logits(params, [0], [], logits)
    assert torch.equal(got, torch.tensor([1.0, 0.5, 0.0]))
    assert torch.equal(transform_logits(SamplingParams(), [0], [1], logits), logits)     # nothing asked: untouched


def test_formulas_match_hf_transformers_processors():
    """HF transformers' RepetitionPenalty / Temperature / TopK / TopP / MinP processors (the code vLLM's sampler
    follows) give the same kept set and the same distribution on random logits (float64, 1e-12)."""
    lp = pytest.importorskip("transformers.generation.logits_process")
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        V = 50
        logits = torch.randn(V, generator=g, dtype=torch.float64) * 3
        ids = torch.randint(0, V, (12,), generator=g)
        T, k, p, m, r = 0.7 + trial / 20, 10 + trial, 0.8, 0.05 * (trial % 4), 1.3
        hf = lp.RepetitionPenaltyLogitsProcessor(r)(ids[None], logits[None].clone())
        ours = apply_penalties(logits, ids[:5].tolist(), ids[5:].tolist(), repetition=r)
        assert torch.allclose(hf[0], ours, atol=1e-12)
        for warp in (lp.TemperatureLogitsWarper(T), lp.TopKLogitsWarper(k), lp.TopPLogitsWarper(p)) + \
                ((lp.MinPLogitsWarper(m),) if m else ()):
            hf = warp(ids[None], hf)
        want = torch.softmax(hf[0], -1)
        got = probs_from_logits(ours, T, k, p, m)
        assert torch.equal(got > 0, want > 0), trial
        assert torch.allclose(got.double(), want, atol=1e-6), trial        # probs_from_logits works in float32


def test_sampled_frequencies_follow_the_penalised_min_p_distribution():
    """10 000 draws through transform_logits + sample: each count within 5 standard deviations of the hand-computed
    distribution (fails by chance with p < 1e-5), and no token that min-p removes ever drawn."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -4.0])
    params = SamplingParams(temperature=0.8, min_p=0.1, presence_penalty=1.0)
    out = [0]                                      # token 0 seen once: 2.0 - 1.0 = 1.0
    pen = torch.tensor([1.0, 1.5, 1.0, 0.0, -4.0]) / 0.8
    want = torch.softmax(pen, -1)
    want = torch.where(want >= 0.1 * want.max(), want, 0.0)
    want = want / want.sum()
    assert want[4] == 0 and want[3] > 0
    g, n = torch.Generator().manual_seed(0), 10000
    draws = [sample(transform_logits(params, [], out, logits), params, g) for _ in range(n)]
    counts = torch.bincount(torch.tensor(draws), minlength=5).double()
    expect = want.double() * n
    assert counts[4] == 0
    assert ((counts - expect).abs() <= 5 * (expect * (1 - expect / n)).sqrt() + 1).all(), (counts, expect)


# ---------------------------------------------------------------- the engine
def manual_greedy_penalised(model, ids, n, rep, freq, pres):
    """A plain greedy loop (no cache) with the penalties written out again, independently of apply_penalties."""
    ids, out = list(ids), []
    with torch.no_grad():
        for _ in range(n):
            x = model(torch.tensor([ids + out]))[0, -1].clone()
            for t in set(ids + out):
                x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
            for t in set(out):
                x[t] -= freq * out.count(t) + pres
            out.append(int(x.argmax()))
    return out


def test_greedy_with_penalties_equals_a_plain_penalised_loop(tiny):
    model, tok = tiny
    sp = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.5,
                        frequency_penalty=0.4, presence_penalty=0.3)
    outs = make(tiny).generate(PROMPTS, sp)
    plain = make(tiny).generate(PROMPTS, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for o, q in zip(outs, plain):
        assert o.token_ids == manual_greedy_penalised(model, o.prompt_token_ids, 20, 1.5, 0.4, 0.3)
    assert any(o.token_ids != q.token_ids for o, q in zip(outs, plain))     # the penalties changed something


def test_min_p_one_is_greedy(tiny):
    """min_p = 1 keeps only the most likely token: the same text as temperature 0, at any temperature."""
    greedy = make(tiny).generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    minp = make(tiny).generate(PROMPTS, SamplingParams(temperature=1.5, min_p=1.0, seed=3, max_tokens=16,
                                                       ignore_eos=True))
    assert [o.token_ids for o in minp] == [o.token_ids for o in greedy]


def test_speculative_greedy_with_penalties_equals_plain(tiny):
    """The drafts before a slot count as output for its penalties: n-gram speculation with a presence penalty
    (negative, so the repeats the n-gram proposer drafts are often accepted) gives the plain run's tokens."""
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, presence_penalty=-1.5, frequency_penalty=0.2,
                        repetition_penalty=1.2, logprobs=2)
    prompts = [PROMPTS[0] + " " + PROMPTS[0], PROMPTS[3]]
    plain = make(tiny).generate(prompts, sp)
    spec = make(tiny, speculative={"method": "ngram", "gamma": 3})
    outs = spec.generate(prompts, sp)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert spec.engine.spec_stats["accepted"] > 0                        # drafts were kept, so slots > 0 were used
    for o, q in zip(outs, plain):                                         # and scored at the right slot
        for a, b in zip(o.outputs[0].logprobs, q.outputs[0].logprobs):
            assert a.keys() == b.keys() and all(abs(a[t] - b[t]) < 1e-9 for t in a)


def test_verification_counts_accepted_drafts_as_output_for_penalties():
    """One row, one draft x = 1, greedy. Slot 0's argmax is x: accepted. At slot 1, x leads y = 2 by 0.2 in the
    raw logits, but x now counts as output, so presence_penalty=0.5 puts y ahead: emitted [x, y]. Had slot 1
    not seen the draft, it would emit x again. The logprobs come from slot 0 for x and slot 1 for y."""
    params = SamplingParams(temperature=0, presence_penalty=0.5, logprobs=1)
    seq = Sequence(0, "0", 0, [0, 3], params, 0, 0.0)
    logits = torch.tensor([[0.0, 2.0, 1.0, 0.0], [0.0, 1.0, 0.8, 0.0]], dtype=torch.float64)   # (1 + k, V)
    v = verify_row(seq, logits, Draft([1]))
    assert v.tokens == [1, 2] and v.accepted == 1
    assert v.logprobs is None                      # the acceptance rule alone: the engine's Logprobs step scores
    score(seq, logits, v)
    lp = torch.log_softmax(logits, -1)
    assert v.logprobs == [{1: float(lp[0, 1])}, {2: float(lp[1, 2]), 1: float(lp[1, 1])}]


def check_logprobs_exact(model, out, k, tol, kp=None):
    """Every generated and prompt entry against log_softmax of a plain forward: the token's own value and the
    top k (kp for the prompt; the same set), within tol; cumulative_logprob is the sum of the tokens' entries."""
    kp = k if kp is None else kp
    ids = out.prompt_token_ids + out.outputs[0].token_ids
    lp, P = plain_logprobs(model, ids), len(out.prompt_token_ids)
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids)
    for i, (t, d) in enumerate(zip(c.token_ids, c.logprobs)):
        assert next(iter(d)) == t                                        # the sampled token first
        assert set(d) == {t} | set(torch.topk(lp[P - 1 + i], k).indices.tolist())
        assert max(abs(x - float(lp[P - 1 + i, u])) for u, x in d.items()) < tol
    assert abs(c.cumulative_logprob - sum(d[t] for t, d in zip(c.token_ids, c.logprobs))) < 1e-9
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == P
    for j in range(1, P):
        d, t = out.prompt_logprobs[j], out.prompt_token_ids[j]
        assert next(iter(d)) == t and set(d) == {t} | set(torch.topk(lp[j - 1], kp).indices.tolist())
        assert max(abs(x - float(lp[j - 1, u])) for u, x in d.items()) < tol


def test_logprobs_are_exact_float64(tiny):
    """float64 tiny model: the paged, batched engine's logprobs equal a plain forward's to 1e-9."""
    model, _ = tiny
    sp = SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True, logprobs=4, prompt_logprobs=3,
                        repetition_penalty=1.3, top_k=20)
    for out in make(tiny).generate(PROMPTS, sp):
        check_logprobs_exact(model, out, 4, 1e-9, kp=3)


@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("chunked", [False, True])
def test_logprobs_and_prompt_logprobs_match_a_plain_forward(shakespeare, backend, chunked):
    """The shipped model (float32), chunked prefill on (8-token chunks: the prompt's logits come from two steps)
    and off: within 1e-4 of a plain torch forward's log_softmax (measured: about 7e-6; float32 sums over 8 layers in
    another order, through the paged cache)."""
    llm = shakespeare[backend]
    if chunked:
        llm = LLM("shakespeare", backend=backend, enable_chunked_prefill=True, max_num_batched_tokens=8)
    sp = SamplingParams(temperature=0.8, seed=1, max_tokens=10, ignore_eos=True, logprobs=5, prompt_logprobs=5)
    out = llm.generate([LONG[:40]], sp)[0]
    P = len(out.prompt_token_ids)
    if chunked:
        assert P > 8 and sum(s.num_prefill_tokens > 0 for s in llm.engine.trace.steps) >= 2
    check_logprobs_exact(llm.model, out, 5, 1e-4)


def test_sampled_speculation_with_penalties_and_min_p_scores_each_token_at_its_slot():
    """Sampled draft-model speculation (the shipped draft, backend auto) with penalties and min_p: drafts are
    accepted, and every emitted token's logprob is still the plain forward's at its own position (1e-4, as above)."""
    llm = LLM("shakespeare", speculative={"method": "draft", "gamma": 3})
    sp = SamplingParams(temperature=0.7, seed=2, max_tokens=24, ignore_eos=True, logprobs=2, prompt_logprobs=2,
                        min_p=0.05, repetition_penalty=1.2, presence_penalty=0.3)
    out = llm.generate([LONG[:30]], sp)[0]
    assert llm.engine.spec_stats["accepted"] > 0 and len(out.outputs[0].token_ids) == 24
    check_logprobs_exact(llm.model, out, 2, 1e-4)


def test_prompt_logprobs_take_no_prefix_cache_hits_and_survive_preemption(tiny):
    """With prefix caching, a prompt_logprobs request recomputes the cached prefix (its logits are needed: vLLM v1
    does the same) and a plain request still hits it; under preemption (recompute) the entries are not repeated."""
    model, tok = tiny
    llm = make(tiny, enable_prefix_caching=True, block_size=4)
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    scored = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=2)
    llm.generate(LONG, greedy)
    hit = llm.generate(LONG, greedy)[0]
    out = llm.generate(LONG, scored)[0]
    assert hit.metrics.num_cached_tokens > 0 and out.metrics.num_cached_tokens == 0
    assert out.token_ids == hit.token_ids and len(out.prompt_logprobs) == len(out.prompt_token_ids)
    per_block = 8 * model.config.kv_bytes_per_token(8)
    small = make(tiny, block_size=8, max_model_len=64, kv_cache_bytes=12 * per_block)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, prompt_logprobs=1, logprobs=1)
    outs = small.generate(PROMPTS, sp)
    ref = make(tiny).generate(PROMPTS, sp)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    for o, r in zip(outs, ref):
        assert o.token_ids == r.token_ids and len(o.prompt_logprobs) == len(o.prompt_token_ids)
        assert o.prompt_logprobs == r.prompt_logprobs or all(
            a is None or all(abs(a[t] - b[t]) < 1e-9 for t in a) for a, b in zip(o.prompt_logprobs, r.prompt_logprobs))
        assert len(o.outputs[0].logprobs) == 24


def test_logprobs_are_of_the_raw_logits_not_the_processed_ones(tiny):
    """A processor that forces token 77 makes it certain to be sampled, but its logprob stays the model's own
    (raw logits, vLLM v1's default): finite, below 0, and what a plain forward says."""
    model, _ = tiny
    force = SamplingParams(temperature=0.7, seed=1, max_tokens=3, ignore_eos=True, logprobs=0, top_k=5,
                           logits_processors=[lambda ids, x: torch.where(torch.arange(len(x)) == 77, 0.0, -math.inf)])
    out = make(tiny).generate(PROMPTS[1], force)[0]
    c = out.outputs[0]
    assert c.token_ids == [77] * 3 and all(len(d) == 1 for d in c.logprobs)
    lp = plain_logprobs(model, out.prompt_token_ids + c.token_ids)
    P = len(out.prompt_token_ids)
    assert all(abs(d[77] - float(lp[P - 1 + i, 77])) < 1e-9 and d[77] < -0.01 for i, d in enumerate(c.logprobs))
    assert c.cumulative_logprob < 0 and out.prompt_logprobs is None


def test_best_of_returns_the_n_samples_with_the_highest_cumulative_logprob(tiny):
    """best_of=5, n=2 runs the same 5 seeded samples as n=5 (sample i is seeded seed + i), and returns the two whose
    cumulative logprob is highest, best first, each with its own index."""
    sp = dict(temperature=1.2, seed=7, max_tokens=10, ignore_eos=True)
    all5 = make(tiny).generate(PROMPTS[0], SamplingParams(n=5, logprobs=0, **sp))[0].outputs
    best = make(tiny).generate(PROMPTS[0], SamplingParams(n=2, best_of=5, **sp))[0].outputs
    ranked = sorted(all5, key=lambda c: -c.cumulative_logprob)
    assert len({tuple(c.token_ids) for c in all5}) == 5                  # five different samples to choose from
    assert [c.index for c in best] == [c.index for c in ranked[:2]]
    assert [c.token_ids for c in best] == [c.token_ids for c in ranked[:2]]
    assert all(abs(b.cumulative_logprob - r.cumulative_logprob) < 1e-9 for b, r in zip(best, ranked))
    assert best[0].cumulative_logprob >= best[1].cumulative_logprob and best[0].logprobs is None
    llm = make(tiny)
    llm.generate(PROMPTS[0], SamplingParams(n=1, best_of=3, **sp))
    assert llm.engine.block_manager.num_free == llm.engine.block_manager.num_blocks   # every sample freed


def test_a_penalised_request_is_batch_invariant_on_numba(shakespeare):
    """numba sums in a fixed order: a request with penalties, min_p and logprobs gives the same tokens and the same
    logprob bits alone and inside a batch of other requests (DESIGN rule 7)."""
    llm = shakespeare["numba"]
    sp = SamplingParams(temperature=0.9, seed=11, max_tokens=16, ignore_eos=True, min_p=0.05, top_k=50,
                        repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2, logprobs=3)
    alone = llm.generate(PROMPTS[2], sp)[0]
    others = [SamplingParams(temperature=1.0, seed=i, max_tokens=10 + 3 * i, ignore_eos=True) for i in range(3)]
    mixed = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[3], LONG], [others[0], sp, others[1], others[2]])[1]
    assert mixed.outputs[0].token_ids == alone.outputs[0].token_ids
    assert mixed.outputs[0].logprobs == alone.outputs[0].logprobs           # floats, compared exactly
    assert mixed.outputs[0].cumulative_logprob == alone.outputs[0].cumulative_logprob


def test_a_penalised_request_is_batch_invariant_float64(tiny):
    sp = SamplingParams(temperature=0.9, seed=11, max_tokens=16, ignore_eos=True, min_p=0.05,
                        repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2)
    alone = make(tiny).generate(PROMPTS[2], sp)[0].token_ids
    batch = make(tiny).generate(PROMPTS, [SamplingParams(temperature=1.0, seed=i, max_tokens=12) for i in range(2)]
                                + [sp, SamplingParams(temperature=0, max_tokens=5)])
    assert batch[2].token_ids == alone


def test_entries_put_the_token_first_and_add_the_top_k():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    d = entries(logits, [0, 0], 2)
    lp = torch.log_softmax(logits, -1)
    assert list(d[0]) == [0, 1, 2] and list(d[1]) in ([0, 1], [0, 2])
    assert d[0][1] == float(lp[0, 1]) and entries(logits, [2, 0], 0) == [{2: float(lp[0, 2])}, {0: float(lp[1, 0])}]


# ---------------------------------------------------------------- bad input, before anything is queued
@pytest.mark.parametrize("kw, match", [
    (dict(temperature=0, best_of=3), r"best_of=3 with greedy sampling \(temperature=0"),
    (dict(temperature=0, n=2, best_of=2), r"best_of=2 with greedy sampling"),
    (dict(n=3, best_of=2), r"best_of must be None or an integer >= n=3, got 2"),
    (dict(min_p=1.5), r"min_p must be a number in \[0, 1\], got 1.5"),
    (dict(repetition_penalty=0), r"repetition_penalty must be a number > 0"),
    (dict(frequency_penalty=-3), r"frequency_penalty must be a number in \[-2, 2\]"),
    (dict(logprobs=-1), r"logprobs must be None or an integer >= 0, got -1"),
])
def test_bad_sampling_options_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_logprobs_beyond_the_vocabulary_are_refused_before_queuing(tiny):
    llm = make(tiny)
    V = tiny[0].config.vocab_size
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=rf"{name}={V + 1} asks for more tokens than the model's vocabulary "
                                             rf"has \(V={V}\)"):
            llm.generate(PROMPTS[:2], [SamplingParams(max_tokens=2), SamplingParams(**{name: V + 1})])
        assert not llm.engine.has_unfinished_requests() and not llm.engine.requests
    out = llm.generate(PROMPTS[1], SamplingParams(max_tokens=2, logprobs=V, seed=0))[0]   # the whole vocabulary: fine
    assert len(out.outputs[0].logprobs[0]) == V
