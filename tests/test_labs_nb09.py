"""Notebook 09's core exercise: check_kd_loss names each common mistake, plugs the loss into train(), and
survives bad student code."""
import pytest
import torch
import torch.nn.functional as F

from minillm.labs import check_kd_loss


def kd(s, t, y, T, lam, t2=True, swap=False, student_T=True, teacher_T=True, ce=True, detach=False):
    """The exercise's solution, with the common mistakes as switches."""
    log_q = F.log_softmax((s.detach() if detach else s) / (T if student_T else 1.0), -1)
    log_p = F.log_softmax(t / (T if teacher_T else 1.0), -1)
    a, b = (log_q, log_p) if swap else (log_p, log_q)
    kl = (a.exp() * (a - b)).sum(-1).mean()
    loss = (T * T if t2 else 1.0) * kl
    return loss + lam * F.cross_entropy(s.flatten(0, 1), y.flatten()) if ce else loss


def check(**mistake):
    return check_kd_loss(lambda s, t, y, T, lam: kd(s, t, y, T, lam, **mistake))


def test_the_solution_passes_in_the_training_loop():
    result = check()
    assert result and result.kind == "core" and "minillm.training.train.train" in result.message, repr(result)


MISTAKES = [
    (dict(t2=False), "no T^2 factor"),
    (dict(swap=True), "KL direction swapped"),
    (dict(ce=False), "the hard-label term is missing"),
]


@pytest.mark.parametrize("mistake,said", MISTAKES)
def test_a_common_mistake_is_named(mistake, said):
    result = check(**mistake)
    assert not result and said in result.message, repr(result)


def test_temperature_on_one_side_is_named():
    result = check(teacher_T=False)
    assert not result and "temperature applied to the student only" in result.message, repr(result)
    result = check(student_T=False)
    assert not result and "temperature applied to the teacher only" in result.message, repr(result)


def test_lambda_mix_is_named():
    result = check_kd_loss(lambda s, t, y, T, lam: (1 - lam) * kd(s, t, y, T, lam, ce=False)
                           + lam * F.cross_entropy(s.flatten(0, 1), y.flatten()))
    assert not result and "lambda mixes the two terms" in result.message, repr(result)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")
def test_kl_div_mean_reduction_is_named():
    def kl_div_mean(s, t, y, T, lam):
        kl = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True, reduction="mean")
        return T * T * kl + lam * F.cross_entropy(s.flatten(0, 1), y.flatten())
    result = check_kd_loss(kl_div_mean)
    assert not result and "averaged over the vocabulary too" in result.message, repr(result)


def test_right_value_wrong_gradient_is_caught_by_training():
    result = check(detach=True)          # KL's gradient cut: the values match, the run does not
    assert not result and "the gradient differs" in result.message, repr(result)


def test_bad_student_code_fails_cleanly_and_leaves_nothing_behind():
    result = check_kd_loss(lambda s, t, y, T, lam: kd(s, t, y, T, lam).item())
    assert not result and "expected a scalar tensor" in result.message, repr(result)
    result = check_kd_loss(lambda s, t, y, T, lam: torch.tensor(kd(s, t, y, T, lam).item()))
    assert not result and "the loss has no gradient" in result.message, repr(result)

    def raises(s, t, y, T, lam):
        torch.manual_seed(123)
        raise KeyError("boom")
    rng = torch.get_rng_state()
    assert "KeyError" in check_kd_loss(raises).message
    assert torch.equal(torch.get_rng_state(), rng)
    assert check(), "the next, correct attempt passes"
