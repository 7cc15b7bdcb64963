"""The int8 and int4 dequantizing GEMV kernels in the simulator against torch dequantizing the same layout,
with K not a multiple of the 32 threads and groups that do not line up with the thread stride."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels import simulating
from minillm.kernels.quant_gemv import int4_gemv_cuda, int8_gemv_cuda, quantize_int4, quantize_int8


def test_the_simulator_is_on():
    assert simulating()


def data(M, N, K, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((N, K), dtype=np.float32)


# float32 sums of <= 96 integer-weighted terms in another order than torch's float64: ~1e-6 absolute
# (worst seen 2e-6 on outputs of size ~10); 1e-4 is a wide but still bug-catching margin (a wrong nibble is ~0.1).
@pytest.mark.parametrize("M,N,K", [(1, 5, 37), (2, 3, 64)])
def test_int8_gemv_kernel_equals_torch(M, N, K):
    x, w = data(M, N, K, seed=K)
    w_q, scales, _ = quantize_int8(w)
    want = (torch.from_numpy(x).double()
            @ (torch.from_numpy(w_q).double() * torch.from_numpy(scales).double()[:, None]).T)
    assert_close(torch.from_numpy(int8_gemv_cuda(x, w_q, scales)).double(), want, atol=1e-4, rtol=1e-4,
                 name="int8_gemv")
    assert_close(torch.from_numpy(int8_gemv_cuda(x[0], w_q, scales)).double(), want[0], atol=1e-4, rtol=1e-4,
                 name="x (K,)")


@pytest.mark.parametrize("M,N,K,G", [(1, 5, 40, 8), (2, 3, 96, 32)])
def test_int4_gemv_kernel_equals_torch(M, N, K, G):
    x, w = data(M, N, K, seed=K + G)
    packed, scales, _ = quantize_int4(w, G)
    p = torch.from_numpy(packed).long()                                        # (N, K/2)
    q = torch.stack([(p & 15) - 8, (p >> 4) - 8], dim=2).flatten(1)            # (N, K): even k low nibble
    deq = q.double() * torch.from_numpy(scales).double().repeat_interleave(G, dim=1)       # (N, K)
    want = torch.from_numpy(x).double() @ deq.T                                # (M, N)
    assert_close(torch.from_numpy(int4_gemv_cuda(x, packed, scales, G)).double(), want, atol=1e-4, rtol=1e-4,
                 name="int4_gemv")


def test_launchers_refuse_bad_inputs_before_launching():
    x, w = data(1, 4, 12, seed=0)
    packed, s4, _ = quantize_int4(w, 4)
    with pytest.raises(ValueError, match="K = 13 must be even"):
        int4_gemv_cuda(np.ones((1, 13), np.float32), packed, s4, 4)
    with pytest.raises(ValueError, match="K = 12 is not divisible by the group size G = 8"):
        int4_gemv_cuda(x, packed, s4, 8)
    with pytest.raises(ValueError, match="group size must be even"):
        int4_gemv_cuda(x, packed, s4, 3)
    with pytest.raises(ValueError, match="w_packed must be uint8, got int8"):
        int4_gemv_cuda(x, packed.view(np.int8), s4, 4)
    with pytest.raises(ValueError, match=r"scales has shape \(4, 2\): dimension 1 must be 3"):
        int4_gemv_cuda(x, packed, s4[:, :2].copy(), 4)
    w_q, s, _ = quantize_int8(w)
    with pytest.raises(ValueError, match="x must be float32, got float64"):
        int8_gemv_cuda(x.astype(np.float64), w_q, s)
    with pytest.raises(ValueError, match=r"w_q has shape \(4, 12\): dimension 1 must be 11"):
        int8_gemv_cuda(x[:, :11].copy(), w_q, s)
    with pytest.raises(ValueError, match="scales must be float32, got float64"):
        int8_gemv_cuda(x, w_q, s.astype(np.float64))
