"""Checkers for notebook 03_kernels_numba_cuda: the kernel puzzles, a map, a guard and a 2-D grid
(warm-ups), then a shared-memory tile, a block reduction and the tiled matmul (core), and counting the
tiled matmul's global reads (a warm-up).

How a kernel is run: cuda_emulator.run_kernel runs the reader's kernel body one CUDA thread at a time,
in a fixed order, logging every read and write with its thread and phase, which makes each classic
kernel bug a fact the checker can name instead of a race that may or may not show:

* out of range: an index outside the array (negative ones too, which numpy would silently wrap);
* a race: two threads touch one element, at least one writing, with no syncthreads between them
  (same block, same phase; or, in global memory, two different blocks, which can never wait for each other);
* divergent syncthreads: some threads of a block wait at a barrier that others skip or return before;
* uninitialised shared memory: a slot read before any thread of the block wrote it (it starts as NaN).

In numba's simulator a missing syncthreads gives a wrong sum most of the time, not every time (the
Python threads' switching decides); here it is found on every run. The log is an AccessLog, so
minillm.viz.kernels_nb03.draw_puzzle can draw what the reader's kernel touched. On a real GPU the
checkers launch the kernel for real as well (cuda.jit), to catch what only the compiler sees.
"""
from __future__ import annotations

import numpy as np

from .common import checker
from .cuda_emulator import _elem, _who
from .kernel_harness import PICTURES, _blocks, _compare, _fail, _gpu_agrees, _launch, _times

# ----------------------------------------------------------------------------- warm-ups

@checker
def check_scale_rows_kernel(fn):
    """fn(x (M, N), scale (M,), weight (N,), out (M, N)): a CUDA kernel body, out[m, n] = x[m, n] * scale[m]
    * weight[n], one thread per element, launched with grid (blocks(N, bx), blocks(M, by)), block (bx, by)"""
    name = "check_scale_rows_kernel"
    PICTURES.pop(name, None)
    rng = np.random.default_rng(3)
    arrays = ["x", "scale", "weight"]
    for M, N, block in [(1, 1, (4, 4)), (5, 7, (8, 4)), (13, 10, (8, 8)), (16, 3, (4, 16))]:
        x = rng.standard_normal((M, N), dtype=np.float32)
        scale = rng.random(M, dtype=np.float32) + 0.5
        weight = rng.standard_normal(N, dtype=np.float32)
        out = np.full((M, N), np.nan, np.float32)                 # NaN marks an element no thread wrote
        grid = (_blocks(N, block[0]), _blocks(M, block[1]))
        where = f"(M, N) = ({M}, {N}), grid {grid}, block {block}"
        run = _launch(name, fn, grid, block, (x, scale, weight, out), where=where, arrays=arrays,
                      show=((0, 1), (3, 0)) if (M, N) == (5, 7) else None,
                      hints={"range": lambda e: "the grid has more threads than elements, so a thread past the "
                                                "edge must do nothing (if m < M and n < N), and the grid's x runs "
                                                "along columns n, y along rows m: n, m = cuda.grid(2)",
                             "race": "one thread per element: n, m = cuda.grid(2)"})
        for e in run.log.events:                                  # thread (gx, gy) must own out[gy, gx]
            if e.array == "out" and e.kind == "write":
                gx, gy = (b * d + t for b, d, t in zip(e.block[:2], block, e.thread[:2]))
                if np.unravel_index(e.index, (M, N)) != (gy, gx):
                    _fail(name, run, arrays, (e.block, e.thread), where, "swapped axes",
                        f"{_who(run.log, e.block, e.thread)} (x = {gx}, y = {gy}) wrote "
                        f"{_elem(run.log, 'out', e.index)}, not out[{gy}, {gx}]: the grid's x runs along columns "
                        "n (neighbouring threads, neighbouring addresses: coalesced), y along rows m: "
                        "n, m = cuda.grid(2)")
        missed = np.argwhere(np.isnan(out))
        assert not len(missed), (f"{where}: {len(missed)} of {M * N} outputs never written, "
                                 f"e.g. out[{', '.join(str(int(i)) for i in missed[0])}]; "
                                 "the grid's x runs along columns n, y along rows m: n, m = cuda.grid(2)")
        want = x * scale[:, None] * weight[None, :]
        _compare(name, run, out, want, where, "out", arrays, atol=1e-6)
        _gpu_agrees(fn, grid, block, (x, scale, weight, out), 3, want, where)
    return "every element written once, by its own thread, right value; extra threads at the edges do nothing"


