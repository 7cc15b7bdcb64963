"""CPU twins of the three-pass and online softmax at real shapes against torch.softmax, batch
independence, the online recurrence's recorded steps, and exp32 (the vectorising exp) against float64 exp."""
import math

import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.softmax import (
    EXP32_HI,
    EXP32_LO,
    exp32,
    online_softmax_cpu,
    online_softmax_rows,
    online_softmax_steps,
    softmax_cpu,
    softmax_rows,
)
from numba import njit

TWINS = [softmax_cpu, online_softmax_cpu]


@njit(fastmath=True)             # as its callers compile it: inside a fastmath loop (swiglu_rows, attention)
def _exp32_all(x, out):
    for i in range(x.shape[0]):
        out[i] = exp32(x[i])


def test_exp32_is_within_two_ulp_of_exp_over_its_whole_range():
    """Every float32 step over [EXP32_LO, EXP32_HI] in 2,000,001 points, against exp in float64 rounded: Cephes'
    expf is documented at ~1 ulp; 2 ulp catches a lost range reduction (fastmath reassociating ln2's two parts
    gave 4.6 ulp, an exponent that overflowed at n = 128 gave inf)."""
    x = np.linspace(EXP32_LO, EXP32_HI, 2_000_001).astype(np.float32)
    got = np.empty_like(x)
    _exp32_all(x, got)
    want = np.exp(x.astype(np.float64))
    ulps = np.abs(got - want) / np.spacing(want.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 2.0, f"exp32 is {ulps.max():.2f} ulp off at x = {x[ulps.argmax()]}"


def test_exp32_limits():
    x = np.array([-np.inf, -1000, np.nextafter(EXP32_LO, -np.inf), 0, np.nextafter(EXP32_HI, np.inf), 1000,
                  np.inf], np.float32)
    got = np.empty_like(x)
    _exp32_all(x, got)
    assert got.tolist() == [0.0, 0.0, 0.0, 1.0, np.inf, np.inf, np.inf]


# probabilities in [0, 1]: exp carries ~1 ulp and the row sum (N <= 32000 float32 terms, in 8-16
# partial chains on both sides) ~1e-6 relative: the worst seen is 1.5e-6 (online, N = 32000), so
# rtol 1e-5 leaves ~6x; atol 1e-8 covers the tiny probabilities of a 32000-way softmax.
TOL = dict(atol=1e-8, rtol=1e-5)


@pytest.mark.parametrize("twin", TWINS, ids=["three_pass", "online"])
@pytest.mark.parametrize("M,N,scale", [(1, 1, 1.0), (64, 256, 1.0), (8, 1024, 10.0), (3, 32000, 3.0), (5, 17, 100.0)])
def test_softmax_rows_equal_torch(twin, M, N, scale):
    g = torch.Generator().manual_seed(M + N)
    x = torch.randn(M, N, generator=g) * scale                      # scale 100: exp(x) alone overflows
    assert_close(torch.from_numpy(twin(x.numpy())), torch.softmax(x, -1), **TOL, name=twin.__name__)


def test_the_two_ways_agree_and_sum_to_one():
    x = np.random.default_rng(2).standard_normal((16, 1000), dtype=np.float32) * 5
    a, b = np.empty_like(x), np.empty_like(x)
    softmax_rows(x, a)
    online_softmax_rows(x, b)
    assert np.allclose(a, b, rtol=1e-5, atol=1e-9)
    assert np.allclose(a.sum(-1, dtype=np.float64), 1.0, atol=1e-5)


@pytest.mark.parametrize("twin", TWINS, ids=["three_pass", "online"])
@pytest.mark.parametrize("N", [1000, 37])
def test_a_rows_result_does_not_depend_on_the_batch(twin, N):
    x = np.random.default_rng(N).standard_normal((9, N), dtype=np.float32) * 4
    full = twin(x)
    for m in range(9):
        assert np.array_equal(twin(x[m:m + 1].copy())[0], full[m])


def test_online_softmax_steps_record_the_running_max_and_sum():
    x = [1.0, 3.0, 2.0, 5.0, -1.0]
    steps = online_softmax_steps(x)
    assert [i for i, _, _ in steps] == list(range(5))
    assert [m for _, m, _ in steps] == [1.0, 3.0, 3.0, 5.0, 5.0]
    for i, m, d in steps:                                           # d = sum of exp(x - m) over what was seen
        assert math.isclose(d, sum(math.exp(v - m) for v in x[:i + 1]), rel_tol=1e-12)
    # by hand: after 1, 3 the sum is e^(1-3) + 1; the next max 5 rescales it by e^(3-5)
    assert math.isclose(steps[1][2], math.exp(-2) + 1, rel_tol=1e-12)
    assert math.isclose(steps[3][2], (math.exp(-2) + 1 + math.exp(-1)) * math.exp(-2) + 1, rel_tol=1e-12)
    i, m, d = steps[-1]
    want = torch.softmax(torch.tensor(x, dtype=torch.float64), 0).numpy()
    assert np.allclose(np.exp(np.array(x) - m) / d, want, rtol=1e-12)


def test_wrappers_refuse_bad_arrays():
    for twin in TWINS:
        with pytest.raises(ValueError, match="x must be float32, got float64"):
            twin(np.ones((2, 3)))
        with pytest.raises(ValueError, match="x must be C-contiguous"):
            twin(np.ones((3, 2), np.float32).T)


@pytest.mark.parametrize("twin", TWINS, ids=["three_pass", "online"])
def test_masked_minus_infinity_entries_get_zero_probability(twin):
    """Masked logits are -inf; a lane that starts on -inf and later sees a real value must not turn nan."""
    x = np.zeros((2, 37), np.float32)
    x[0, 0], x[0, 8] = -np.inf, 5.0
    x[1, ::3] = -np.inf                          # every lane meets -inf, some first
    got = torch.from_numpy(twin(x))
    assert_close(got, torch.from_numpy(x).softmax(-1), **TOL, name=twin.__name__)
    assert float(got[0, 0]) == 0.0 and not bool(got.isnan().any())
    steps = online_softmax_steps([-np.inf, -np.inf, 2.0, -np.inf, 1.0])
    assert [(m, round(d, 6)) for _, m, d in steps][-1] == (2.0, round(1 + math.exp(-1.0), 6))
    assert steps[1][1:] == (-math.inf, 0.0)
