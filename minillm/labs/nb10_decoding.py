"""Checkers for notebook 10_decoding_and_structured_output.

The two core exercises plug the reader's code into the engine's sampler: penalties as a logits processor
(SamplingParams(logits_processors=[...]), the public hook), and one structured-output mask step (the legal tokens of
a DFA state, length-aware) as the processor that constrains a generation. Each is first compared with the engine's
own code on cases that name the usual mistakes, then run in the engine on the shipped model, seeded, where its
tokens must equal those of the engine's own option (repetition_penalty=..., guided_regex=...).
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from .common import _close, checker


@functools.lru_cache(maxsize=1)
def _shipped():
    """(model, tokenizer) of the shipped model, loaded once per process: the weights are only read; every checker
    builds its own engine around them."""
    from ..formats.loader import load
    return load("shakespeare")


def _engine(**options):
    from ..engine.llm import LLM
    model, tok = _shipped()
    return LLM(model, tokenizer=tok, **options)


# ---------------------------------------------------------------- warm-up: min-p
@checker
def check_min_p(fn):
    """fn(probs (V,), min_p) -> the distribution min-p sampling draws from: tokens with p >= min_p * max(p) kept,
    renormalised"""
    from ..core.sampling import probs_from_logits
    g = torch.Generator().manual_seed(10)
    cases = [(torch.tensor([0.4, 0.2, 0.2, 0.1, 0.1], dtype=torch.float64), 0.5)]        # 0.2 = 0.5 * 0.4: kept
    cases += [(torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * s, -1), m)
              for V, s, m in [(12, 2.0, 0.1), (40, 0.5, 0.3), (7, 4.0, 0.05), (9, 1.0, 0.0), (5, 1.0, 1.0)]]
    for probs, m in cases:
        want = probs_from_logits(probs.log(), 1.0, min_p=m).double()                     # the engine's min-p
        absolute = probs.masked_fill(probs < m, 0.0)
        kept = probs.masked_fill(probs < m * probs.max(), 0.0)
        _close(f"V={len(probs)}, min_p={m}", fn(probs.clone(), m), want, atol=1e-6, mistakes={
            "you kept tokens with p >= min_p; the threshold is relative: p >= min_p * (the largest p)":
                absolute / absolute.sum(),                            # nan if none is left, as yours
            "the kept probabilities do not sum to 1: renormalise them": kept,
            "you dropped a token with p exactly min_p * max(p): keep p >= the threshold (the engine does)":
                (lambda k: k / k.sum())(probs.masked_fill(probs <= m * probs.max(), 0.0)) if 0 < m < 1 else want})
    return "matches minillm.core.sampling.probs_from_logits(..., min_p=...): a threshold relative to the top token"


# ---------------------------------------------------------------- core: penalties as a logits processor
def _penalised(prompt, output, logits, rep, freq, pres, *, negatives="multiply", prompt_in_rep=True,
               count_prompt=False, presence_per_count=False, frequency_once=False, rep_last=False):
    """The penalties written plainly (float64), with switches that reproduce the usual mistakes."""
    x = logits.double().clone()                                                 # (V,)
    counts = torch.bincount(torch.tensor(list(output) + (list(prompt) if count_prompt else []), dtype=torch.long),
                            minlength=x.shape[0]).double()                      # (V,)
    seen = torch.bincount(torch.tensor(list(output) + (list(prompt) if prompt_in_rep else []), dtype=torch.long),
                          minlength=x.shape[0]) > 0                             # (V,)

    def repetition(x):
        neg = x * rep if negatives == "multiply" else x / rep
        return torch.where(seen, torch.where(x > 0, x / rep, neg), x)

    if not rep_last:
        x = repetition(x)
    x = x - freq * (counts > 0).double() if frequency_once else x - freq * counts
    x = x - pres * (counts if presence_per_count else (counts > 0).double())
    return repetition(x) if rep_last else x


PENALTY_MISTAKES = {
    "a negative logit divided by the repetition penalty moves toward 0, so the token became MORE likely: CTRL (and "
    "HF, vLLM) divide a positive logit and MULTIPLY a negative one": dict(negatives="divide"),
    "the repetition penalty skipped the prompt's tokens: CTRL / HF / vLLM penalise a token seen in the prompt OR the "
    "output": dict(prompt_in_rep=False),
    "frequency / presence counted the prompt's tokens too: OpenAI and vLLM count the generated tokens "
    "(output_ids) only": dict(count_prompt=True),
    "the presence penalty was subtracted once per occurrence (that is the frequency penalty): presence subtracts it "
    "once for any token that appeared": dict(presence_per_count=True),
    "the frequency penalty was subtracted once per token: it is frequency times the token's count in the output":
        dict(frequency_once=True),
    "the repetition penalty came after frequency / presence: vLLM applies it first, to the raw logit":
        dict(rep_last=True),
}

PROMPT_TEXT, PENALTY_TOKENS = "My lord,", 24        # greedy decoding of this prompt loops ("the King of England, ...")


def _penalty_cases():
    """(prompt ids, output ids, logits (V,), repetition, frequency, presence): each penalty alone, then together."""
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0, -0.5, 3.0, 1.5, -2.0])   # (10,)
    prompt, output = [0, 5, 3, 3, 8], [1, 2, 2, 6, 8, 8, 8]
    g = torch.Generator().manual_seed(3)
    big = torch.randn(64, generator=g) * 3                                           # (64,)
    bp, bo = torch.randint(0, 64, (12,), generator=g).tolist(), torch.randint(0, 64, (20,), generator=g).tolist()
    return [(prompt, output, logits, 2.0, 0.0, 0.0), (prompt, output, logits, 1.0, 0.5, 0.0),
            (prompt, output, logits, 1.0, 0.0, 0.75), (prompt, output, logits, 1.5, 0.4, 0.3),
            (prompt, output, logits, 0.8, -0.5, -0.25), (prompt, [], logits, 1.3, 0.5, 0.5),
            (bp, bo, big, 1.7, 0.3, 0.6)]


def _check_penalty_cases(fn):
    from ..core.sampling import apply_penalties
    for prompt, output, logits, rep, freq, pres in _penalty_cases():
        case = f"prompt {prompt}, output {output}, repetition={rep}, frequency={freq}, presence={pres}"
        before = logits.clone()
        got = fn(list(prompt), list(output), logits, rep, freq, pres)
        assert isinstance(got, torch.Tensor), (f"{case}: returned {type(got).__name__}, not a torch tensor (the "
                                               f"engine's processors take and return torch tensors of shape (V,))")
        assert torch.equal(logits, before), (f"{case}: your function changed the logits tensor it was given (in "
                                             f"place): return a new tensor; the engine still reads the raw logits "
                                             f"afterwards (logprobs are of the raw logits)")
        want = apply_penalties(logits, prompt, output, rep, freq, pres)
        mistakes = {why: _penalised(prompt, output, logits, rep, freq, pres, **kw)
                    for why, kw in PENALTY_MISTAKES.items()}
        _close(case, got, want, atol=1e-5, mistakes=mistakes)


@checker(kind="core", signature="prompt_ids, output_ids, logits, repetition, frequency, presence")
def check_penalties(fn):
    """fn(prompt_ids, output_ids, logits (V,), repetition, frequency, presence) -> new logits (V,).
    Compared with the engine's apply_penalties on cases that name the usual mistakes, then plugged into the engine
    as a logits processor (greedy and seeded T = 1 on the shipped model): its tokens must equal those of the
    engine's own repetition_penalty / frequency_penalty / presence_penalty."""
    from ..core.sampling import SamplingParams
    _check_penalty_cases(fn)
    llm = _engine()
    prompt = llm.engine.validate(PROMPT_TEXT)                                 # the ids the engine will see
    settings = [(0.0, None, 1.3, 0.0, 0.0), (0.0, None, 1.0, 0.6, 0.4), (1.0, 7, 1.2, 0.3, 0.3)]
    mine, theirs = [], []
    for T, seed, rep, freq, pres in settings:
        def processor(output_ids, logits, rep=rep, freq=freq, pres=pres):    # the public hook's signature
            return fn(list(prompt), list(output_ids), logits, rep, freq, pres)
        common = dict(temperature=T, seed=seed, max_tokens=PENALTY_TOKENS, ignore_eos=True)
        mine.append(SamplingParams(logits_processors=[processor], **common))
        theirs.append(SamplingParams(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres, **common))
    got = [o.outputs[0] for o in llm.generate([PROMPT_TEXT] * len(mine), mine)]
    want = [o.outputs[0] for o in llm.generate([PROMPT_TEXT] * len(theirs), theirs)]
    for (T, seed, rep, freq, pres), g, w in zip(settings, got, want):
        what = (f"{'greedy' if T == 0 else f'T = {T:g}, seed {seed}'}, repetition={rep}, frequency={freq}, "
                f"presence={pres}")
        assert g.finish_reason != "error", f"inside the engine ({what}) your processor failed: {g.error}"
        if g.token_ids != w.token_ids:
            i = next(i for i, (a, b) in enumerate(zip(g.token_ids, w.token_ids)) if a != b)
            raise AssertionError(f"inside the engine ({what}): token {i} after {PROMPT_TEXT!r} is {g.token_ids[i]} "
                                 f"with your processor, {w.token_ids[i]} with the engine's own penalties")
    plain = llm.generate([PROMPT_TEXT], SamplingParams(temperature=0, max_tokens=PENALTY_TOKENS, ignore_eos=True))
    loops = _repeats(plain[0].outputs[0].token_ids), _repeats(got[0].token_ids)
    return (f"the same tokens as the engine's own penalties on {len(settings)} runs of the shipped model (greedy and "
            f"T = 1); greedy {PROMPT_TEXT!r} repeats {loops[0]} trigrams in {PENALTY_TOKENS} tokens without a "
            f"penalty, {loops[1]} with your repetition penalty 1.3")