@checker
def check_global_reads(fn):
    """fn(M, K, N, tile) -> (element reads of x, element reads of w) from global memory by the tiled matmul
    y (M, N) = x (M, K) @ w (N, K)^T with tile x tile blocks (minillm.kernels.matmul.matmul_tiled)"""
    cases = [(16, 20, 32, 16), (5, 7, 3, 16), (17, 33, 40, 16), (64, 64, 64, 8), (3, 5, 7, 1), (100, 30, 1, 32)]
    for M, K, N, tile in cases:
        # a block loads its TILE rows of x and of w once per k-tile: x is read once per block column
        # (ceil(N / tile) of them), w once per block row; out-of-range tile entries are zeros, not reads
        want = (M * K * -(-N // tile), N * K * -(-M // tile))
        got = fn(M, K, N, tile)
        assert tuple(got) == want, f"(M, K, N) = ({M}, {K}, {N}), tile {tile}: got {tuple(got)}, expected {want}"
    return "x read ceil(N/tile) times per element, w ceil(M/tile) times; tile = 1 is the naive kernel"


# ----------------------------------------------------------------------------- the puzzles

def _relu_case(name, fn, n, threads, where, show, hints):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n, dtype=np.float32)
    out = np.full(n, np.nan, np.float32)
    grid = _blocks(n, threads)
    run = _launch(name, fn, grid, threads, (x, out), where=where, arrays=["x", "out"], show=show, hints=hints)
    want = np.maximum(x, 0)
    _compare(name, run, out, want, where, "out", ["x", "out"])
    _gpu_agrees(fn, grid, threads, (x, out), 1, want, where)
    return run


@checker(kind="warm-up", signature="x, out")
def check_map_kernel(fn):
    """Puzzle 1, map: fn(x (n,), out (n,)), out[i] = max(x[i], 0) (ReLU), launched as ONE block of exactly n
    threads: thread i does element i"""
    name = "check_map_kernel"
    PICTURES.pop(name, None)
    hints = {"race": "each thread owns one element: i = cuda.threadIdx.x",
             "range": lambda e: "this launch has exactly one thread per element: i = cuda.threadIdx.x"}
    for n in (8, 5, 1):
        _relu_case(name, fn, n, n, f"one block of {n} threads, n = {n}", (0, 3) if n == 8 else None, hints)
    return "thread i reads x[i] and writes out[i] = max(x[i], 0), once"


@checker(kind="warm-up", signature="x, out")
def check_guard_kernel(fn):
    """Puzzle 2, guard: fn(x (n,), out (n,)), out[i] = max(x[i], 0), launched with blocks of 4 threads,
    ceil(n / 4) of them: the last block has threads past the end of x, which must do nothing"""
    name = "check_guard_kernel"
    PICTURES.pop(name, None)
    hints = {"race": "each thread of the grid owns one element: i = cuda.grid(1), which is blockIdx.x * "
                     "blockDim.x + threadIdx.x (threadIdx.x alone repeats in every block)",
             "range": lambda e: ("the last block has threads past the end: guard the whole body with "
                                 "if i < x.shape[0] (before any read)" if e.index[0] >= 0 else
                                 "i = cuda.grid(1) is never negative: check how i is computed")}
    for n in (10, 3, 8):
        _relu_case(name, fn, n, 4, f"n = {n}, {_blocks(n, 4)} blocks of 4 threads", (2, 1) if n == 10 else None,
                   hints)
    return "i = cuda.grid(1); threads with i >= n do nothing; every element written once"


@checker(kind="core", signature="x, out")
def check_window_sum_kernel(fn):
    """Puzzle 4, shared-memory tile: fn(x (n,), out (n,)), out[i] = x[i-2] + x[i-1] + x[i] (terms before the
    start are 0), blocks of 8 threads. Each block copies its 8 elements and the 2 before them (the halo, zeros
    before the start of x) into a shared tile of 10, syncthreads, then sums 3 neighbours out of the tile."""
    name = "check_window_sum_kernel"
    PICTURES.pop(name, None)
    T, arrays = 8, ["x", "tile", "out"]

    def range_hint(e):
        if e.array == "x" and e.index[0] < 0:
            return ("the halo of block 0 lies before the start of x: load 0.0 there "
                    "(numpy would wrap x[-1] to the last element, a GPU reads garbage)")
        if e.array == "out":
            return "threads past the end of x write nothing: guard the write with if i < n"
        return "threads past the end of x have no element to load: put 0.0 in their tile slot (or skip the load)"
    hints = {"range": range_hint,
             "race": "every tile slot is written by one thread and read by others: cuda.syncthreads() after "
                     "loading the tile, before reading it",
             "uninit": "tile[0] and tile[1] hold x[b*8 - 2] and x[b*8 - 1] (the halo, loaded by two of the "
                       "threads, 0.0 before the start of x), tile[t + 2] holds x[i]",
             "diverge": "threads past the end of x still call syncthreads: guard the load and the write, do not return"}
    for n in (13, 8, 2, 16):
        rng = np.random.default_rng(n)
        x = rng.standard_normal(n, dtype=np.float32)
        out = np.full(n, np.nan, np.float32)
        grid, where = _blocks(n, T), f"n = {n}, {_blocks(n, T)} blocks of {T} threads"
        run = _launch(name, fn, grid, T, (x, out), where=where, arrays=arrays, show=(1, 0) if n == 13 else None,
                      hints=hints)
        want = x.copy()
        want[1:] += x[:-1]
        want[2:] += x[:-2]
        _compare(name, run, out, want, where, "out", arrays)
        reads = run.log.reads_per_element("x")
        if reads.max() > 2 or "tile" not in run.log.shapes:
            j = int(reads.argmax())
            _fail(name, run, arrays, None, where, f"x[{j}] read {_times(reads[j])}",
                  f"x[{j}] is read {_times(reads[j])} from global memory: read each element once into the shared "
                  "tile (the halo: twice) and take the neighbours from the tile")
        _gpu_agrees(fn, grid, T, (x, out), 1, want, where)
    return "one global read per element (two for the halo), neighbours from shared memory, syncthreads between"


@checker(kind="core", signature="x, out")
def check_sum_squares_kernel(fn):
    """Puzzle 5, block reduction: fn(x (M, N), out (M,)), out[m] = sum over n of x[m, n]^2 (RMSNorm's
    reduction), N <= 8. One block of 8 threads per row: thread t puts x[m, t]^2 (0 past N) in part[t],
    then a tree: 8 -> 4 -> 2 -> 1 partial sums, syncthreads after every step; thread 0 writes out[m]."""
    name = "check_sum_squares_kernel"
    PICTURES.pop(name, None)
    T, arrays = 8, ["x", "part"]
    hints = {"range": lambda e: ("threads t >= N have no element: they put 0.0 in part[t]" if e.array == "x" else
                                 "out has one element per block: out[cuda.blockIdx.x]"),
             "race": "each step of the tree reads what the previous step wrote: cuda.syncthreads() after loading "
                     "part and after every step (outside the if), and one thread (t == 0) writes out[m]",
             "uninit": "threads t >= N have no element: they put 0.0 in part[t], or the tree adds garbage",
             "diverge": "in the tree, every thread calls cuda.syncthreads() at every step, not only those with "
                        "t < step"}
    for M, N in ((3, 8), (2, 5), (1, 1)):
        rng = np.random.default_rng(M * 16 + N)
        x = rng.standard_normal((M, N), dtype=np.float32)
        out = np.full(M, np.nan, np.float32)
        where = f"x {M}x{N}, {M} blocks of {T} threads"
        run = _launch(name, fn, M, T, (x, out), where=where, arrays=arrays, show=(0, 0) if N == 5 else None,
                      hints=hints)
        _compare(name, run, out, (x.astype(np.float64) ** 2).sum(1).astype(np.float32), where, "out", arrays)
        per = {}                                         # (thread, phase) -> distinct part slots read / x elements
        for e, ph in zip(run.log.events, run.phases):
            if e.kind == "read" and e.array in ("x", "part"):
                per.setdefault((e.array, e.block, e.thread, ph if e.array == "part" else 0), set()).add(e.index)
        (arr, b, t, _), seen = max(per.items(), key=lambda kv: len(kv[1]))
        if len(seen) > (2 if arr == "part" else 1):
            _fail(name, run, arrays, (b, t), where, "one thread sums the row",
                f"{_who(run.log, b, t)} reads {len(seen)} elements of {arr} in one go: a serial sum, "
                f"{N} steps one after another. Each thread loads one element into part, then the tree adds pairs: "
                f"step = 4, 2, 1: if t < step: part[t] += part[t + step] (log2(8) = 3 steps)")
        _gpu_agrees(fn, M, T, (x, out), 1, (x ** 2).sum(1), where)
    return "one element per thread, a tree of 3 steps in shared memory with syncthreads between, one write per row"


@checker(kind="core", signature="x, w, y")
def check_tiled_matmul_kernel(fn):
    """Puzzle 6, tiled matmul: fn(x (M, K), w (N, K), y (M, N)), y = x @ w^T, grid (ceil(N/4), ceil(M/4)) of
    4 x 4 blocks: thread (tx, ty) of block (bx, by) owns y[by*4 + ty, bx*4 + tx]. Per k-tile the block
    copies a 4x4 tile of x and one of w into shared memory (zeros outside), syncthreads, 4 multiply-adds
    each, syncthreads; as minillm.kernels.matmul.matmul_tiled with TILE = 4."""
    name = "check_tiled_matmul_kernel"
    PICTURES.pop(name, None)
    T, arrays = 4, ["x", "w", "xs", "ws"]
    hints = {"range": lambda e: ("tile entries outside x or w are 0.0, not reads: guard each load "
                                 "(xs[ty, tx] = x[m, k] if m < M and k < K else 0.0)" if e.array in ("x", "w") else
                                 "threads past the edge of y write nothing (they still load tiles and syncthreads)"),
             "race": "two syncthreads per k-tile: after loading (the tiles are complete before anyone reads "
                     "them) and after the multiply-adds (everyone is done before the next tile overwrites them)",
             "uninit": "every thread loads its entry of both tiles at every k-tile, 0.0 where the tile sticks out "
                       "of x or w",
             "diverge": "threads past the edge of y must still load their (zero) tile entries and syncthreads: "
                        "guard only the final write of y"}
    passed_multiples = False
    for M, K, N in ((4, 4, 4), (8, 8, 8), (6, 10, 7), (3, 5, 2)):
        rng = np.random.default_rng(M * 100 + K * 10 + N)
        x, w = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((N, K), dtype=np.float32)
        y = np.full((M, N), np.nan, np.float32)
        grid = (_blocks(N, T), _blocks(M, T))
        where = f"(M, K, N) = ({M}, {K}, {N}), grid {grid} of {T}x{T} blocks"
        run = _launch(name, fn, grid, (T, T), (x, w, y), where=where, arrays=arrays,
                      show=((1, 0), (2, 1)) if (M, K, N) == (6, 10, 7) else None, hints=hints)
        want = x @ w.T
        try:
            _compare(name, run, y, want, where, "y", arrays)
        except AssertionError as e:
            if passed_multiples and not np.isnan(y).any():
                raise AssertionError(f"{e}; right when M, K and N are multiples of {T}, wrong on ragged edges: "
                                     "a tile entry outside x or w must be 0.0, or a stale value from the previous "
                                     "tile enters the sum") from None
            if not np.isnan(y).any():
                raise AssertionError(f"{e}; thread (tx, ty) adds xs[ty, j] * ws[tx, j] for j < {T} at every k-tile, "
                                     f"where xs[ty, tx] = x[m0 + ty, k] and ws[ty, tx] = w[n0 + ty, k], "
                                     f"k = t * {T} + tx") from None
            raise
        passed_multiples = all(s % T == 0 for s in (M, K, N))
        for arr, want_reads in (("x", _blocks(N, T)), ("w", _blocks(M, T))):
            reads = run.log.reads_per_element(arr)
            if reads.max() > want_reads:
                j = np.unravel_index(int(reads.argmax()), reads.shape)
                _fail(name, run, arrays, None, where, f"{arr} read too often from global memory",
                    f"{arr}[{', '.join(map(str, j))}] is read {_times(reads.max())} from global memory, "
                    f"the tiled kernel once per block that needs it ({_times(want_reads)} here): load each tile "
                    "once into xs/ws and do the multiply-adds from shared memory")
        _gpu_agrees(fn, grid, (T, T), (x, w, y), 2, want, where)
    return "y = x @ w^T on ragged shapes; each input element read once per block from global memory, races: none"
