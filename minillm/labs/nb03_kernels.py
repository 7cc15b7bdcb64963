"""Checkers for notebook 03_kernels_numba_cuda."""
from __future__ import annotations

import numpy as np

from .common import checker


class _Dim3(tuple):
    """(x, y, z) with .x .y .z, as numba.cuda's threadIdx and friends."""
    x = property(lambda self: self[0])
    y = property(lambda self: self[1])
    z = property(lambda self: self[2])


class _OneThread:
    """A stand-in for numba.cuda while one thread of a launch runs (see _launch_kernel)."""

    def __init__(self, griddim, blockdim):
        self.gridDim, self.blockDim = _Dim3(griddim), _Dim3(blockdim)
        self.blockIdx = self.threadIdx = _Dim3((0, 0, 0))

    def grid(self, ndim):
        ids = [b * d + t for b, d, t in zip(self.blockIdx, self.blockDim, self.threadIdx)][:ndim]
        return ids[0] if ndim == 1 else tuple(ids)

    def syncthreads(self):
        raise RuntimeError("this checker runs threads one at a time when numba's CUDA simulator is off: "
                           "write the kernel without shared memory or syncthreads")


def _launch_kernel(fn, griddim, blockdim, *args):
    """fn[griddim, blockdim](*args) for a kernel body written against numba.cuda. In the simulator or
    on a GPU, a real launch (cuda.jit). Otherwise (numba.cuda imported without the simulator and no GPU,
    as in the unit tests) each thread runs in turn in plain Python, `cuda` in fn's globals standing for
    numba.cuda: exact for kernels whose threads never wait for each other."""
    import itertools
    import sys

    from minillm.kernels import cuda, gpu_available, simulating

    def pad(d):
        return tuple(d) + (1,) * (3 - len(d))
    griddim, blockdim = pad(griddim), pad(blockdim)
    if simulating() or gpu_available():
        cuda().jit(fn)[griddim, blockdim](*args)
        return
    fn = getattr(fn, "py_func", fn)
    real = sys.modules.get("numba.cuda")
    swapped = {k: v for k, v in fn.__globals__.items() if k == "cuda" or (real is not None and v is real)}
    fake = _OneThread(griddim, blockdim)
    fn.__globals__.update(dict.fromkeys(swapped, fake))
    try:
        for b in itertools.product(*(range(n) for n in griddim)):
            for t in itertools.product(*(range(n) for n in blockdim)):
                fake.blockIdx, fake.threadIdx = _Dim3(b), _Dim3(t)
                fn(*args)
    finally:
        fn.__globals__.update(swapped)


@checker
def check_scale_rows_kernel(fn):
    """fn(x (M, N), scale (M,), weight (N,), out (M, N)): a CUDA kernel body, out[m, n] = x[m, n] * scale[m]
    * weight[n], one thread per element, launched with grid (blocks(N, bx), blocks(M, by)), block (bx, by)"""

    from minillm.kernels import blocks
    rng = np.random.default_rng(3)
    for M, N, block in [(1, 1, (4, 4)), (5, 7, (8, 4)), (13, 40, (16, 8)), (33, 3, (4, 16))]:
        x = rng.standard_normal((M, N), dtype=np.float32)
        scale = rng.random(M, dtype=np.float32) + 0.5
        weight = rng.standard_normal(N, dtype=np.float32)
        out = np.full((M, N), np.nan, np.float32)                 # NaN marks an element no thread wrote
        grid = (blocks(N, block[0]), blocks(M, block[1]))
        where = f"(M, N) = ({M}, {N}), grid {grid}, block {block}"
        try:
            _launch_kernel(fn, grid, block, x, scale, weight, out)
        except IndexError as e:
            raise AssertionError(f"{where}: IndexError ({e}): the grid has more threads than elements, "
                                 "so a thread past the edge must do nothing (if m < M and n < N)") from None
        missed = np.argwhere(np.isnan(out))
        assert not len(missed), (f"{where}: {len(missed)} of {M * N} outputs never written, "
                                 f"e.g. out[{', '.join(str(int(i)) for i in missed[0])}]; "
                                 "the grid's x runs along columns n, y along rows m: n, m = cuda.grid(2)")
        want = x * scale[:, None] * weight[None, :]
        err = float(np.abs(out - want).max())
        assert np.allclose(out, want, rtol=1e-5, atol=1e-6), f"{where}: max abs error {err:.3g}"
    return "every element written once, right value, extra threads at the edges do nothing"


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