def _repeats(ids, n: int = 3) -> int:
    """How many of the n-grams of ids occurred earlier in ids (a loop repeats many)."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) - len(set(grams))


# ---------------------------------------------------------------- core: one structured-output mask step
MASK_PATTERNS = [r"(Romeo|Juliet) (loves|hates) [a-z]+( [a-z]+)?\.", r"[0-9]{1,3}(\.[0-9]+)?"]
MASK_RUN = (MASK_PATTERNS[0], 8, 6)           # the constrained generation: pattern, samples, max_tokens (tight)


def _mask_inputs(index):
    """What the reader's function is given: the DFA's (S, 256) transitions, (S,) accepting, (S,) fewest tokens to
    a complete match, each token's bytes (b'' for tokens that are not text: BOS, EOS, <unk>, empty pieces), EOS."""
    S, vocab = index.num_states, index.vocab
    token_bytes = [b if text else b"" for b, text in zip(vocab.bytes, vocab.text)]
    return index.dfa.trans.copy(), index.dfa.accepting.copy(), index.dist[:S].copy(), token_bytes, vocab.eos


def _as_mask(got, V: int, case: str) -> torch.Tensor:
    try:
        got = torch.as_tensor(np.asarray(got.detach() if isinstance(got, torch.Tensor) else got))
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError(f"{case}: returned {type(got).__name__} {got!r:.60}, not a mask (a (V,) bool tensor or "
                             "array)") from None
    assert got.shape == (V,), f"{case}: your mask has shape {tuple(got.shape)}, expected ({V},): one bool per token"
    assert got.dtype == torch.bool, f"{case}: your mask has dtype {got.dtype}, expected bool (True: allowed)"
    return got


