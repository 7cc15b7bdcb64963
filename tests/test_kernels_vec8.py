"""kernels.vec8's two vector loops against torch in float64, and the fixed order they promise."""
import numpy as np
import pytest
import torch
from minillm.kernels.vec8 import axpy8, axpy_plain, dot8, dot_plain
from numba import njit


@njit
def _dot(a, i, b, j, steps):
    return dot8(a, i, b, j, steps)


@njit
def _axpy(w, b, j, acc, i, steps):
    axpy8(w, b, j, acc, i, steps)


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_dot8_equals_torch_and_its_lane_order(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 48)).astype(np.float32)                       # (3, 48): rows read by offset
    b = (rng.integers(-127, 128, (2, 48)) if dtype == np.int8 else rng.standard_normal((2, 48))).astype(dtype)
    got = _dot(a, 48, b, 48, 6)                                               # row 1 of a . row 1 of b
    want = torch.dot(torch.from_numpy(a[1]).double(), torch.from_numpy(b[1].astype(np.float64)))
    assert abs(got - want.item()) <= 1e-5 * (1 + np.abs(a[1] * b[1]).sum())   # float32 sums of 48 terms
    lanes = [np.float32(0)] * 8                                               # the promised order, in numpy
    for k in range(48):
        lanes[k % 8] = np.float32(lanes[k % 8] + np.float32(a[1, k] * np.float32(b[1, k])))
    tree = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    assert abs(got - tree) <= 1e-6 * (1 + abs(tree))    # fma rounds once where numpy rounds twice: a few ulp
    assert _dot(a, 0, b, 0, 0) == 0.0                                         # no steps: nothing summed


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_axpy8_touches_only_its_steps(dtype):
    rng = np.random.default_rng(1)
    b = (rng.integers(-127, 128, (2, 24)) if dtype == np.int8 else rng.standard_normal((2, 24))).astype(dtype)
    acc = rng.standard_normal((2, 24)).astype(np.float32)
    want = acc.astype(np.float64).copy()
    want[1, :16] += 0.5 * b[0, :16].astype(np.float64)                       # 2 steps of 8 into row 1
    _axpy(np.float32(0.5), b, 0, acc, 24, 2)
    np.testing.assert_allclose(acc, want, rtol=1e-6, atol=1e-6)               # one float32 rounding each
    assert np.array_equal(acc[1, 16:], want[1, 16:].astype(np.float32))       # past the steps: untouched


U = 2.0 ** -24    # float32 unit roundoff


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
@pytest.mark.parametrize("steps", [0, 1, 6, 13])
def test_vec8_loops_equal_their_plain_twins(dtype, steps):
    """dot8 against dot_plain: 8 lane chains of `steps` fmas and a 3-add tree vs one chain of 8 * steps terms, so
    within gamma_{8 steps} + gamma_{steps + 3} <= (9 steps + 5) u sum |a b| (as float32_order_bound). axpy8 against
    axpy_plain: one fma vs a multiply then an add, fl(c + w b) vs fl(c + fl(w b)), which differ by at most
    2 u |c + w b| + u |w b| <= 2 u |c| + 3 u |w b| per element; and neither touches acc past 8 * steps."""
    rng = np.random.default_rng(steps)
    n = 8 * steps + 11                                                              # offsets and a ragged end
    a = rng.standard_normal((2, n)).astype(np.float32)                             # (2, n)
    b = (rng.integers(-127, 128, (2, n)) if dtype == np.int8 else rng.standard_normal((2, n))).astype(dtype)
    i, j = n + 2, 3                                               # a: row 1 from its 3rd element; b: row 0 from its 4th
    prods = np.abs(a.ravel()[i:i + 8 * steps].astype(np.float64) * b.ravel()[j:j + 8 * steps])
    got, want = _dot(a, i, b, j, steps), dot_plain(a, i, b, j, steps)
    assert abs(float(got) - float(want)) <= (9 * steps + 5) * U * prods.sum()
    if steps == 0:
        assert got == want == 0.0
    w = np.float32(0.37)
    acc_ir, acc_plain = a.copy(), a.copy()                                          # (2, n) each
    _axpy(w, b, j, acc_ir, i, steps)
    axpy_plain(w, b, j, acc_plain, i, steps)
    seg = slice(i, i + 8 * steps)
    wb = np.abs(float(w) * b.ravel()[j:j + 8 * steps].astype(np.float64))
    c = np.abs(a.ravel()[seg].astype(np.float64))
    assert (np.abs(acc_ir.ravel()[seg].astype(np.float64) - acc_plain.ravel()[seg]) <= U * (2 * c + 3 * wb)).all()
    outside = np.ones(a.size, bool)
    outside[seg] = False
    assert np.array_equal(acc_ir.ravel()[outside], a.ravel()[outside])
    assert np.array_equal(acc_plain.ravel()[outside], a.ravel()[outside])
