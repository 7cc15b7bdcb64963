"""Notebook 03's kernel puzzles: each checker names the common mistakes (a missing guard, swapped axes, a
missing or divergent syncthreads, no zero padding, a serial sum, global reads not saved), survives bad
kernels, and finds a race on every run. Plain pytest, no simulator: the checkers run kernels in their own
emulator (minillm.labs.cuda_emulator.run_kernel); tests/cudasim/test_labs_puzzles.py compares it with numba's
simulator."""
import json
import os
import threading

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba import cuda  # noqa: E402  (numba.cuda without a GPU here: the emulator stands in)
from puzzle_kernels import THREADS, relu, scale_rows, sum_squares, tiled_matmul, window_sum  # noqa: E402

import minillm.labs.cuda_emulator as E  # noqa: E402
import minillm.labs.kernel_harness as K  # noqa: E402  (the harness notebook 03's checkers share)
from minillm.labs import (  # noqa: E402
    check_guard_kernel,
    check_map_kernel,
    check_scale_rows_kernel,
    check_sum_squares_kernel,
    check_tiled_matmul_kernel,
    check_window_sum_kernel,
)
from minillm.labs.student import strip_solutions  # noqa: E402


def failed_with(result, *words):
    assert not result, repr(result)
    for w in words:
        assert w in result.message, (w, repr(result))


# ----------------------------------------------------------------------------- solutions pass

@pytest.mark.parametrize("check,kernel,kind", [
    (check_map_kernel, relu("thread"), "warm-up"), (check_guard_kernel, relu(), "warm-up"),
    (check_scale_rows_kernel, scale_rows(), "warm-up"), (check_window_sum_kernel, window_sum(), "core"),
    (check_sum_squares_kernel, sum_squares(), "core"), (check_tiled_matmul_kernel, tiled_matmul(), "core")])
def test_the_solutions_pass(check, kernel, kind):
    result = check(kernel)
    assert result and result.kind == kind, repr(result)


# ----------------------------------------------------------------------------- warm-ups: map, guard, 2-D grid

def test_map_all_threads_on_one_element_and_a_returned_value():
    failed_with(check_map_kernel(relu("block")), "both write out[0]", "i = cuda.threadIdx.x")

    def returns(x, out):
        return max(x[cuda.threadIdx.x], 0.0)
    failed_with(check_map_kernel(returns), "returned", "a CUDA kernel returns nothing")


def test_guard_missing_and_thread_index_instead_of_grid_index():
    failed_with(check_guard_kernel(relu(guard=False)), "thread 2 of block 2 (i = 10) reads x[10], outside x",
                "guard the whole body with if i < x.shape[0]")
    failed_with(check_guard_kernel(relu("thread")), "thread 0 of block 0 (i = 0) and thread 0 of block 1 (i = 4) "
                "both write out[0]", "i = cuda.grid(1)")


def test_scale_rows_swapped_axes_are_named_even_when_the_values_are_right():
    failed_with(check_scale_rows_kernel(scale_rows(swapped=True)), "wrote out[1, 0], not out[0, 1]",
                "the grid's x runs along columns n")
    failed_with(check_scale_rows_kernel(scale_rows(guard=False)), "a thread past the edge must do nothing")


# ----------------------------------------------------------------------------- puzzle 4: shared tile

def test_window_sum_without_syncthreads_is_a_race():
    failed_with(check_window_sum_kernel(window_sum(sync=False)), "reads tile[1] and thread 1 of block 0 (i = 1) "
                "writes it (shared memory) with no cuda.syncthreads() between them: a race",
                "cuda.syncthreads() after loading the tile")


def test_window_sum_halo_without_zeros_reads_before_the_start():
    """numpy would wrap x[-2] to x[n-2]: the emulator treats a negative index as out of range, as a GPU."""
    failed_with(check_window_sum_kernel(window_sum(zero_halo=False)), "reads x[-2], outside x",
                "the halo of block 0 lies before the start of x: load 0.0 there")


def test_window_sum_missing_guard_early_return_and_global_reads():
    failed_with(check_window_sum_kernel(window_sum(guard_load=False)), "thread 5 of block 1 (i = 13) reads x[13]",
                "threads past the end of x have no element to load")
    failed_with(check_window_sum_kernel(window_sum(early_return=True)), "divergent cuda.syncthreads()",
                "finished (returned) while thread 0 waits", "guard the load and the write, do not return")
    failed_with(check_window_sum_kernel(window_sum(from_global=True)), "x[0] is read 3 times from global memory",
                "take the neighbours from the tile")


# ----------------------------------------------------------------------------- puzzle 5: block reduction

