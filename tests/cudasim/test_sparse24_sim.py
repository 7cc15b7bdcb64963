"""The 2:4 GEMV kernel in the simulator against torch multiplying the dense weight the layout stands for, with
K/8 meta bytes not a multiple of the 32 threads (and more than 32 of them, so threads take several)."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels import simulating
from minillm.kernels.sparse24 import compress_24, decompress_24, sparse24_gemv_cuda


def test_the_simulator_is_on():
    assert simulating()


def pruned_24(N, K, seed):
    """A random (N, K) weight with the 2 largest of every 4 inputs kept."""
    w = np.random.default_rng(seed).standard_normal((N, K), dtype=np.float32)
    g = w.reshape(N, K // 4, 4)
    drop = np.argsort(np.abs(g), axis=-1)[..., :2]                             # (N, K/4, 2) the 2 smallest
    np.put_along_axis(g, drop, 0.0, axis=-1)
    return w


# float32 sums of <= 144 terms in another order than torch's float64: ~1e-6 absolute; 1e-4 still catches a
# wrong index (a misplaced value is ~1 on these inputs).
@pytest.mark.parametrize("M,N,K", [(1, 5, 40), (2, 3, 288)])
def test_sparse24_gemv_kernel_equals_torch(M, N, K):
    w = pruned_24(N, K, seed=K)
    values, meta = compress_24(w)
    assert np.array_equal(decompress_24(values, meta), w)
    x = np.random.default_rng(K + 1).standard_normal((M, K), dtype=np.float32)
    want = torch.from_numpy(x).double() @ torch.from_numpy(w).double().T       # (M, N)
    assert_close(torch.from_numpy(sparse24_gemv_cuda(x, values, meta)).double(), want, atol=1e-4, rtol=1e-4,
                 name="sparse24_gemv")
    assert_close(torch.from_numpy(sparse24_gemv_cuda(x[0], values, meta)).double(), want[0], atol=1e-4, rtol=1e-4,
                 name="x (K,)")


def test_bad_shapes_are_refused():
    values, meta = compress_24(pruned_24(3, 16, seed=0))
    with pytest.raises(ValueError, match="divisible by 8"):
        sparse24_gemv_cuda(np.ones((1, 12), np.float32), values, meta)
