"""CPU twins of the matmul family at real shapes against torch, and their batch independence."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.matmul import gemv_cpu, linear_cpu, matmul_cpu


@pytest.mark.parametrize("M,K,N", [(1, 288, 768), (7, 768, 288), (33, 256, 4096), (3, 5, 1), (5, 1100, 37)])
def test_matmul_cpu_equals_torch(M, K, N):
    g = torch.Generator().manual_seed(M + K + N)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    # float32 dot products of K <= 1100 terms in another order: errors ~sqrt(K) * 6e-8 * |terms| ~ 1e-5 absolute
    # (M = 7, 33: the 4-row, 2-row and 1-row micro-kernels; K = 5, 1100: a K % 8 tail; N = 37: four tiles of NR and
    # five single columns)
    assert_close(torch.from_numpy(matmul_cpu(x.numpy(), w.numpy())), x @ w.T, atol=2e-4, rtol=1e-4, name="matmul_cpu")
    assert_close(torch.from_numpy(gemv_cpu(w.numpy(), x[0].numpy())), w @ x[0], atol=1e-4, rtol=1e-4, name="gemv_cpu")


@pytest.mark.parametrize("K", [288, 1100, 5])   # whole 8-lane steps; a K % 8 tail; only the tail
def test_a_rows_result_does_not_depend_on_the_batch(K):
    """Each row of every batch size 1..9 (so it goes through the 4-row, 2-row or 1-row micro-kernel, at any place
    in it) equals that row computed alone, bit for bit; also from a wider array (rows with a stride)."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((9, K), dtype=np.float32), rng.standard_normal((300, K), dtype=np.float32)
    alone = [matmul_cpu(x[m:m + 1], w)[0] for m in range(9)]
    for M in range(1, 10):
        full = matmul_cpu(x[:M], w)
        for m in range(M):
            assert np.array_equal(full[m], alone[m]), (M, m)              # bit for bit
    wide = np.zeros((9, K + 3), np.float32)
    wide[:, :K] = x
    strided = np.empty((9, 300), np.float32)
    linear_cpu(wide[:, :K], w, strided)
    assert all(np.array_equal(strided[m], alone[m]) for m in range(9))
    assert all(np.array_equal(gemv_cpu(w, x[m]), alone[m]) for m in range(9))


def test_use_simulator_works_after_numba_is_imported_and_refuses_a_late_switch():
    """A notebook imports numba (print_machine does) before it asks for the simulator; that must still
    work, and switching once numba.cuda is loaded must fail loudly. In a fresh process: numba.cuda is
    loaded in this one."""
    import subprocess
    import sys
    code = ("import numba, numpy as np\n"
            "from minillm.kernels import use_simulator, simulating\n"
            "use_simulator()\n"
            "from minillm.kernels.matmul import matmul_cuda\n"
            "y = matmul_cuda(np.ones((3, 4), np.float32), np.ones((5, 4), np.float32))\n"
            "assert simulating() and (y == 4).all()\n"
            "try:\n    use_simulator(False)\nexcept RuntimeError as e:\n    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in __import__("os").environ.items() if k != "NUMBA_ENABLE_CUDASIM"})
    assert r.returncode == 0, r.stderr[-1000:]
    assert "refused: numba.cuda is already imported with the simulator on" in r.stdout