def test_reduction_without_syncthreads_is_a_race_on_every_run():
    """In numba's simulator this kernel gives a wrong sum most of the time, not always (Python's thread
    switching decides); the checker's emulator runs threads in turn and finds the race each time."""
    for _ in range(3):
        failed_with(check_sum_squares_kernel(sum_squares(sync_steps=False)), "reads part[1] and thread 1 of block 0 "
                    "writes it (shared memory) with no cuda.syncthreads() between them: a race",
                    "cuda.syncthreads() after loading part and after every step")
    failed_with(check_sum_squares_kernel(sum_squares(sync_load=False, sync_steps=False)), "a race")


def test_reduction_syncthreads_inside_the_if_is_divergent():
    failed_with(check_sum_squares_kernel(sum_squares(sync_in_if=True)), "divergent cuda.syncthreads()",
                "thread 4 finished (returned) while thread 0 waits", "not only those with t < step")


def test_reduction_no_zero_padding_serial_sum_and_every_thread_writing():
    failed_with(check_sum_squares_kernel(sum_squares(pad=False)), "x 2x5", "reads part[5] before any thread of its "
                "block wrote it (uninitialised shared memory", "they put 0.0 in part[t]")
    failed_with(check_sum_squares_kernel(sum_squares(serial=True)), "reads 8 elements of part in one go: a serial "
                "sum", "if t < step: part[t] += part[t + step]")
    failed_with(check_sum_squares_kernel(sum_squares(one_writer=False)), "both write out[0] (global memory)",
                "one thread (t == 0) writes out[m]")


# ----------------------------------------------------------------------------- puzzle 6: tiled matmul

def test_matmul_missing_either_syncthreads_is_a_race():
    for mistake in ({"sync_before": False}, {"sync_after": False}):
        failed_with(check_tiled_matmul_kernel(tiled_matmul(**mistake)), "(shared memory) with no cuda.syncthreads() "
                    "between them: a race", "two syncthreads per k-tile")


def test_matmul_without_zero_padding_is_named():
    failed_with(check_tiled_matmul_kernel(tiled_matmul(pad=False)), "(M, K, N) = (6, 10, 7)",
                "before any thread of its block wrote it", "0.0 where the tile sticks out of x or w")
    # zeros past the edges of y but stale entries past the end of K: the values say it
    failed_with(check_tiled_matmul_kernel(tiled_matmul(pad=False, pad_k=False)), "outputs wrong",
                "right when M, K and N are multiples of 4, wrong on ragged edges",
                "a stale value from the previous tile enters the sum")


def test_matmul_unguarded_loads_early_return_naive_reads_and_a_transposed_tile():
    failed_with(check_tiled_matmul_kernel(tiled_matmul(guard_loads=False)), "reads x[0, 10], outside x",
                "tile entries outside x or w are 0.0, not reads")
    failed_with(check_tiled_matmul_kernel(tiled_matmul(early_return=True)), "divergent cuda.syncthreads()",
                "guard only the final write of y")
    failed_with(check_tiled_matmul_kernel(tiled_matmul(naive=True)), "x[0, 0] is read 4 times from global memory",
                "the tiled kernel once per block that needs it (once here)")
    failed_with(check_tiled_matmul_kernel(tiled_matmul(ws_transposed=True)), "outputs wrong",
                "adds xs[ty, j] * ws[tx, j]")


# ----------------------------------------------------------------------------- bad kernels fail cleanly

def test_bad_kernels_fail_cleanly_and_the_next_attempt_passes(monkeypatch):
    monkeypatch.setattr(E, "KERNEL_LIMIT_S", 0.5)
    before = threading.active_count()

    def raises(x, out):
        raise ZeroDivisionError("oops")

    def spins(x, out):
        while True:
            try:
                pass
            except Exception:          # a kernel's broad except does not swallow the stop
                pass

    def syncs_forever(x, out):
        while True:
            cuda.syncthreads()

    def wrong_index_type(x, out):
        out[cuda.grid(1) / 1] = 0.0

    def atomics(x, out):
        cuda.atomic.add(out, 0, 1.0)
    cases = {raises: "ZeroDivisionError: thread 0 of block 0 (i = 0): oops",
             spins: "did not finish: an endless loop", syncs_forever: "did not finish: an endless loop",
             wrong_index_type: "IndexError", atomics: "cuda.atomic is not available",
             (lambda x: x): "wrong signature", None: "expected a function"}
    for kernel, want in cases.items():
        result = check_guard_kernel(kernel)
        failed_with(result, want)
        assert check_guard_kernel(relu()), "the next attempt starts clean"
    # <=: a thread another test started (a subprocess's reader) may end meanwhile; none of ours may remain
    assert threading.active_count() <= before, "every emulated thread ended"