def _walk(trans, state: int, data: bytes) -> tuple[int, int]:
    """(state after data, or -1; the index of the byte that died, or -1)."""
    for j, b in enumerate(data):
        state = int(trans[state, b])
        if state < 0:
            return -1, j
    return state, -1


def _mask_problem(fn, index, inputs, state: int, left: int, got: torch.Tensor, want: torch.Tensor) -> str:
    """Name what is wrong with the reader's mask for one state, from the first token it gets wrong."""
    trans, accepting, dist, token_bytes, eos = inputs
    case = f"state {state} ({'accepting' if accepting[state] else 'not accepting'}), tokens_left={left}"
    if bool(got[eos]) != bool(want[eos]):
        if accepting[state]:
            return (f"{case}: EOS (token {eos}) is not allowed, but the state accepts: the pattern is complete "
                    "there, so the end token must be allowed (or the output can never stop)")
        return (f"{case}: EOS (token {eos}) is allowed, but the state does not accept: the output would end "
                "mid-pattern; allow EOS only where accepting[state]")
    if state != 0 and torch.equal(got, index.mask(0, left)):
        return f"{case}: your mask is the start state's: walk the tokens' bytes from `state`, not from state 0"
    wrong = torch.nonzero(got != want).flatten().tolist()
    for t in wrong:
        if not token_bytes[t]:
            return (f"{case}: token {t} has no bytes (BOS, <unk> or an empty piece) but your mask allows it: a token "
                    "that prints nothing never advances the pattern; never allow it")
    t = wrong[0]
    data = token_bytes[t]
    end, died = _walk(trans, state, data)
    if got[t]:                                          # allowed, but should not be
        if end < 0:
            return (f"{case}: token {t} {data!r} is allowed, but its byte {died} ({data[died:died + 1]!r}) has no "
                    f"transition (trans = -1): walk EVERY byte of the token from `state`, not just the first")
        which = (f"{case}: token {t} {data!r} leads to state {end}, which needs {int(dist[end])} more token(s) to "
                 f"complete the pattern, so it takes 1 + {int(dist[end])} > {left} tokens left")
        return f"{which}: " + _length_mistake(fn, index, inputs)
    return (f"{case}: token {t} {data!r} walks to state {end} and completes within the {left} tokens left "
            f"(1 + dist = {1 + int(dist[end])}), but your mask forbids it")


