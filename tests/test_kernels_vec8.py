"""kernels.vec8's two vector loops against torch in float64, and the fixed order they promise."""
import numpy as np
import pytest
import torch
from minillm.kernels.vec8 import axpy8, dot8
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
