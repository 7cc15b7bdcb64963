"""CPU twins of RMSNorm and fused residual-add + RMSNorm at real shapes against torch, their batch
independence (bit for bit), and the fusion's byte count against a hand count."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.rmsnorm import add_rmsnorm_cpu, add_rmsnorm_rows, bytes_moved, rmsnorm_cpu, rmsnorm_rows


def reference(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w     # minillm.llama.transformer.RMSNorm


# float32 sums of C <= 288 squares in another order: the scale carries ~sqrt(C) * 6e-8 ~ 1e-6 relative
# error on either side; outputs are O(1-5) (random weights), so 1e-5 relative and absolute is ~10x margin.
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("M,C", [(1, 288), (64, 288), (7, 256), (33, 5)])
def test_rmsnorm_rows_equals_torch(M, C):
    g = torch.Generator().manual_seed(M + C)
    x, w = torch.randn(M, C, generator=g) * 3, torch.randn(C, generator=g)
    assert_close(torch.from_numpy(rmsnorm_cpu(x.numpy(), w.numpy())), reference(x, w), **TOL, name="rmsnorm_rows")
    out = np.empty((M, C), np.float32)
    rmsnorm_rows(x.numpy(), w.numpy(), 1e-3, out)                          # eps is an argument, not a constant
    assert_close(torch.from_numpy(out), reference(x, w, 1e-3), **TOL, name="rmsnorm_rows(eps=1e-3)")


@pytest.mark.parametrize("M,C", [(1, 288), (64, 256), (9, 31)])
def test_add_rmsnorm_rows_equals_torch(M, C):
    g = torch.Generator().manual_seed(M * C)
    x, r, w = torch.randn(M, C, generator=g), torch.randn(M, C, generator=g), torch.randn(C, generator=g)
    res = r.numpy().copy()
    out = add_rmsnorm_cpu(x.numpy(), res, w.numpy())
    assert np.array_equal(res, (r + x).numpy())                             # residual updated in place, exactly
    assert_close(torch.from_numpy(out), reference(r + x, w), **TOL, name="add_rmsnorm_rows")
    assert np.array_equal(out, rmsnorm_cpu(res, w.numpy()))                 # fused == add then norm, bit for bit


@pytest.mark.parametrize("C", [288, 256, 7])
def test_a_rows_result_does_not_depend_on_the_batch(C):
    rng = np.random.default_rng(C)
    x, r = rng.standard_normal((13, C), dtype=np.float32), rng.standard_normal((13, C), dtype=np.float32)
    w = rng.standard_normal(C, dtype=np.float32)
    full = rmsnorm_cpu(x, w)
    res_full = r.copy()
    fused = add_rmsnorm_cpu(x, res_full, w)
    for m in range(13):
        row = x[m:m + 1].copy()                                             # alone, in its own allocation
        assert np.array_equal(rmsnorm_cpu(row, w)[0], full[m])
        res = r[m:m + 1].copy()
        out = np.empty((1, C), np.float32)
        add_rmsnorm_rows(row, res, w, 1e-5, out)
        assert np.array_equal(out[0], fused[m]) and np.array_equal(res[0], res_full[m])


def test_bytes_moved_against_a_hand_count():
    # 2 rows of 3 floats. Unfused: add reads x (6) + residual (6), writes residual (6); rmsnorm reads
    # residual (6) + weight (3), writes out (6): 33 floats. Fused: reads x, residual, weight (15),
    # writes residual and out (12): 27 floats. 4 bytes each.
    assert bytes_moved(2, 3, fused=False) == 33 * 4
    assert bytes_moved(2, 3, fused=True) == 27 * 4
    # the stories15M width, a 64-token prefill: fusion saves exactly one read of the activations
    assert bytes_moved(64, 288, False) - bytes_moved(64, 288, True) == 64 * 288 * 4


def test_wrappers_refuse_bad_arrays():
    x, w = np.ones((3, 4), np.float32), np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"weight has shape \(3,\): dimension 0 must be 4"):
        rmsnorm_cpu(x, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="residual must be float32"):
        add_rmsnorm_cpu(x, x.astype(np.float64), w)
