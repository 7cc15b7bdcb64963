"""Notebook 04's core exercise: check_flash_row names each common mistake, and survives bad student code."""
import numpy as np
import pytest

from minillm.labs import check_flash_row


def flash_row(q, k, v, block, rescale_acc=True, rescale_l=True, normalise_in_loop=False, stable=True, m0=-np.inf):
    """The exercise's solution, with the common mistakes as switches."""
    D = q.shape[0]
    m, lsum, acc = m0, 0.0, np.zeros(D, np.float32)
    for k0 in range(0, k.shape[0], block):
        s = k[k0:k0 + block] @ q / np.sqrt(D)                                  # (<= block,)
        m_new = max(m, s.max()) if stable else 0.0
        alpha = np.exp(m - m_new) if stable else 1.0
        p = np.exp(s - m_new)
        lsum = (lsum * alpha if rescale_l else lsum) + p.sum()
        acc = (acc * alpha if rescale_acc else acc) + p @ v[k0:k0 + block]     # (D,)
        if normalise_in_loop:
            acc = acc / lsum
        m = m_new
    return acc if normalise_in_loop else acc / lsum


def check(**mistake):
    with np.errstate(all="ignore"):
        return check_flash_row(lambda q, k, v, block: flash_row(q, k, v, block, **mistake))


def test_the_solution_passes():
    result = check()
    assert result and result.kind == "core", repr(result)


MISTAKES = [
    (dict(rescale_acc=False), "acc is not rescaled by exp(m_old - m_new)"),
    (dict(rescale_l=False), "l is not rescaled by exp(m_old - m_new)"),
    (dict(normalise_in_loop=True), "divide by l once, after the last tile"),
    (dict(stable=False), "overflows: subtract the running max m before exp"),
    (dict(m0=0.0), "start m at -inf, not 0"),
]


@pytest.mark.parametrize("mistake,said", MISTAKES)
def test_a_common_mistake_is_named(mistake, said):
    result = check(**mistake)
    assert not result and said in result.message, repr(result)


def test_the_last_partial_tile_dropped_is_named():
    def skips_last(q, k, v, block):
        n = k.shape[0] - k.shape[0] % block if k.shape[0] > block else k.shape[0]
        return flash_row(q, k[:n], v[:n], block)
    result = check_flash_row(skips_last)
    assert not result and "the last tile holds n % block keys" in result.message, repr(result)


def test_all_scores_at_once_fails_the_memory_bound():
    def whole_row(q, k, v, block):                    # right answer, but the whole score row at once
        s = k @ q / np.sqrt(q.shape[0])
        p = np.exp(s - s.max())
        return p @ v / p.sum()
    result = check_flash_row(whole_row)
    assert not result and "keep only one tile of scores at a time" in result.message, repr(result)


def test_bad_student_code_fails_cleanly_and_leaves_nothing_behind():
    def raises(q, k, v, block):
        raise ZeroDivisionError("oops")
    assert "ZeroDivisionError: oops" in check_flash_row(raises).message
    result = check_flash_row(lambda q, k, v, block: np.zeros((1, q.shape[0])))
    assert not result and "returned shape (1, 4), expected (4,)" in result.message, repr(result)
    assert "wrong signature" in check_flash_row(lambda q, k, v: q).message
    state = np.random.get_state()[1].copy()
    assert check(), "the next, correct attempt passes"
    assert (np.random.get_state()[1] == state).all()
