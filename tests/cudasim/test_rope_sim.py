"""RoPE in the simulator against minillm.llama.transformer.apply_rope (torch), with heads and head dims that are not
multiples of the block size, positions out of order, and the position guard."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels import simulating
from minillm.kernels.rope import rope_cuda

from minillm.llama.transformer import apply_rope, rope_tables


def test_the_simulator_is_on():
    assert simulating()


def tables(D, S):
    cos, sin = rope_tables(D, S)                                    # (S, D/2) float64
    return cos.float().numpy(), sin.float().numpy()                 # (S, D/2) float32, as the engine casts


@pytest.mark.parametrize("M,H,D,S", [(1, 1, 2, 1), (3, 5, 14, 32), (7, 2, 32, 20)])
def test_rope_equals_apply_rope(M, H, D, S):
    g = torch.Generator().manual_seed(M * 100 + D)
    x = torch.randn(M, H, D, generator=g)                           # (M, H, D)
    pos = torch.randint(0, S, (M,), generator=g)                    # (M,) any order, repeats allowed
    cos, sin = tables(D, S)
    out = rope_cuda(x.numpy(), pos.numpy(), cos, sin)
    c, s = torch.from_numpy(cos)[pos][None], torch.from_numpy(sin)[pos][None]   # (1, M, D/2)
    want = apply_rope(x[None], c, s)[0]                             # (M, H, D)
    # two float32 products and a sum per output, |x| <= ~4: a few ulps; 1e-6 absolute is ~10x that
    assert_close(torch.from_numpy(out), want, atol=1e-6, rtol=1e-6, name="rope_kernel")


def test_rope_at_position_zero_is_the_identity():
    x = np.random.default_rng(0).standard_normal((2, 3, 8), dtype=np.float32)
    cos, sin = tables(8, 4)
    assert np.array_equal(rope_cuda(x, np.zeros(2, np.int64), cos, sin), x)


def test_launcher_refuses_bad_arrays_before_launching():
    x, pos = np.ones((2, 3, 8), np.float32), np.array([0, 3])
    cos, sin = tables(8, 4)
    with pytest.raises(ValueError, match=r"positions\[1\] = 4 is outside the RoPE tables: .*\[0, 4\)"):
        rope_cuda(x, np.array([0, 4]), cos, sin)
    with pytest.raises(ValueError, match=r"positions\[0\] = -1"):
        rope_cuda(x, np.array([-1, 0]), cos, sin)
    with pytest.raises(ValueError, match="positions must be int64, got int32"):
        rope_cuda(x, pos.astype(np.int32), cos, sin)
    with pytest.raises(ValueError, match=r"positions has shape \(3,\): dimension 0 must be 2"):
        rope_cuda(x, np.array([0, 1, 2]), cos, sin)
    with pytest.raises(ValueError, match="x must be float32, got float64"):
        rope_cuda(x.astype(np.float64), pos, cos, sin)
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        rope_cuda(np.ones((8, 3, 2), np.float32).transpose(2, 1, 0), pos, cos, sin)
    with pytest.raises(ValueError, match="D must be even"):
        rope_cuda(np.ones((2, 3, 7), np.float32), pos, cos, sin)
    with pytest.raises(ValueError, match=r"cos has shape \(4, 3\): dimension 1 must be 4"):
        rope_cuda(x, pos, cos[:, :3].copy(), sin)
    with pytest.raises(ValueError, match=r"sin has shape \(3, 4\): dimension 0 must be 4"):
        rope_cuda(x, pos, cos, sin[:3].copy())
    with pytest.raises(ValueError, match="sin must be C-contiguous"):
        rope_cuda(x, pos, cos, np.asfortranarray(sin))
