"""CPU twin of RoPE at real shapes against minillm.llama.transformer.apply_rope (torch), batch independence, and the
position guard."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.rope import rope_cpu, rope_rows

from minillm.llama.transformer import apply_rope, rope_tables


def tables(D, S):
    cos, sin = rope_tables(D, S)                                    # (S, D/2) float64
    return cos.float().numpy(), sin.float().numpy()                 # (S, D/2) float32


@pytest.mark.parametrize("M,H,D,S", [(1, 6, 48, 256), (64, 6, 48, 256), (37, 4, 64, 1024), (5, 3, 2, 8)])
def test_rope_rows_equals_apply_rope(M, H, D, S):
    g = torch.Generator().manual_seed(M + H + D)
    x = torch.randn(M, H, D, generator=g)                           # (M, H, D)
    pos = torch.randint(0, S, (M,), generator=g)                    # (M,) mixed positions, as a batch has
    cos, sin = tables(D, S)
    got = torch.from_numpy(rope_cpu(x.numpy(), pos.numpy(), cos, sin))
    c, s = torch.from_numpy(cos)[pos][None], torch.from_numpy(sin)[pos][None]   # (1, M, D/2)
    want = apply_rope(x[None], c, s)[0]                             # (M, H, D)
    # x0*c - x1*s in float32, perhaps contracted to an FMA under fastmath: a few ulps of |x| <= ~5;
    # 1e-6 absolute and relative is ~10x that, and far below what a wrong angle or pair would give
    assert_close(got, want, atol=1e-6, rtol=1e-6, name="rope_rows")


def test_rope_rows_rotates_in_place_and_keeps_norms():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6, 48), dtype=np.float32)          # (M, H, D)
    cos, sin = tables(48, 64)
    y = x.copy()
    rope_rows(y, np.array([0, 1, 17, 63]), cos, sin)
    assert np.array_equal(y[0], x[0])                               # position 0: the identity

    def pairs(a):
        return np.hypot(a[..., 0::2].astype(np.float64), a[..., 1::2])   # (M, H, D/2) pair lengths
    assert np.allclose(pairs(y), pairs(x), rtol=1e-6)               # a rotation keeps every pair's length


def test_a_rows_result_does_not_depend_on_the_batch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((11, 4, 64), dtype=np.float32)         # (M, H, D)
    pos = rng.integers(0, 100, 11)                                  # (M,)
    cos, sin = tables(64, 100)
    full = rope_cpu(x, pos, cos, sin)
    for m in range(11):
        assert np.array_equal(rope_cpu(x[m:m + 1].copy(), pos[m:m + 1].copy(), cos, sin)[0], full[m])


def test_wrapper_refuses_positions_beyond_the_tables():
    x = np.ones((2, 6, 48), np.float32)
    cos, sin = tables(48, 256)
    with pytest.raises(ValueError, match=r"positions\[1\] = 256 is outside the RoPE tables: .* \[0, 256\)"):
        rope_cpu(x, np.array([3, 256]), cos, sin)
    with pytest.raises(ValueError, match=r"cos has shape \(256, 24\): dimension 1 must be 32"):
        rope_cpu(np.ones((2, 6, 64), np.float32), np.array([0, 1]), cos, sin)
