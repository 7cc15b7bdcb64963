"""Three-pass and online softmax kernels in the simulator against torch.softmax, at row lengths that are
not multiples of the block size, with large logits (the max subtraction) and rows shorter than the block."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels import simulating
from minillm.kernels.softmax import online_softmax_cuda, softmax_cuda

KERNELS = [softmax_cuda, online_softmax_cuda]


def test_the_simulator_is_on():
    assert simulating()


# probabilities in [0, 1]: float32 exp and a sum of <= 32 terms carry a few ulps of relative error, so
# rtol 1e-5 (~100 ulps) with atol 1e-7 (for the tiny probabilities) is tight yet order-independent.
TOL = dict(atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS, ids=["three_pass", "online"])
@pytest.mark.parametrize("M,N,threads,scale", [(1, 1, 1, 1.0), (3, 29, 8, 3.0), (2, 32, 4, 30.0), (2, 7, 128, 1.0)])
def test_softmax_equals_torch(kernel, M, N, threads, scale):
    g = torch.Generator().manual_seed(M * 100 + N)
    x = torch.randn(M, N, generator=g) * scale + 50.0               # exp(x) alone would overflow at scale 30
    out = kernel(x.numpy(), threads=threads)
    assert_close(torch.from_numpy(out), torch.softmax(x, -1), **TOL, name=kernel.__name__)


@pytest.mark.parametrize("kernel", KERNELS, ids=["three_pass", "online"])
def test_an_increasing_row_rescales_every_step(kernel):
    x = torch.arange(17, dtype=torch.float32)[None] * 2.0           # (1, 17) each element a new max
    assert_close(torch.from_numpy(kernel(x.numpy(), threads=4)), torch.softmax(x, -1), **TOL, name=kernel.__name__)


@pytest.mark.parametrize("kernel", KERNELS, ids=["three_pass", "online"])
def test_launchers_refuse_bad_arrays_before_launching(kernel):
    with pytest.raises(ValueError, match="x must be float32, got float64"):
        kernel(np.ones((2, 3)))
    with pytest.raises(ValueError, match="x must have 2 dimensions"):
        kernel(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        kernel(np.ones((3, 2), np.float32).T)
    with pytest.raises(ValueError, match="threads must be a power of two"):
        kernel(np.ones((2, 3), np.float32), threads=2048)


@pytest.mark.parametrize("kernel", KERNELS, ids=["three_pass", "online"])
def test_masked_minus_infinity_entries_get_zero_probability(kernel):
    """A thread whose first element is -inf and that later sees a real value must not produce nan."""
    x = np.zeros((2, 20), np.float32)
    x[0, 0], x[0, 8] = -np.inf, 5.0
    x[1, ::3] = -np.inf
    got = torch.from_numpy(np.asarray(kernel(x, threads=4)))
    assert not bool(got.isnan().any())
    assert_close(got, torch.from_numpy(x).softmax(-1), **TOL, name=kernel.__name__)
