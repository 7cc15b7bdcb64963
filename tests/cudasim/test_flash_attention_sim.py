"""The FlashAttention CUDA kernel in the simulator against a plain torch reference, at shapes that are not
tile multiples (T = 17, 20: a partial query tile and a partial key tile; D = 5, 16 < DMAX)."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels import simulating
from minillm.kernels.flash_attention import flash_attention_cuda


def test_the_simulator_is_on():
    assert simulating()


def torch_causal(q, k, v):
    """Causal softmax(q k^T / sqrt(D)) v in float64, GQA by repeating KV heads. q (B, T, H, D), k, v (B, T, Hkv, D)."""
    q, k, v = (torch.from_numpy(x).double() for x in (q, k, v))
    B, T, H, D = q.shape
    k, v = (x.repeat_interleave(H // x.shape[2], dim=2) for x in (k, v))       # (B, T, H, D)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / D ** 0.5                        # (B, H, T, T)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)                    # (B, T, H, D)


@pytest.mark.parametrize("B,T,H,Hkv,D", [(1, 20, 4, 2, 16), (2, 17, 2, 1, 5), (1, 1, 1, 1, 3)])
def test_flash_attention_kernel_equals_torch(B, T, H, Hkv, D):
    rng = np.random.default_rng(T * 10 + D)
    q = rng.standard_normal((B, T, H, D), dtype=np.float32)
    k, v = (rng.standard_normal((B, T, Hkv, D), dtype=np.float32) for _ in range(2))
    # float32 scores of D <= 16 products and an online softmax over <= 20 keys: ~1e-7 absolute error
    # (worst seen 3e-7); 1e-5 leaves room for another summation order
    assert_close(torch.from_numpy(flash_attention_cuda(q, k, v)).double(), torch_causal(q, k, v),
                 atol=1e-5, rtol=1e-5, name="flash_attention_fwd")
    if B == 1:   # the (T, H, D) form is the same kernel on a (1, T, H, D) view
        one = flash_attention_cuda(q[0], k[0], v[0])
        assert one.shape == (T, H, D)
        assert_close(torch.from_numpy(one).double(), torch_causal(q, k, v)[0], atol=1e-5, rtol=1e-5, name="3-D")


def test_launcher_refuses_bad_arrays_before_launching():
    q, kv = np.ones((4, 2, 8), np.float32), np.ones((4, 1, 8), np.float32)
    with pytest.raises(ValueError, match="q must be float32, got float64"):
        flash_attention_cuda(q.astype(np.float64), kv, kv)
    with pytest.raises(ValueError, match=r"k has shape \(4, 1, 7\): dimension 2 must be 8"):
        flash_attention_cuda(q, kv[:, :, :7].copy(), kv)
    with pytest.raises(ValueError, match=r"k has shape \(3, 1, 8\): dimension 0 must be 4"):
        flash_attention_cuda(q, kv[:3].copy(), kv[:3].copy())
    with pytest.raises(ValueError, match="C-contiguous"):
        flash_attention_cuda(np.ones((8, 2, 4), np.float32).transpose(2, 1, 0), kv, kv)
    with pytest.raises(ValueError, match="must divide q's H"):
        flash_attention_cuda(np.ones((4, 3, 8), np.float32), np.ones((4, 2, 8), np.float32),
                             np.ones((4, 2, 8), np.float32))
    with pytest.raises(ValueError, match="D = 65 exceeds the CUDA kernel's DMAX = 64"):
        flash_attention_cuda(np.ones((2, 1, 65), np.float32), np.ones((2, 1, 65), np.float32),
                             np.ones((2, 1, 65), np.float32))
    with pytest.raises(ValueError, match=r"q must be \(T, H, D\) or \(B, T, H, D\)"):
        flash_attention_cuda(np.ones((4, 8), np.float32), kv, kv)
