"""Shared by tests/test_parallel_*.py: the module's rank group, and the engine comparisons of DESIGN.md rule 7 between
one rank and several."""
import pytest

from minillm import LLM, SamplingParams
from minillm.parallel import start_group

PROMPTS = ["ROMEO:", "To be, or not to be", "KING HENRY:\nWhat news", "First Citizen:\nBefore we proceed"]
TIE = 1e-4          # DESIGN.md rule 7: a float32 comparison stops where the reference's top-2 margin is below this
SMALL = dict(max_model_len=128)     # a small KV pool: quick to allocate on every rank


def module_group(size: int = 2):
    """A fixture: a rank group for the module (start_group: LLM(..., tensor_parallel_size=size) reuses it), closed
    at its end; starting one costs a process and torch's import. In a test module: `group = module_group()`."""
    @pytest.fixture(scope="module")
    def group():
        g = start_group(size)
        yield g
        g.close()
    return group


def engine(**options) -> LLM:
    return LLM("shakespeare", **SMALL, **options)


def greedy(llm: LLM, max_tokens: int = 16, logprobs: int = 2) -> list:
    """Greedy outputs of PROMPTS with each token's logprob and the top-2 (ignore_eos: exact lengths)."""
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)
    return [o.outputs[0] for o in llm.generate(PROMPTS, sp)]


def assert_logprobs_close(ref: list, got: list, tol: float):
    """Same tokens, and every logprob reported (the chosen token's and the top 2) within tol."""
    for r, g in zip(ref, got):
        assert g.token_ids == r.token_ids
        for dr, dg in zip(r.logprobs, g.logprobs):
            assert dr.keys() == dg.keys()
            assert max(abs(dr[t] - dg[t]) for t in dr) < tol, (dr, dg)


def compare_up_to_near_tie(ref: list, got: list) -> int:
    """float32: tokens equal at every step up to the first where the reference's top-2 logprob margin (= its
    top-2 logit margin) is below TIE; from a near-tie on either token is right. -> steps compared."""
    compared = 0
    for r, g in zip(ref, got):
        for step, (tok, lp) in enumerate(zip(r.token_ids, r.logprobs)):
            top = sorted(lp.values(), reverse=True)
            if top[0] - top[1] < TIE:
                break
            assert g.token_ids[step] == tok, f"step {step}: {g.token_ids[step]} != {tok} (margin {top[0] - top[1]:.2g})"
            compared += 1
    return compared
