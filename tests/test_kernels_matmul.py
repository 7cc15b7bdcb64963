"""CPU twins of the matmul family at real shapes against torch and against their plain-loop twins (the IR
micro-kernels against linear_rows_plain, vec8's dot8 / axpy8 against dot_plain / axpy_plain), and their batch
independence."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.matmul import LANES, gemv_cpu, linear_cpu, linear_rows_plain, matmul_cpu

U = 2.0 ** -24          # float32's unit roundoff


@pytest.mark.parametrize("M,K,N", [(1, 288, 768), (7, 768, 288), (33, 256, 4096), (3, 5, 1), (5, 1100, 37)])
def test_matmul_cpu_equals_torch(M, K, N):
    g = torch.Generator().manual_seed(M + K + N)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    # float32 dot products of K <= 1100 terms in another order: errors ~sqrt(K) * 6e-8 * |terms| ~ 1e-5 absolute
    # (M = 7, 33: the 4-row, 2-row and 1-row micro-kernels; K = 5, 1100: a K % 8 tail; N = 37: four tiles of NR and
    # five single columns)
    assert_close(torch.from_numpy(matmul_cpu(x.numpy(), w.numpy())), x @ w.T, atol=2e-4, rtol=1e-4, name="matmul_cpu")
    assert_close(torch.from_numpy(gemv_cpu(w.numpy(), x[0].numpy())), w @ x[0], atol=1e-4, rtol=1e-4, name="gemv_cpu")


def float32_order_bound(x, w, K):
    """How far two float32 evaluations of the same dot products in two summation orders may differ, elementwise.
    Higham ("Accuracy and Stability of Numerical Algorithms", 2002, eq. 3.5): a float32 dot product whose every
    term passes through at most n roundings is within gamma_n sum_k |x_k w_k| of the exact one, whatever the order,
    with gamma_n = n u / (1 - n u) <= (n + 1) u (for n u < 1 / (n + 1), all K here). The plain loop: term k's
    product is rounded, then every add after it, n = K. linear_cpu: a lane's fma chain (one rounding per step,
    K // 8 steps), the 3 adds of the lane tree, then one add per tail input (K % 8): n = K // 8 + 3 + K % 8. Two
    results each within their bound of the exact one differ by at most the sum. A bound for any order is the
    honest tolerance between two orders (the float32 rounding is all that differs); a dropped or doubled term
    (~|x_k w_k| ~ 1) lies far outside it at every K tested here, where K u sum |x w| < 0.1."""
    terms = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T          # (M, N) sum_k |x_k w_k|
    n_plain, n_tiled = K, K // LANES + 3 + K % LANES
    return (n_plain + 1 + n_tiled + 1) * U * terms


@pytest.mark.parametrize("M,K,N", [(1, 288, 768), (7, 768, 288), (33, 256, 64), (3, 5, 1), (5, 1100, 37), (9, 13, 17)])
def test_the_ir_micro_kernels_equal_their_plain_twin(M, K, N):
    """linear_cpu (4 x 1 / 2 x 1 / 1 x 1 and 2 x 4 / 1 x 4 register tiles in LLVM IR) against linear_rows_plain, the
    llama2.c loop, within float32_order_bound; and the plain twin itself against torch in float64, within its
    own part of that bound (gamma_K)."""
    rng = np.random.default_rng(M * 7 + K + N)
    x, w = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((N, K), dtype=np.float32)
    plain = linear_rows_plain(x, w)                                                 # (M, N)
    tiled = matmul_cpu(x, w)                                                        # (M, N)
    diff, bound = np.abs(tiled.astype(np.float64) - plain), float32_order_bound(x, w, K)
    worst = diff.argmax()
    assert (diff <= bound).all(), f"|linear_cpu - plain| {diff.flat[worst]:.3g} > its bound {bound.flat[worst]:.3g}"
    exact = (torch.from_numpy(x).double() @ torch.from_numpy(w).double().T).numpy()  # (M, N)
    terms = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T          # (M, N)
    assert (np.abs(plain - exact) <= (K + 1) * U * terms).all()
    assert_close(torch.from_numpy(plain), torch.from_numpy(exact).float(), atol=2e-4, rtol=1e-4, name="plain")


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
