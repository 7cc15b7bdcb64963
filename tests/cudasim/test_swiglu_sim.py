"""Fused SwiGLU in the simulator against torch (F.silu(gate) * up), at sizes that are not multiples of
the block size, and the unfused pair equal to it bit for bit."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from close import assert_close
from minillm.kernels import simulating
from minillm.kernels.swiglu import swiglu_cuda, swiglu_unfused_cuda


def test_the_simulator_is_on():
    assert simulating()


@pytest.mark.parametrize("M,Fh", [(1, 1), (3, 29), (9, 32), (32, 11)])
def test_swiglu_equals_torch_and_the_unfused_pair(M, Fh):
    g = torch.Generator().manual_seed(M * 100 + Fh)
    gate, up = torch.randn(M, Fh, generator=g) * 4, torch.randn(M, Fh, generator=g)
    out = swiglu_cuda(gate.numpy(), up.numpy())
    # one exp, a division and two products per element: a few ulps; rtol 1e-6 with atol 1e-7 for outputs
    # near zero (silu of a large negative gate) is ~10x what float32 rounding can produce
    assert_close(torch.from_numpy(out), F.silu(gate) * up, atol=1e-7, rtol=1e-6, name="swiglu_kernel")
    assert np.array_equal(swiglu_unfused_cuda(gate.numpy(), up.numpy()), out)


def test_launchers_refuse_bad_arrays_before_launching():
    gate, up = np.ones((3, 4), np.float32), np.ones((3, 4), np.float32)
    for launch in (swiglu_cuda, swiglu_unfused_cuda):
        with pytest.raises(ValueError, match="gate must be float32, got float64"):
            launch(gate.astype(np.float64), up)
        with pytest.raises(ValueError, match=r"up has shape \(3, 5\): dimension 1 must be 4"):
            launch(gate, np.ones((3, 5), np.float32))
        with pytest.raises(ValueError, match="up must be C-contiguous"):
            launch(gate, np.ones((4, 3), np.float32).T)
        with pytest.raises(ValueError, match="gate must have 2 dimensions"):
            launch(np.ones(12, np.float32), up)
