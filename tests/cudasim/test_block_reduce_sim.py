"""kernels/block_reduce.py's block_sum and block_max in the simulator, against numpy: at thread counts that
are not powers of two (1, 7, 33, 100), each thread holding one value and each folding several first, bit for
bit against the same tree written in numpy, and within float32 rounding of numpy's own sum."""
import numpy as np
import pytest
from minillm.kernels import simulating
from minillm.kernels.block_reduce import MAX_THREADS, row_sum_max_cuda


def test_the_simulator_is_on():
    assert simulating()


def tree_sum(values):
    """block_sum's order in numpy float32: n partial sums -> ceil(n / 2), entry t += entry t + ceil(n / 2)."""
    v = np.array(values, np.float32)                                           # (n,) one value per thread
    n = len(v)
    while n > 1:
        half = (n + 1) // 2
        v[:n - half] += v[half:n]
        n = half
    return v[0]


def thread_partials(row, nt):
    """What thread t holds before the tree: elements t, t + nt, ... of the row, summed in order (float32)."""
    parts = np.zeros(nt, np.float32)                                           # (nt,)
    for k, v in enumerate(row):
        parts[k % nt] = np.float32(parts[k % nt] + v)
    return parts


@pytest.mark.parametrize("L,threads", [(1, 1), (7, 7), (33, 33), (100, 100), (29, 4), (20, 7), (3, 33)])
def test_block_sum_and_max_equal_numpy(L, threads):
    """(L, L): one value per thread; (29, 4), (20, 7): each thread folds several; (3, 33): most threads hold
    nothing (0 for the sum, -inf for the max)."""
    rng = np.random.default_rng(L * 1000 + threads)
    x = (rng.standard_normal((3, L)) * 10).astype(np.float32)                 # (3, L)
    sums, maxes = row_sum_max_cuda(x, threads)
    for m in range(3):
        assert sums[m] == tree_sum(thread_partials(x[m], threads)), (m, sums[m])   # the promised order, bit for bit
        # any order of L float32 additions: |error| <= (L - 1) u sum |x| (Higham eq. 3.5), u = 2^-24
        assert abs(float(sums[m]) - x[m].astype(np.float64).sum()) <= L * 2.0**-24 * np.abs(x[m]).sum()
    assert np.array_equal(maxes, x.max(axis=1))                                # a max is exact in any order


def test_the_max_of_masked_rows_and_the_sum_of_integers_are_exact():
    """-inf entries (masked scores) lose to any finite value; an all -inf row's max is -inf. Small integers
    add exactly in float32, so the sum equals numpy's in any order."""
    x = np.full((2, 9), -np.inf, np.float32)                                   # (2, 9)
    x[0, 5] = -3.0
    _, maxes = row_sum_max_cuda(x, 5)
    assert maxes[0] == -3.0 and maxes[1] == -np.inf
    ints = np.arange(-16, 17, dtype=np.float32).reshape(1, 33)                 # (1, 33)
    sums, _ = row_sum_max_cuda(ints, 6)
    assert sums[0] == ints.sum() == 0.0


def test_the_launcher_refuses_bad_arguments():
    with pytest.raises(ValueError, match="threads must be in"):
        row_sum_max_cuda(np.ones((2, 3), np.float32), MAX_THREADS + 1)
    with pytest.raises(ValueError, match="threads must be in"):
        row_sum_max_cuda(np.ones((2, 3), np.float32), 0)
    with pytest.raises(ValueError, match="x must be float32"):
        row_sum_max_cuda(np.ones((2, 3)), 4)
