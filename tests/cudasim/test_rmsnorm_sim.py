"""RMSNorm and fused residual-add + RMSNorm in the simulator against torch, at rows and widths that are
not multiples of the block size (threads=8 makes the block stride over a row of up to 32)."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels import simulating
from minillm.kernels.rmsnorm import add_rmsnorm_cuda, add_then_rmsnorm_cuda, rmsnorm_cuda


def test_the_simulator_is_on():
    assert simulating()


def reference(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w     # minillm.llama.transformer.RMSNorm


# float32: a sum of at most 32 squares in another order (~1e-7 relative each), one sqrt and two
# products; outputs are O(1-5), so 1e-5 absolute and relative leaves ~100x margin over the ~1e-7 seen.
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("M,C,threads", [(1, 1, 1), (3, 29, 8), (5, 32, 8), (2, 19, 128)])
def test_rmsnorm_equals_torch(M, C, threads):
    g = torch.Generator().manual_seed(M * 100 + C)
    x, w = torch.randn(M, C, generator=g), torch.randn(C, generator=g)
    out = rmsnorm_cuda(x.numpy(), w.numpy(), 1e-5, threads=threads)
    assert_close(torch.from_numpy(out), reference(x, w), **TOL, name="rmsnorm_kernel")


@pytest.mark.parametrize("M,C,threads", [(4, 31, 8), (1, 32, 128)])
def test_fused_add_rmsnorm_equals_torch_and_the_unfused_pair(M, C, threads):
    g = torch.Generator().manual_seed(M * 100 + C)
    x, r, w = torch.randn(M, C, generator=g), torch.randn(M, C, generator=g), torch.randn(C, generator=g)
    res_fused, res_pair = r.numpy().copy(), r.numpy().copy()
    out = add_rmsnorm_cuda(x.numpy(), res_fused, w.numpy(), threads=threads)
    assert np.array_equal(res_fused, (r + x).numpy())                         # one float32 add: exact
    assert_close(torch.from_numpy(out), reference(r + x, w), **TOL, name="add_rmsnorm_kernel")
    pair = add_then_rmsnorm_cuda(x.numpy(), res_pair, w.numpy(), threads=threads)
    assert np.array_equal(res_pair, res_fused) and np.array_equal(pair, out)  # same sums: same bits


def test_torch_tensors_in_torch_tensors_out():
    x, w = torch.randn(2, 7), torch.ones(7)
    out = rmsnorm_cuda(x, w, threads=4)
    assert isinstance(out, torch.Tensor)
    assert_close(out, reference(x, w), **TOL, name="rmsnorm_kernel(torch)")


def test_launchers_refuse_bad_arrays_before_launching():
    x, w = np.ones((3, 4), np.float32), np.ones(4, np.float32)
    with pytest.raises(ValueError, match="x must be float32, got float64"):
        rmsnorm_cuda(x.astype(np.float64), w)
    with pytest.raises(ValueError, match=r"weight has shape \(5,\): dimension 0 must be 4"):
        rmsnorm_cuda(x, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        rmsnorm_cuda(np.ones((4, 3), np.float32).T, w)
    with pytest.raises(ValueError, match=r"residual has shape \(2, 4\): dimension 0 must be 3"):
        add_rmsnorm_cuda(x, np.ones((2, 4), np.float32), w)
    with pytest.raises(ValueError, match="residual must be C-contiguous"):
        add_rmsnorm_cuda(x, np.ones((4, 3), np.float32).T, w)
    with pytest.raises(ValueError, match="weight must be float32"):
        add_then_rmsnorm_cuda(x, x.copy(), w.astype(np.float16))
    with pytest.raises(ValueError, match="threads must be a power of two"):
        rmsnorm_cuda(x, w, threads=96)
