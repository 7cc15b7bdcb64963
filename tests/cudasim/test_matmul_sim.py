"""Tiled matmul and GEMV in the simulator against torch, at shapes that are not tile multiples."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels import simulating
from minillm.kernels.matmul import gemv_cuda, matmul_cuda


def test_the_simulator_is_on():
    assert simulating()


@pytest.mark.parametrize("M,K,N", [(1, 7, 5), (5, 19, 23), (16, 32, 16), (17, 3, 30)])
def test_matmul_tiled_equals_torch(M, K, N):
    g = torch.Generator().manual_seed(M * 100 + K)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    y = matmul_cuda(x.numpy(), w.numpy())
    # float32 sums of at most 32 products in a different order: 1e-5 relative is ~100 ulps of margin
    assert_close(torch.from_numpy(y), x @ w.T, atol=1e-5, rtol=1e-5, name="matmul_tiled")


@pytest.mark.parametrize("N,K", [(1, 1), (7, 33), (32, 32)])
def test_gemv_equals_torch(N, K):
    g = torch.Generator().manual_seed(N * 100 + K)
    w, x = torch.randn(N, K, generator=g), torch.randn(K, generator=g)
    assert_close(torch.from_numpy(gemv_cuda(w.numpy(), x.numpy())), w @ x, atol=1e-5, rtol=1e-5, name="gemv")


def test_launchers_refuse_bad_arrays_before_launching():
    x, w = np.ones((3, 4), np.float32), np.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match=r"w has shape \(5, 3\): dimension 1 must be 4"):
        matmul_cuda(x, np.ones((5, 3), np.float32))
    with pytest.raises(ValueError, match="x must be float32, got float64"):
        matmul_cuda(x.astype(np.float64), w)
    with pytest.raises(ValueError, match="C-contiguous"):
        matmul_cuda(x, np.ones((4, 5), np.float32).T)
    with pytest.raises(ValueError, match="x must have 1 dimensions"):
        gemv_cuda(w, x)
