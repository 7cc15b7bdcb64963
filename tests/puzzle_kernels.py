"""Notebook 03's puzzle kernels, right and with switches for the common mistakes: the checkers' tests
(tests/test_labs_nb03.py, the emulator) and the simulator's (tests/cudasim/test_labs_puzzles.py) share them.
`cuda` is whichever numba.cuda this process imported: the simulator's or, without it, the plain one."""
from numba import cuda, float32

THREADS, TILE_LEN, TW = 8, 10, 4          # as notebook 03's exercise cells


def relu(index="grid", guard=True):
    def kernel(x, out):
        i = {"grid": cuda.grid(1), "thread": cuda.threadIdx.x, "block": cuda.blockIdx.x}[index]
        if not guard or i < x.shape[0]:
            out[i] = max(x[i], 0.0)
    return kernel


def scale_rows(swapped=False, guard=True):
    def kernel(x, scale, weight, out):
        n, m = cuda.grid(2)
        if swapped:
            m, n = n, m
        if not guard or (m < out.shape[0] and n < out.shape[1]):
            out[m, n] = x[m, n] * scale[m] * weight[n]
    return kernel


def window_sum(sync=True, zero_halo=True, guard_load=True, early_return=False, from_global=False):
    def kernel(x, out):
        tile = cuda.shared.array(TILE_LEN, float32)
        t, i, n = cuda.threadIdx.x, cuda.grid(1), x.shape[0]
        if early_return and i >= n:
            return
        if from_global:
            if i < n:
                out[i] = x[i] + (x[i - 1] if i >= 1 else 0.0) + (x[i - 2] if i >= 2 else 0.0)
            return
        tile[t + 2] = x[i] if i < n or not guard_load else float32(0.0)
        if t < 2:
            j = i - 2
            tile[t] = x[j] if j >= 0 or not zero_halo else float32(0.0)
        if sync:
            cuda.syncthreads()
        if i < n:
            out[i] = tile[t] + tile[t + 1] + tile[t + 2]
    return kernel


def sum_squares(sync_load=True, sync_steps=True, sync_in_if=False, pad=True, one_writer=True, serial=False):
    def kernel(x, out):
        part = cuda.shared.array(THREADS, float32)
        m, t, N = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
        if t < N:
            part[t] = x[m, t] * x[m, t]
        elif pad:
            part[t] = float32(0.0)
        if sync_load:
            cuda.syncthreads()
        if serial:
            if t == 0:
                s = float32(0.0)
                for j in range(THREADS):
                    s += part[j]
                out[m] = s
            return
        step = THREADS // 2
        while step > 0:
            if t < step:
                part[t] += part[t + step]
                if sync_in_if:
                    cuda.syncthreads()
            if sync_steps and not sync_in_if:
                cuda.syncthreads()
            step //= 2
        if t == 0 or not one_writer:
            out[m] = part[0]
    return kernel


def tiled_matmul(sync_before=True, sync_after=True, pad=True, pad_k=True, guard_loads=True, early_return=False,
                 naive=False, ws_transposed=False):
    def kernel(x, w, y):
        xs = cuda.shared.array((TW, TW), float32)
        ws = cuda.shared.array((TW, TW), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        m0, n0 = cuda.blockIdx.y * TW, cuda.blockIdx.x * TW
        M, K = x.shape
        N = w.shape[0]
        if early_return and (m0 + ty >= M or n0 + tx >= N):
            return
        acc = float32(0.0)
        if naive:
            for k in range(K):
                acc += x[m0 + ty, k] * w[n0 + tx, k] if m0 + ty < M and n0 + tx < N else float32(0.0)
        for t in range(0 if naive else (K + TW - 1) // TW):
            k = t * TW + tx
            if not guard_loads:
                xs[ty, tx], ws[ty, tx] = x[m0 + ty, k], w[n0 + ty, k]
            elif pad:
                xs[ty, tx] = x[m0 + ty, k] if m0 + ty < M and k < K else float32(0.0)
                ws[ty, tx] = w[n0 + ty, k] if n0 + ty < N and k < K else float32(0.0)
            elif not pad_k:                       # zeros past the edge of y, nothing past the end of K
                if k < K:
                    xs[ty, tx] = x[m0 + ty, k] if m0 + ty < M else float32(0.0)
                    ws[ty, tx] = w[n0 + ty, k] if n0 + ty < N else float32(0.0)
            else:                                 # no zeros at all
                if m0 + ty < M and k < K:
                    xs[ty, tx] = x[m0 + ty, k]
                if n0 + ty < N and k < K:
                    ws[ty, tx] = w[n0 + ty, k]
            if sync_before:
                cuda.syncthreads()
            for j in range(TW):
                acc += xs[ty, j] * (ws[j, tx] if ws_transposed else ws[tx, j])
            if sync_after:
                cuda.syncthreads()
        if m0 + ty < M and n0 + tx < N:
            y[m0 + ty, n0 + tx] = acc
    return kernel
