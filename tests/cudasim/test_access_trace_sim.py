"""The access diagram's headline, counted in the simulator: the tiled matmul reads each element of x
from global memory ceil(N/TILE) times, the naive one N times (Kirk & Hwu ch. 5), and shared memory
takes the reuse. Shapes are not tile multiples (DESIGN rule 6) and stay tiny: one launch of the tiled
kernel here is 768 Python threads."""
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import minillm.kernels.access_trace as AT  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from close import assert_close  # noqa: E402
from minillm.kernels import blocks, simulating  # noqa: E402
from minillm.kernels.matmul import TILE, matmul_tiled  # noqa: E402
from minillm.kernels.matmul_naive import matmul_naive, matmul_naive_cuda  # noqa: E402
from numba import cuda, float32  # noqa: E402  (the simulator's: conftest checks NUMBA_ENABLE_CUDASIM=1)

M, K, N = 5, 20, 33                      # K spans 2 tiles, N spans 3 blocks, M one partial block
GRID, BLOCK = (blocks(N, TILE), blocks(M, TILE)), (TILE, TILE)


def operands():
    g = torch.Generator().manual_seed(0)
    return torch.randn(M, K, generator=g).numpy(), torch.randn(N, K, generator=g).numpy()


@pytest.fixture(scope="module")
def logs():
    """One recorded launch of each kernel (the tiled one takes about a second), with its output."""
    x, w = operands()
    out = {}
    for kernel in (matmul_tiled, matmul_naive):
        y = np.zeros((M, N), np.float32)
        out[kernel.__name__] = (AT.record_accesses(kernel, GRID, BLOCK, x, w, y), y)
    return out


def test_the_simulator_is_on():
    assert simulating()


def test_recording_does_not_change_the_result(logs):
    x, w = operands()
    for name, (_, y) in logs.items():
        assert_close(torch.from_numpy(y), torch.from_numpy(x) @ torch.from_numpy(w).T, atol=1e-5, rtol=1e-5, name=name)


def test_tiled_reads_x_ceil_n_over_tile_times_naive_n_times(logs):
    tiled, naive = logs["matmul_tiled"][0], logs["matmul_naive"][0]
    assert (tiled.reads_per_element("x") == math.ceil(N / TILE)).all()     # 3: once per block along N
    assert (naive.reads_per_element("x") == N).all()                        # 33: once per output in its row
    assert (tiled.reads_per_element("w") == math.ceil(M / TILE)).all()     # 1
    assert (naive.reads_per_element("w") == M).all()                        # 5
    assert naive.global_reads_total == 2 * M * N * K and naive.shared_reads_total == 0
    assert tiled.global_reads_total == M * K * math.ceil(N / TILE) + N * K * math.ceil(M / TILE)
    assert (tiled.writes_per_element("y") == 1).all() and (naive.writes_per_element("y") == 1).all()


def test_tiled_trades_global_reads_for_shared_reads(logs):
    log = logs["matmul_tiled"][0]
    assert log.spaces == {"x": "global", "w": "global", "y": "global", "xs": "shared", "ws": "shared"}
    assert log.shapes["xs"] == (TILE, TILE) and log.shapes["ws"] == (TILE, TILE + 1)
    # every thread of every block reads 2*TILE shared values per tile, padded threads included
    n_threads, n_tiles = math.prod(GRID) * TILE * TILE, math.ceil(K / TILE)
    assert log.shared_reads_total == n_threads * n_tiles * 2 * TILE
    assert (log.reads_per_element("ws")[:, TILE] == 0).all()               # the padding column is never read


def test_one_threads_accesses(logs):
    tiled, naive = logs["matmul_tiled"][0], logs["matmul_naive"][0]
    # thread (tx=1, ty=2) of block (0, 0) owns y[2, 1]: it loads x[2, k] for k = 1, 1 + TILE, one per tile
    assert tiled.touched("x", (0, 0), (1, 2)) == [(2, 1), (2, 1 + TILE)]
    assert tiled.touched("y", (0, 0), (1, 2), "write") == [(2, 1)]
    assert tiled.touched("xs", (0, 0), (1, 2), "write") == [(2, 1)]
    assert tiled.touched("xs", (0, 0), (1, 2)) == [(2, j) for j in range(TILE)]
    # the naive thread (n=1, m=2) reads the whole row 2 of x itself
    assert naive.touched("x", 0, (1, 2)) == [(2, k) for k in range(K)]
    first = naive.thread_events((0, 0, 0), (1, 2, 0))[:2]
    assert [(e.array, e.index, e.kind) for e in first] == [("x", 2 * K, "read"), ("w", 1 * K, "read")]


def reverse_scaled(a, out, scale):
    """A plain function written against numba.cuda (a module global, as the simulator swaps it):
    each block of 8 threads reverses its 8 elements through shared memory."""
    buf = cuda.shared.array(8, float32)
    i = cuda.threadIdx.x
    buf[i] = a[cuda.blockIdx.x * 8 + i] * scale
    cuda.syncthreads()
    out[cuda.blockIdx.x * 8 + i] = buf[7 - i]


def test_a_plain_function_with_a_shared_array_and_a_scalar():
    """Anything written against numba.cuda: the proxy logs it, and shared arrays get their variable name."""
    a, out = np.arange(16, dtype=np.float32), np.zeros(16, np.float32)
    log = AT.record_accesses(reverse_scaled, 2, 8, a, out, np.float32(2.0))
    assert (out == 2 * np.concatenate([a[7::-1], a[:7:-1]])).all()
    assert log.spaces == {"a": "global", "out": "global", "buf": "shared"}
    assert (log.reads_per_element("buf") == 2).all()                        # once per block, two blocks
    assert log.touched("buf", 1, 3) == [(4,)]
    with pytest.raises(ValueError, match="takes 3 arguments"):
        AT.record_accesses(reverse_scaled, 2, 8, a, out)
    with pytest.raises(ValueError, match="no array named 'nope'"):
        log.reads_per_element("nope")


def test_the_shared_array_patch_is_undone():
    from numba.cuda.simulator import kernelapi
    before = kernelapi.FakeCUDAShared.array
    with pytest.raises(Exception):
        AT.record_accesses(matmul_tiled, GRID, BLOCK, np.ones((M, K), np.float32), np.ones((N, 3), np.float32),
                           np.zeros((M, N), np.float32))                    # w too narrow: the kernel fails
    assert kernelapi.FakeCUDAShared.array is before


def test_refuses_without_the_simulator(monkeypatch):
    monkeypatch.setattr(AT, "simulating", lambda: False)
    with pytest.raises(RuntimeError, match="simulator"):
        AT.record_accesses(matmul_naive, GRID, BLOCK, *operands(), np.zeros((M, N), np.float32))


def test_matmul_naive_equals_torch():
    x, w = operands()
    assert_close(torch.from_numpy(matmul_naive_cuda(x, w)), torch.from_numpy(x) @ torch.from_numpy(w).T,
                 atol=1e-5, rtol=1e-5, name="matmul_naive")


def test_plot_access_diagram_from_a_recording(logs):
    import minillm.viz as viz
    fig = viz.plot_access_diagram(logs["matmul_tiled"][0], ["x", "xs"], thread=((0, 0), (1, 2)))
    x_ax, xs_ax = fig.axes[:2]
    assert x_ax.images[0].get_array().max() == math.ceil(N / TILE)
    assert len(x_ax.patches) == 2 and len(xs_ax.patches) == TILE + 1        # x: 2 loads; xs: 16 reads + 1 write
    plt.close("all")
