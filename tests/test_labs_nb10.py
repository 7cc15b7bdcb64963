"""Notebook 10's exercises: check_min_p (warm-up), check_penalties (the reader's penalties as a logits processor in the
engine) and check_token_mask (the reader's structured-output mask step, compared with the engine's masks and run as
a constrained generation). Each plausible mistake fails with a message naming it; a raising or wrong-shape answer
fails cleanly and the next, correct attempt passes."""
import pytest
import torch

from minillm.core.sampling import apply_penalties
from minillm.labs import check_min_p, check_penalties, check_token_mask


# ---------------------------------------------------------------- min-p (warm-up)
def min_p(probs, m):
    kept = probs.masked_fill(probs < m * probs.max(), 0.0)
    return kept / kept.sum()


@pytest.mark.parametrize("wrong,named", [
    (lambda p, m: (lambda k: k / k.sum())(p.masked_fill(p < m, 0.0)), "the threshold is relative"),
    (lambda p, m: p.masked_fill(p < m * p.max(), 0.0), "renormalise"),
    (lambda p, m: (lambda k: k / k.sum())(p.masked_fill(p <= m * p.max(), 0.0)), "p exactly min_p * max(p)"),
])
def test_min_p_mistakes_are_named(wrong, named):
    assert check_min_p(min_p).passed
    result = check_min_p(wrong)
    assert not result.passed and named in result.message, repr(result)


# ---------------------------------------------------------------- penalties as a logits processor (core)
def penalties(prompt, output, logits, rep, freq, pres, *, negatives_divided=False, skip_prompt=False,
              count_prompt=False, presence_per_count=False, in_place=False, as_list=False):
    """A plain loop over the seen tokens, with switches for the usual mistakes."""
    x = logits if in_place else logits.clone()
    for t in set(output) | (set() if skip_prompt else set(prompt)):
        x[t] = x[t] / rep if x[t] > 0 or negatives_divided else x[t] * rep
    counted = list(output) + (list(prompt) if count_prompt else [])
    for t in set(counted):
        c = counted.count(t)
        x[t] -= freq * c + pres * (c if presence_per_count else 1)
    return x.tolist() if as_list else x


def with_(**kw):
    return lambda p, o, x, r, f, q: penalties(p, o, x, r, f, q, **kw)


def engine(prompt, output, logits, rep, freq, pres):
    return apply_penalties(logits, prompt, output, rep, freq, pres)


def test_the_engine_function_and_a_plain_loop_pass():
    result = check_penalties(engine)
    assert result.passed and result.kind == "core" and "the same tokens as the engine's own penalties" in \
        result.message, repr(result)
    assert check_penalties(with_()).passed


@pytest.mark.parametrize("wrong,named", [
    (with_(negatives_divided=True), "MULTIPLY a negative one"),
    (with_(skip_prompt=True), "skipped the prompt's tokens"),
    (with_(count_prompt=True), "counted the prompt's tokens too"),
    (with_(presence_per_count=True), "presence subtracts it once"),
    (with_(in_place=True), "changed the logits tensor it was given (in place)"),
    (with_(as_list=True), "not a torch tensor"),
])
def test_penalty_mistakes_are_named(wrong, named):
    result = check_penalties(wrong)
    assert not result.passed and named in result.message, repr(result)


def test_a_processor_that_fails_only_inside_the_engine_is_reported(monkeypatch):
    """Past the unit cases, the engine run catches a processor that works on small vocabularies only: the engine
    turns its exception into the request's error, and the checker reports it."""
    def small_only(p, o, x, r, f, q):
        assert x.shape[0] < 1000, "a vocabulary this large is not handled"
        return penalties(p, o, x, r, f, q)
    result = check_penalties(small_only)
    assert not result.passed and "inside the engine" in result.message and "not handled" in result.message, \
        repr(result)


# ---------------------------------------------------------------- the mask step (core)
def token_mask(trans, accepting, dist, token_bytes, eos, state, tokens_left, *, eos_rule="accepting",
               length_aware=True, off_by_one=False, first_byte_only=False, empty_allowed=False, from_start=False,
               as_float=False, drop_last=False):
    """Walk each token's bytes through the DFA from `state`, with switches for the usual mistakes."""
    mask = torch.zeros(len(token_bytes), dtype=torch.bool)
    start = 0 if from_start else state
    for t, data in enumerate(token_bytes):
        if not data:
            mask[t] = empty_allowed
            continue
        s = start
        for b in data[:1] if first_byte_only else data:
            s = int(trans[s, b])
            if s < 0:
                break
        if s >= 0 and (not length_aware or int(dist[s]) + (0 if off_by_one else 1) <= tokens_left):
            mask[t] = True
    mask[eos] = {"accepting": bool(accepting[state]), "never": False, "always": True}[eos_rule]
    if as_float:
        return mask.float()
    return mask[:-1] if drop_last else mask


def mask_with(**kw):
    return lambda *args: token_mask(*args, **kw)


def test_a_plain_byte_walk_passes_and_matches_guided_regex_in_the_engine():
    result = check_token_mask(mask_with())
    assert result.passed and result.kind == "core" and "token for token as guided_regex" in result.message, \
        repr(result)


@pytest.mark.parametrize("wrong,named", [
    (mask_with(eos_rule="never"), "the end token must be allowed"),
    (mask_with(eos_rule="always"), "allow EOS only where accepting[state]"),
    (mask_with(length_aware=False), "not length-aware"),
    (mask_with(off_by_one=True), "off by one"),
    (mask_with(first_byte_only=True), "walk EVERY byte of the token"),
    (mask_with(empty_allowed=True), "never advances the pattern"),
    (mask_with(from_start=True), "not from state 0"),
    (mask_with(as_float=True), "expected bool"),
    (mask_with(drop_last=True), "expected (4096,)"),
])
def test_mask_mistakes_are_named(wrong, named):
    result = check_token_mask(wrong)
    assert not result.passed and named in result.message, repr(result)


# ---------------------------------------------------------------- bad answers fail cleanly, nothing left behind
def test_raising_or_malformed_answers_fail_cleanly_and_the_next_attempt_passes():
    def crashes(*args):
        raise IndexError("list index out of range")
    for check, good in [(check_penalties, engine), (check_token_mask, mask_with())]:
        result = check(crashes)
        assert not result.passed and "IndexError" in result.message, repr(result)
        assert not check(lambda *args: None).passed
        result = check(lambda x: x)                                   # the wrong signature
        assert not result.passed and "wrong signature" in result.message, repr(result)
        assert check(good).passed
    result = check_penalties(lambda p, o, x, r, f, q: x[:-1].clone())   # one logit short
    assert not result.passed and "shape" in result.message, repr(result)
    state = torch.get_rng_state()
    assert check_min_p(lambda p, m: torch.rand(3)).passed is False     # draws from the global generator: restored
    assert torch.equal(torch.get_rng_state(), state)


def test_stubs_fail_with_not_implemented():
    def stub(*args):
        raise NotImplementedError()
    for check in (check_min_p, check_penalties, check_token_mask):
        result = check(stub)
        assert not result.passed and "not implemented" in result.message, repr(result)
