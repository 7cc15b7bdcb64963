"""Quantizers and the CPU dequantizing GEMVs at real shapes, against torch dequantizing the same layout."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.quant_gemv import (
    int4_gemv_cpu,
    int4_gemv_rows,
    int8_gemv_cpu,
    int8_gemv_rows,
    quantize_int4,
    quantize_int8,
)


def torch_dequant_int4(packed, scales, group):
    """DESIGN.md's int4 layout read back by torch: even k = low nibble, odd k = high nibble, stored q + 8."""
    p = torch.from_numpy(packed).long()                                        # (N, K/2)
    q = torch.stack([(p & 15) - 8, (p >> 4) - 8], dim=2).flatten(1)            # (N, K): k = 2j, 2j + 1
    return q.double() * torch.from_numpy(scales).double().repeat_interleave(group, dim=1)  # (N, K)


def data(M, N, K, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((N, K), dtype=np.float32)


# float32 sums of K <= 768 integer-weighted terms (|q| <= 127, |x| ~ 1) in another order than torch's float64:
# relative rounding ~sqrt(K) * 6e-8 of the sum of |terms|; 1e-4 of the output scale covers it with >10x margin.
@pytest.mark.parametrize("M,N,K", [(1, 768, 288), (7, 288, 768), (3, 33, 5), (2, 1, 1)])
def test_int8_gemv_rows_equals_torch(M, N, K):
    x, w = data(M, N, K, seed=M + N + K)
    w_q, scales, err = quantize_int8(w)
    y = np.empty((M, N), np.float32)
    int8_gemv_rows(x, w_q, scales, y)
    deq = torch.from_numpy(w_q).double() * torch.from_numpy(scales).double()[:, None]      # (N, K)
    want = torch.from_numpy(x).double() @ deq.T                                             # (M, N)
    assert_close(torch.from_numpy(y).double(), want, atol=1e-4, rtol=1e-4, name="int8_gemv_rows")
    assert np.array_equal(int8_gemv_cpu(x[0], w_q, scales), y[0])                           # (K,) in, (N,) out


@pytest.mark.parametrize("M,N,K,G", [(1, 768, 288, 32), (5, 288, 768, 128), (3, 17, 40, 8), (2, 3, 6, 2)])
def test_int4_gemv_rows_equals_torch(M, N, K, G):
    x, w = data(M, N, K, seed=M + N + K + G)
    packed, scales, err = quantize_int4(w, G)
    y = np.empty((M, N), np.float32)
    int4_gemv_rows(x, packed, scales, G, y)
    want = torch.from_numpy(x).double() @ torch_dequant_int4(packed, scales, G).T           # (M, N)
    assert_close(torch.from_numpy(y).double(), want, atol=1e-4, rtol=1e-4, name="int4_gemv_rows")
    assert np.array_equal(int4_gemv_cpu(x[0], packed, scales, G), y[0])


def test_quantizers_report_their_own_error_and_stay_within_half_a_step():
    _, w = data(1, 64, 256, seed=9)
    w_q, scales, err = quantize_int8(w)
    deq = w_q.astype(np.float64) * scales[:, None]
    assert err == pytest.approx(np.abs(deq - w).max(), rel=1e-6)
    assert np.all(np.abs(deq - w) <= scales[:, None] / 2 * (1 + 1e-5))         # rounding: half a step at most
    packed, scales4, err4 = quantize_int4(w, 32)
    deq4 = torch_dequant_int4(packed, scales4, 32).numpy()
    assert err4 == pytest.approx(np.abs(deq4 - w).max(), rel=1e-6)
    assert np.all(np.abs(deq4 - w) <= np.repeat(scales4, 32, axis=1) / 2 * (1 + 1e-5))
    assert err < err4                                                          # 8 bits beat 4


def test_int4_layout_by_hand():
    w = np.array([[7.0, -7.0, 0.0, 7.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    packed, scales, err = quantize_int4(w, 4)
    # row 0: scale 1, q = 7, -7, 0, 7 -> stored 15, 1, 8, 15 -> bytes 15 | 1 << 4, 8 | 15 << 4
    assert packed.tolist() == [[31, 248], [136, 136]] and scales.tolist() == [[1.0], [0.0]] and err == 0.0
    y = int4_gemv_cpu(np.array([1.0, 2.0, 3.0, 4.0], np.float32), packed, scales, 4)
    assert y.tolist() == [7 - 14 + 0 + 28, 0.0]


def test_quantized_gemv_approximates_the_float_gemv():
    x, w = data(4, 96, 256, seed=3)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = np.abs(x).sum(axis=1, keepdims=True)                               # |y - y_q| <= sum_k |x_k| * err
    w_q, s, err = quantize_int8(w)
    assert np.all(np.abs(int8_gemv_cpu(x, w_q, s) - exact) <= bound * err + 1e-3)
    packed, s4, err4 = quantize_int4(w, 32)
    assert np.all(np.abs(int4_gemv_cpu(x, packed, s4, 32) - exact) <= bound * err4 + 1e-3)


def test_wrappers_and_quantizer_refuse_bad_shapes():
    x, w = data(2, 8, 12, seed=0)
    with pytest.raises(ValueError, match="K = 7 must be even"):
        quantize_int4(w[:, :7], 7)
    with pytest.raises(ValueError, match="K = 12 is not divisible by the group size G = 8"):
        quantize_int4(w, 8)
    packed, s4, _ = quantize_int4(w, 4)
    with pytest.raises(ValueError, match="K = 12 is not divisible by the group size G = 8"):
        int4_gemv_cpu(x, packed, s4, 8)
    with pytest.raises(ValueError, match="w_packed must be uint8, got int8"):
        int4_gemv_cpu(x, packed.view(np.int8), s4, 4)
    w_q, s, _ = quantize_int8(w)
    with pytest.raises(ValueError, match="w_q must be int8, got float32"):
        int8_gemv_cpu(x, w_q.astype(np.float32), s)
    with pytest.raises(ValueError, match=r"scales has shape \(7,\): dimension 0 must be 8"):
        int8_gemv_cpu(x, w_q, s[:7].copy())
