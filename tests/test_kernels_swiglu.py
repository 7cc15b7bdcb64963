"""CPU twin of SwiGLU at real shapes against torch (F.silu(gate) * up), batch independence, and the
fusion's byte count against a hand count."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from close import assert_close
from minillm.kernels.swiglu import bytes_moved, swiglu_cpu, swiglu_packed_rows, swiglu_rows


@pytest.mark.parametrize("M,Fh", [(1, 768), (64, 768), (17, 688), (3, 5)])
def test_swiglu_rows_equals_torch(M, Fh):
    g = torch.Generator().manual_seed(M + Fh)
    gate, up = torch.randn(M, Fh, generator=g) * 4, torch.randn(M, Fh, generator=g)
    # one exp (~1 ulp, or a fastmath approximation of a few), a division, two products: rtol 1e-6 is
    # ~10x that; atol 1e-7 for outputs near zero, where silu of a large negative gate underflows
    assert_close(torch.from_numpy(swiglu_cpu(gate.numpy(), up.numpy())), F.silu(gate) * up,
                 atol=1e-7, rtol=1e-6, name="swiglu_rows")


def test_extreme_gates_stay_finite():
    gate = np.array([[-100.0, -20.0, 0.0, 20.0, 100.0]], np.float32)
    out = np.empty_like(gate)
    swiglu_rows(gate, np.ones_like(gate), out)
    assert np.all(np.isfinite(out)) and out[0, 2] == 0 and out[0, 4] == 100.0


def test_out_may_be_gate():
    rng = np.random.default_rng(3)
    gate, up = rng.standard_normal((5, 688), dtype=np.float32), rng.standard_normal((5, 688), dtype=np.float32)
    want = swiglu_cpu(gate, up)
    swiglu_rows(gate, up, gate)                                      # the numba backend's h1 = silu(h1) * h3
    assert np.array_equal(gate, want)


def test_a_rows_result_does_not_depend_on_the_batch():
    rng = np.random.default_rng(0)
    gate, up = rng.standard_normal((10, 768), dtype=np.float32), rng.standard_normal((10, 768), dtype=np.float32)
    full = swiglu_cpu(gate, up)
    for m in range(10):
        assert np.array_equal(swiglu_cpu(gate[m:m + 1].copy(), up[m:m + 1].copy())[0], full[m])


def test_bytes_moved_against_a_hand_count():
    # 2 rows of 3: unfused silu reads gate (6), writes tmp (6); mul reads tmp (6), up (6), writes out (6):
    # 30 floats. Fused reads gate and up (12), writes out (6): 18 floats. 4 bytes each.
    assert bytes_moved(2, 3, fused=False) == 30 * 4
    assert bytes_moved(2, 3, fused=True) == 18 * 4
    assert bytes_moved(64, 768, True) / bytes_moved(64, 768, False) == 3 / 5


def test_wrapper_refuses_bad_arrays():
    with pytest.raises(ValueError, match=r"up has shape \(2, 4\): dimension 0 must be 3"):
        swiglu_cpu(np.ones((3, 4), np.float32), np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="gate must be float32"):
        swiglu_cpu(np.ones((3, 4), np.float16), np.ones((3, 4), np.float32))


@pytest.mark.parametrize("M,Fh", [(1, 768), (3, 688), (2, 5), (4, 513)])
def test_packed_halves_equal_the_two_array_form(M, Fh):
    """The numba forward's SwiGLU reads gate | up side by side in the fused w1|w3 output, in spans of SPAN
    elements (a row of 688 or 513 ends in a short span): every element is the same bits as swiglu_rows's."""
    rng = np.random.default_rng(M * Fh)
    h = rng.standard_normal((M, 2 * Fh), dtype=np.float32) * 4
    out = np.full((M, Fh), np.nan, np.float32)
    swiglu_packed_rows(h, out)
    assert np.array_equal(out, swiglu_cpu(np.ascontiguousarray(h[:, :Fh]), np.ascontiguousarray(h[:, Fh:])))
