"""Notebook 03's kernel puzzles with numba's simulator on (as in the notebook): the checkers' emulator and
the simulator agree on what a kernel computes and on who reads what (the access recorder's counts), and
the checkers' GPU path runs (the simulator standing in for the GPU). Tiny
launches only: a few blocks of 8 or 16 threads. The checkers' own tests: tests/test_labs_nb03.py."""
import numpy as np
import puzzle_kernels
from minillm.kernels.access_trace import record_accesses
from numba import cuda, float32  # (the simulator's: conftest checks NUMBA_ENABLE_CUDASIM=1)
from puzzle_kernels import THREADS, TILE_LEN, TW

from minillm.labs import check_window_sum_kernel
from minillm.labs.cuda_emulator import run_kernel

window_sum, tiled_matmul = puzzle_kernels.window_sum(), puzzle_kernels.tiled_matmul()    # the right ones


def test_emulator_and_simulator_agree_on_values_and_reads():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((6, 10), dtype=np.float32), rng.standard_normal((7, 10), dtype=np.float32)
    launches = [(window_sum, 2, THREADS, (x[0].copy(), np.zeros(10, np.float32)), ["x", "tile"]),
                (tiled_matmul, (2, 2), (TW, TW), (x, w, np.zeros((6, 7), np.float32)), ["x", "w", "xs", "ws"])]
    for kernel, grid, block, args, arrays in launches:
        ours = [a.copy() for a in args]
        sims = [a.copy() for a in args]
        run = run_kernel(kernel, grid, block, *ours)
        log = record_accesses(kernel, grid, block, *sims)
        assert run.error is None and np.array_equal(ours[-1], sims[-1]), kernel.__name__
        for a in arrays:
            assert np.array_equal(run.log.reads_per_element(a), log.reads_per_element(a)), (kernel.__name__, a)
            assert np.array_equal(run.log.writes_per_element(a), log.writes_per_element(a)), (kernel.__name__, a)



def test_on_a_gpu_the_checkers_also_launch_for_real(monkeypatch):
    """The GPU path (a real cuda.jit launch after the emulator), with the simulator standing in for the GPU:
    a kernel that is right in the emulator but writes nothing in the real launch fails, and says so."""
    import minillm.kernels as mk
    monkeypatch.setattr(mk, "gpu_available", lambda: True)
    assert check_window_sum_kernel(cuda.jit(window_sum))     # a simulator kernel: the emulator runs its body

    def only_in_the_emulator(x, out):
        tile = cuda.shared.array(TILE_LEN, float32)
        t, i, n = cuda.threadIdx.x, cuda.grid(1), x.shape[0]
        tile[t + 2] = x[i] if i < n else float32(0.0)
        if t < 2:
            tile[t] = x[i - 2] if i >= 2 else float32(0.0)
        cuda.syncthreads()
        if i < n and hasattr(cuda, "_launch"):     # the checker's stand-in for numba.cuda has one
            out[i] = tile[t] + tile[t + 1] + tile[t + 2]
    result = check_window_sum_kernel(only_in_the_emulator)
    assert not result and "right in the checker's emulator, wrong on the GPU" in result.message, repr(result)