def test_the_readers_globals_are_left_alone():
    ns = {}
    exec("from numba import cuda\n"
         "def k(x, out):\n"
         "    i = cuda.grid(1)\n"
         "    if i < x.shape[0]:\n"
         "        out[i] = max(x[i], 0.0)\n", ns)
    real = ns["cuda"]
    assert check_guard_kernel(ns["k"])
    assert ns["cuda"] is real and not isinstance(ns["cuda"], E._FakeCuda)


def test_a_stub_fails_as_not_implemented():
    src = ("from numba import cuda\n"
           "def my_k(x, out):\n"
           '    """doc"""\n'
           "    ### BEGIN SOLUTION\n"
           "    pass\n"
           "    ### END SOLUTION\n")
    ns = {}
    exec(strip_solutions(src), ns)
    failed_with(check_window_sum_kernel(ns["my_k"]), "not implemented")


# ----------------------------------------------------------------------------- the emulator itself

def test_emulator_runs_threads_in_turn_between_barriers_and_logs_phases():
    x = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)
    out = np.full(3, np.nan, np.float32)
    run = E.run_kernel(sum_squares(), 3, THREADS, x, out)
    assert run.error is None and run.divergent is None
    assert np.allclose(out, (x.astype(np.float64) ** 2).sum(1))
    assert K._first_race(run) is None and K._first_uninitialised(run) is None
    assert run.log.spaces == {"x": "global", "out": "global", "part": "shared"}
    # block 0: the load, then 3 steps: 4 barriers, so the block's accesses fall in 5 phases
    assert len({p for e, p in zip(run.log.events, run.phases) if e.block == (0, 0, 0)}) == 5
    assert run.log.reads_per_element("x").tolist() == [[2] * 8] * 3     # x[m, t] * x[m, t]: two reads


def test_out_of_range_negative_and_past_the_end():
    for i, want in ((-1, "read x[-1]"), (4, "read x[4]")):
        def kernel(x, out, i=i):
            out[0] = x[i]
        run = E.run_kernel(kernel, 1, 1, np.zeros(4, np.float32), np.zeros(1, np.float32))
        assert isinstance(run.error, E.OutOfRange) and want in str(run.error)


# ----------------------------------------------------------------------------- the picture

def test_draw_puzzle_draws_the_pass_and_the_failure_and_nothing_stale():
    from minillm.viz.kernels_nb03 import draw_puzzle
    try:
        result = check_window_sum_kernel(window_sum())
        assert draw_puzzle(result) is result and plt.get_fignums()
        assert "pass, n = 13" in plt.gcf()._suptitle.get_text()
        plt.close("all")
        result = check_window_sum_kernel(window_sum(sync=False))
        draw_puzzle(result)
        assert "fail, n = 13, 2 blocks of 8 threads: a race on tile[1]" in plt.gcf()._suptitle.get_text()
        plt.close("all")
        draw_puzzle(check_window_sum_kernel(lambda x: x))      # failed before any launch: no picture
        assert not plt.get_fignums()
    finally:
        plt.close("all")


# ----------------------------------------------------------------------------- the notebook's solutions compile

def notebook_solutions():
    path = os.path.join(os.path.dirname(__file__), "..", "notebooks", "03_kernels_numba_cuda.ipynb")
    cells = ["".join(c["source"]) for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
    return [c for c in cells if "### BEGIN SOLUTION" in c and "cuda." in c]


def test_the_notebook_solutions_compile_for_a_gpu():
    """The emulator runs any Python; a GPU runs what numba compiles: every kernel solution of the notebook
    compiles to PTX (NVVM, no GPU needed), so it would run on a real device as it is."""
    from minillm.kernels import simulating
    if simulating():
        pytest.skip("the simulator is on in this process: no compiler")
    sigs = {1: "float32[::1]", 2: "float32[:, ::1]"}
    shapes = {"my_relu_map": (1, 1), "my_relu_guard": (1, 1), "my_scale_rows": (2, 1, 1, 2),
              "my_window_sum": (1, 1), "my_sum_squares": (2, 1), "my_tiled_matmul": (2, 2, 2)}
    cells = notebook_solutions()
    assert len(cells) == len(shapes)
    for src in cells:
        ns = {}
        exec(compile(src, "<solution>", "exec"), ns)
        name = next(n for n in shapes if n in ns)
        try:
            ptx, _ = cuda.compile_ptx(ns[name], f"void({', '.join(sigs[d] for d in shapes[name])})", cc=(8, 0))
        except Exception as e:  # noqa: BLE001
            if "NVVM" in str(e) or "libnvvm" in str(e).lower():
                pytest.skip(f"no NVVM to compile with: {e}")
            raise
        assert ".entry" in ptx, name
