"""The 2:4 layout (values + 2-bit indices) and its numba GEMV, against a torch reference that reads the layout."""
import numpy as np
import pytest
import torch
import torch.nn as nn
from close import assert_close
from minillm.kernels.sparse24 import compress_24, decompress_24, dense_gemv_rows, sparse24_gemv_cpu, sparse24_gemv_rows

from minillm.llama.linears import Sparse24Linear


def torch_reference(values, meta, K):
    """The layout read back by torch, independently of decompress_24: value v of a row sits in group v // 2 at the
    2-bit position (meta[v // 4] >> 2 (v % 4)) & 3."""
    vals, mt = torch.from_numpy(values).double(), torch.from_numpy(meta).long()       # (N, K/2), (N, K/8)
    N = vals.shape[0]
    w = torch.zeros(N, K, dtype=torch.float64)
    for v in range(K // 2):
        pos = (mt[:, v // 4] >> (2 * (v % 4))) & 3                                   # (N,)
        w[torch.arange(N), 4 * (v // 2) + pos] += vals[:, v]
    return w                                                                          # (N, K)


def random_24(N, K, seed):
    """A 2:4 weight with every kind of group: 2 nonzeros at random positions, 1 nonzero, none."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, K // 4, 4)).astype(np.float32)                        # (N, K/4, 4) groups
    rank = rng.random((N, K // 4, 4)).argsort(-1).argsort(-1)                        # a random order per group
    kept = rng.choice([0, 1, 2, 2, 2], size=(N, K // 4, 1))                           # nonzeros per group
    return (w * (rank < kept)).reshape(N, K)


@pytest.mark.parametrize("N,K", [(5, 8), (33, 64), (256, 768)])
def test_compress_round_trip_and_layout(N, K):
    w = random_24(N, K, seed=N + K)
    values, meta = compress_24(w)
    assert values.shape == (N, K // 2) and values.dtype == np.float32
    assert meta.shape == (N, K // 8) and meta.dtype == np.uint8
    assert np.array_equal(decompress_24(values, meta), w)                             # exact: values are copied
    assert torch.equal(torch_reference(values, meta, K), torch.from_numpy(w).double())
    assert values.nbytes + meta.nbytes == (2 * K + K // 8) * N                        # 0.53x of 4K bytes per row


# float32 sums of K/2 <= 384 products (|w|, |x| ~ 1) in a different order from torch's float64: rounding
# ~sqrt(K) * 6e-8 of the sum of |terms| (~K/2); 1e-4 absolute and relative covers it with > 10x margin.
@pytest.mark.parametrize("M,N,K", [(1, 768, 256), (1, 256, 768), (3, 17, 16), (2, 1, 8)])
def test_sparse24_gemv_equals_torch(M, N, K):
    w = random_24(N, K, seed=M * N + K)
    values, meta = compress_24(w)
    x = np.random.default_rng(K).standard_normal((M, K)).astype(np.float32)
    y = np.empty((M, N), np.float32)
    sparse24_gemv_rows(x, values, meta, y)
    want = torch.from_numpy(x).double() @ torch_reference(values, meta, K).T         # (M, N)
    assert_close(torch.from_numpy(y).double(), want, atol=1e-4, rtol=1e-4, name="sparse24_gemv_rows")
    assert np.array_equal(sparse24_gemv_cpu(x[0], values, meta), y[0])                # (K,) in, (N,) out
    dense = np.empty((M, N), np.float32)
    dense_gemv_rows(x, w, dense)                                                      # the bench's baseline
    assert_close(torch.from_numpy(dense).double(), want, atol=1e-4, rtol=1e-4, name="dense_gemv_rows")


def test_compress_refuses_what_is_not_24():
    w = np.zeros((4, 16), np.float32)
    w[2, 4:7] = 1.0                                                                   # 3 nonzeros in group 1 of row 2
    with pytest.raises(ValueError, match="row 2, inputs 4..7 hold 3 nonzeros"):
        compress_24(w)
    with pytest.raises(ValueError, match="K = 12"):
        compress_24(np.zeros((2, 12), np.float32))
    values, meta = compress_24(np.zeros((2, 16), np.float32))
    with pytest.raises(ValueError, match="meta"):
        sparse24_gemv_cpu(np.zeros(16, np.float32), values, meta[:, :1].copy())


def test_sparse24_linear_one_row_and_many_rows_match_the_dense_layer():
    torch.manual_seed(0)
    w = torch.from_numpy(random_24(48, 64, seed=1))
    lin = nn.Linear(64, 48, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    sp, err = Sparse24Linear.from_linear(lin)
    assert err == 0.0 and (sp.in_features, sp.out_features) == (64, 48)
    assert torch.equal(sp.dequantize(), w)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        want = lin(x)                                                                 # (2, 5, 48)
        assert_close(sp(x), want, atol=1e-5, rtol=1e-5, name="many rows (dense matmul)")
        assert_close(sp(x[:1, :1]), want[:1, :1], atol=1e-5, rtol=1e-5, name="one row (numba GEMV)")
    assert sp(x[:1, :1]).shape == (1, 1, 48)
    lin3 = nn.Linear(8, 2, bias=False)
    with torch.no_grad():
        lin3.weight.fill_(1.0)                                                        # 4 of 4 nonzero: not 2:4
    with pytest.raises(ValueError, match="not 2:4 sparse"):
        Sparse24Linear.from_linear(lin3)