def _length_mistake(fn, index, inputs) -> str:
    """Which length mistake: the reader's mask on a (state, tokens_left) where no limit, the limit off by one and
    the right limit give three different masks."""
    trans, accepting, dist, token_bytes, eos = inputs
    for left in (1, 2, 3, 4):
        for s in range(index.num_states):
            right, loose, free = index.mask(s, left), index.mask(s, left + 1), index.mask(s)
            if torch.equal(right, loose) or torch.equal(loose, free):
                continue
            got = _as_mask(fn(trans.copy(), accepting.copy(), dist.copy(), list(token_bytes), eos, s, left),
                           len(token_bytes), f"state {s}, tokens_left={left}")
            if torch.equal(got, free):
                break
            if torch.equal(got, loose):
                return ("off by one: the token itself takes one of the tokens left; allow it only if "
                        "1 + dist[next state] <= tokens_left")
            break
    return "your mask is not length-aware; allow a token only if 1 + dist[next state] <= tokens_left"


def _check_mask_states(fn, tok):
    from ..guided import compile_regex
    for pattern in MASK_PATTERNS:
        index = compile_regex(pattern, tok)                   # the engine's own index: its masks are the reference
        inputs = _mask_inputs(index)
        S, V = index.num_states, index.vocab.size
        cases = [(s, 10_000) for s in range(S)]               # every state, no length limit
        rng = np.random.default_rng(len(pattern))
        cases += [(int(s), left) for left in (1, 2, 3) for s in rng.choice(S, size=min(S, 6), replace=False)]
        for state, left in cases:
            trans, accepting, dist, token_bytes, eos = (x.copy() if hasattr(x, "copy") else x for x in inputs)
            case = f"pattern {pattern!r}, state {state}, tokens_left={left}"
            got = _as_mask(fn(trans, accepting, dist, list(token_bytes), eos, state, left), V, case)
            want = index.mask(state, left)
            if not torch.equal(got, want):
                problem = _mask_problem(fn, index, inputs, state, left, got, want)
                raise AssertionError(f"pattern {pattern!r}: {problem}")
    return len(MASK_PATTERNS)


@checker(kind="core", signature="trans, accepting, dist, token_bytes, eos, state, tokens_left")
def check_token_mask(fn):
    """fn(trans (S, 256), accepting (S,), dist (S,), token_bytes (V list of bytes), eos, state, tokens_left)
    -> (V,) bool, the tokens allowed in `state`. Compared with the engine's own masks (TokenIndex.mask) on every
    state of two patterns and with few tokens left, then run as the mask of a constrained generation in the engine
    (T = 1, seeded, a tight max_tokens): every output must match, token for token what guided_regex samples."""
    from ..core.sampling import SamplingParams
    from ..guided import compile_regex
    _, tok = _shipped()
    _check_mask_states(fn, tok)
    pattern, samples, max_tokens = MASK_RUN
    llm = _engine(max_num_seqs=2 * samples)
    index = compile_regex(pattern, tok)
    trans, accepting, dist, token_bytes, eos = _mask_inputs(index)
    prompt = "ROMEO:"
    budget = min(max_tokens, llm.engine.config.max_model_len - len(llm.engine.validate(prompt)))

    def processor(output_ids, logits):                       # the reader's mask as the engine's GuidedProcessor
        state = index.walk(index.start, output_ids)          # the DFA state after this sequence's tokens
        assert state >= 0, f"the output {output_ids} left the pattern (your mask allowed a token it should not)"
        mask = _as_mask(fn(trans.copy(), accepting.copy(), dist.copy(), list(token_bytes), eos, state,
                           budget - len(output_ids)), logits.shape[-1], f"state {state}")
        return logits + torch.zeros(logits.shape[-1]).masked_fill(~mask, float("-inf"))   # (V,) as the engine adds

    mine = [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, logits_processors=[processor])
            for i in range(samples)]
    theirs = [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, guided_regex=pattern)
              for i in range(samples)]
    got = [o.outputs[0] for o in llm.generate([prompt] * samples, mine)]
    llm.engine.jump_forward = False                          # sample every token, as the reader's run does
    want = [o.outputs[0] for o in llm.generate([prompt] * samples, theirs)]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.finish_reason != "error", f"inside the engine (sample {i}) your mask failed: {g.error}"
        assert index.dfa.match(g.text), (f"inside the engine, sample {i} ({max_tokens} tokens at most) is {g.text!r}, "
                                         f"which does not match {pattern!r}: the mask let it run out of tokens "
                                         "(length-aware?) or end early")
        assert g.token_ids == w.token_ids, (f"inside the engine, sample {i}: {g.text!r} with your mask, {w.text!r} "
                                            "with the engine's guided_regex (same seed)")
    return (f"the engine's masks on every state of {len(MASK_PATTERNS)} patterns; in the engine, {samples} samples "
            f"at T = 1 within max_tokens={max_tokens} all match {pattern!r}, token for token as guided_regex: "
            f"{got[0].text!r}, {got[1].text!r}, ...")
