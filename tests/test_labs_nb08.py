"""Notebook 08's core exercise: check_verify_rule tries the reader's acceptance rule on rows with a certain answer,
then in the engine (verify=) with a chi-square test, and names the mistake."""
import pytest
import torch

from minillm.core.verify import verify_sampled
from minillm.labs import check_verify_rule


def engine_rule(p, q, draft, generator):
    """The engine's own rule, called from a reader's function: checkers refuse minillm's own objects as answers."""
    return verify_sampled(p, q, draft, generator)


def rule(accept, replacement, bonus):
    """Speculative sampling with its three parts replaceable: accept(p_i, q_i, x, u) -> bool;
    replacement(p_i, q_i, g) -> token; bonus(p, k, g) -> (n, token)."""
    def verify(p, q, draft, g):
        for i, x in enumerate(draft):
            if not accept(p[i], q[i], x, float(torch.rand((), generator=g, dtype=torch.float64))):
                return i, replacement(p[i], q[i], g)
        return bonus(p, draft, g)
    return verify


def exact_accept(p, q, x, u):
    return u < min(1.0, float(p[x] / q[x]))


def exact_residual(p, q, g):
    r = (p - q).clamp_min(0)
    return int(torch.multinomial(r / r.sum(), 1, generator=g))


def exact_bonus(p, draft, g):
    return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=g))


def cumsum_residual(p, q, g):       # inverse CDF on the residual, not divided by its sum
    r = (p - q).clamp_min(0)
    u = torch.rand((), generator=g, dtype=r.dtype)
    return int(torch.searchsorted(r.cumsum(0), u, right=True))


def no_min(p, q, x, u):             # a Bernoulli draw with probability p/q, which exceeds 1
    return bool(torch.bernoulli(p[x] / q[x]))


def test_the_engine_rule_and_a_global_generator_rule_pass():
    result = check_verify_rule(engine_rule)
    assert result.passed and result.kind == "core" and "chi-square" in result.message, repr(result)
    assert check_verify_rule(rule(exact_accept, exact_residual, exact_bonus)).passed


@pytest.mark.parametrize("wrong,named", [
    (rule(lambda p, q, x, u: True, exact_residual, exact_bonus), "accept x with probability min(1, p(x) / q(x))"),
    (rule(lambda p, q, x, u: u < min(1.0, float(q[x] / p[x])) if p[x] > 0 else True, exact_residual, exact_bonus),
     "although the target gives it p = 0"),                                  # the ratio inverted
    (rule(no_min, exact_residual, exact_bonus), "capped at 1"),
    (rule(exact_accept, lambda p, q, g: int(torch.multinomial(q, 1, generator=g)), exact_bonus), "not from q or p"),
    (rule(exact_accept, lambda p, q, g: int(torch.multinomial(p, 1, generator=g)), exact_bonus), "not from q or p"),
    (rule(exact_accept, cumsum_residual, exact_bonus), "residual not divided by its sum"),
    (rule(exact_accept, exact_residual, lambda p, d, g: (len(d) - 1, d[-1])), "no bonus token"),
    (rule(exact_accept, exact_residual, lambda p, d, g: (len(d), int(torch.multinomial(p[-2], 1, generator=g)))),
     "the bonus token is sampled from p[k]"),                               # the bonus from the last draft's slot
])
def test_wrong_rules_fail_and_name_the_mistake(wrong, named):
    result = check_verify_rule(wrong)
    assert not result.passed and named in result.message, repr(result)


def test_the_chi_square_in_the_engine_catches_a_wrong_distribution(monkeypatch):
    """Without the single-row probes, the engine run alone fails a rule that resamples from p (no token it emits
    is impossible, only their frequencies are off) and passes the exact one."""
    import minillm.labs.nb08_speculative as nb08
    monkeypatch.setattr(nb08, "_probe_rule", lambda rule: None)
    result = check_verify_rule(rule(exact_accept, lambda p, q, g: int(torch.multinomial(p, 1, generator=g)),
                                    exact_bonus))
    assert not result.passed and "do not follow the target's distribution" in result.message, repr(result)
    assert "p-value" in result.message
    assert check_verify_rule(engine_rule).passed


def test_bad_rules_fail_cleanly_and_the_next_attempt_passes():
    def crashes(p, q, draft, g):
        torch.set_default_dtype(torch.float16)
        torch.manual_seed(123)
        raise IndexError("my bug")

    first = check_verify_rule(engine_rule)
    result = check_verify_rule(crashes)
    assert not result.passed and "IndexError: my bug" in result.message, repr(result)
    assert torch.get_default_dtype() == torch.float32
    result = check_verify_rule(lambda p, q, draft, g: [0, 1, 2])
    assert not result.passed and "must return (n accepted, token)" in result.message, repr(result)
    result = check_verify_rule(lambda p, q, draft, g: (0, 99))
    assert not result.passed and "token 99 is not a token id" in result.message, repr(result)
    result = check_verify_rule(lambda p, q: (0, 0))
    assert not result.passed and "wrong signature" in result.message, repr(result)
    assert check_verify_rule(engine_rule).message == first.message        # same run: nothing left behind
