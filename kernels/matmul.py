"""Matrix multiply in a linear layer's layout, y = x W^T with W stored (N, K) as llama2.c and
torch.nn.Linear store it: a tiled matmul with shared memory (prefill: many rows of x) and a GEMV
(decode: one row), each on the GPU and as a CPU twin.

Why tiles (Kirk & Hwu, "Programming Massively Parallel Processors", ch. 5): in the naive kernel every
thread reads a whole row of x and a whole row of W from global memory, so each element is read N (or
M) times. A block of TILE x TILE threads instead copies one TILE x TILE tile of x and one of W into
shared memory, waits (syncthreads), and every thread reuses those 2*TILE values TILE times: global
reads drop by a factor of TILE.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import float32, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import blocks, check_array, cuda_kernel, empty_like, to_device
from .block_reduce import block_sum

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

TILE = 16            # threads per tile side: TILE*TILE = 256 threads per block
TILE_PAD = TILE + 1  # a shared tile's row length, one spare column (shared-array shapes must be constants)
GEMV_THREADS = 32    # threads cooperating on one output row of a GEMV (one warp)


# ----------------------------------------------------------------------------- CUDA kernels

@cuda_kernel("void(float32[:, ::1], float32[:, ::1], float32[:, ::1])")
def matmul_tiled(x, w, y):
    """y (M, N) = x (M, K) @ w (N, K)^T. Grid (ceil(N/TILE), ceil(M/TILE)), block (TILE, TILE):
    thread (ty, tx) of block (bx, by) owns y[by*TILE + ty, bx*TILE + tx]."""
    xs = cuda.shared.array((TILE, TILE), float32)        # x tile: rows m, columns k
    ws = cuda.shared.array((TILE, TILE_PAD), float32)    # W tile: rows n, columns k (+1 column: no bank conflicts)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    m0, n0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    M, K = x.shape
    N = w.shape[0]
    acc = float32(0.0)
    for t in range((K + TILE - 1) // TILE):               # tile count from the problem size
        k = t * TILE + tx                                 # neighbouring threads read neighbouring k: coalesced
        xs[ty, tx] = x[m0 + ty, k] if m0 + ty < M and k < K else float32(0.0)
        ws[ty, tx] = w[n0 + ty, k] if n0 + ty < N and k < K else float32(0.0)
        cuda.syncthreads()                                # the tiles are complete before anyone reads them
        for j in range(TILE):
            acc += xs[ty, j] * ws[tx, j]
        cuda.syncthreads()                                # everyone is done before the next tile overwrites
    if m0 + ty < M and n0 + tx < N:
        y[m0 + ty, n0 + tx] = acc


@cuda_kernel("void(float32[:, ::1], float32[::1], float32[::1])")
def gemv(w, x, y):
    """y (N,) = w (N, K) @ x (K,). One block of GEMV_THREADS threads per output row: thread i sums
    k = i, i + 32, ... (neighbouring threads read neighbouring k: coalesced), then a tree reduction in
    shared memory adds the 32 partial sums (block_reduce.block_sum)."""
    part = cuda.shared.array(GEMV_THREADS, float32)
    n, i = cuda.blockIdx.x, cuda.threadIdx.x
    K = w.shape[1]
    acc = float32(0.0)
    if n < w.shape[0]:
        for k in range(i, K, GEMV_THREADS):
            acc += w[n, k] * x[k]
    total = block_sum(part, acc, i, GEMV_THREADS)         # 32 -> 16 -> ... -> 1 partial sums
    if i == 0 and n < w.shape[0]:
        y[n] = total


def matmul_cuda(x, w):
    """x (M, K) @ w (N, K)^T -> (M, N) float32 on the GPU (or the simulator)."""
    check_array("x", x, np.float32, 2)
    check_array("w", w, np.float32, 2, (None, x.shape[1]))
    M, N = x.shape[0], w.shape[0]
    y = empty_like(x, (M, N))
    if M and N:
        matmul_tiled[(blocks(N, TILE), blocks(M, TILE)), (TILE, TILE)](to_device(x), to_device(w), to_device(y))
    return y


def gemv_cuda(w, x):
    """w (N, K) @ x (K,) -> (N,) float32 on the GPU (or the simulator)."""
    check_array("w", w, np.float32, 2)
    check_array("x", x, np.float32, 1, (w.shape[1],))
    y = empty_like(x, (w.shape[0],))
    if w.shape[0]:                       # a grid of zero blocks is an invalid launch on a GPU
        gemv[w.shape[0], GEMV_THREADS](to_device(w), to_device(x), to_device(y))
    return y


# ----------------------------------------------------------------------------- CPU twins

@njit(cache=True)
def linear_rows_plain(x, w):
    """y (M, N) = x (M, K) @ w (N, K)^T as three plain loops: llama2.c's matmul (`for i in range(d): val = 0;
    for j in range(n): val += w[i*n + j] * x[j]; xout[i] = val`) for each row of x. The maths of every matmul
    in this file, without the speed: linear_cpu below computes the same dot products with register tiles
    written as LLVM vector code, in another summation order, and is tested against this loop
    (tests/test_kernels_matmul.py). No fastmath, so k runs in order, one rounding per multiply and per add."""
    M, K = x.shape
    N = w.shape[0]
    y = np.empty((M, N), np.float32)                      # (M, N)
    for m in range(M):
        for n in range(N):
            val = np.float32(0.0)
            for k in range(K):
                val += x[m, k] * w[n, k]
            y[m, n] = val
    return y


LANES = 8    # CPU twin: floats per vector register (AVX2; an AVX-512 machine runs the same 8-wide code)
NR = 8       # CPU twin: output columns per tile, the unit split across threads
MR = 4       # CPU twin: rows of x per 4 x 1 micro-kernel call (streaming path: up to STREAM_M rows)
I64 = ir.IntType(64)
VF = ir.VectorType(ir.FloatType(), LANES)


def _lane_sums(builder, vecs):
    """[sum of vecs[j]'s 8 lanes for each j] as one <len(vecs) x float> (1, 2, 4 or 8 vectors), every sum in
    the fixed tree ((0+1)+(2+3))+((4+5)+(6+7)), computed on whole vectors: put two vectors side by side, take
    the even and the odd elements apart and add them, and each column's partial sums 2i and 2i + 1 are added,
    for both vectors at once; three such levels (two vectors into one while there are several, then a vector
    into its own halves) leave one sum per column. Every add is the same pair of floats as in the scalar tree,
    so the sums are the same bits; it replaces 8 extracts and 7 scalar adds per output, which at K = 256 were a
    third of the (then) 4 x 4 micro-kernel's instructions."""
    assert len(vecs) in (1, 2, 4, 8)

    def add(a, b):                     # a flag of its own: numba's fastmath pass gives flagless fadds reassociation
        return builder.fadd(a, b, flags=("nsz",))

    def pick(a, b, idx):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), len(idx)), idx))
    partials = LANES                                             # partial sums per column, in order
    while partials > 1:
        if len(vecs) > 1:                                        # [a | b]: evens + odds, a vector of a's width
            n = 2 * len(vecs[0].type)
            vecs = [add(pick(a, b, list(range(0, n, 2))), pick(a, b, list(range(1, n, 2))))
                    for a, b in zip(vecs[::2], vecs[1::2])]
        else:                                                    # one vector: its evens + its odds, half as wide
            v, n = vecs[0], len(vecs[0].type)
            vecs = [add(pick(v, v, list(range(0, n, 2))), pick(v, v, list(range(1, n, 2))))]
        partials //= 2
    return vecs[0]


def _make_tile(mr: int, nr: int):
    """A micro-kernel, written as LLVM IR: y[m0:m0+mr, n0:n0+nr] = the first 8 * steps inputs' dot products of
    rows m0.. of x (M, K) with rows n0.. of w (N, K). Its loop keeps mr * nr accumulators of LANES floats in
    registers: each step loads mr vectors of x and nr of w and does mr * nr fused multiply-adds, so every weight
    load serves mr rows (the plain loop, one row at a time, was bound by loads at ~35 GF/s a core). The tile has to
    fit AVX2's 16 vector registers: 2 x 4 holds 8 accumulators, 2 x vectors and a w vector; 4 x 4's 16
    accumulators alone fill them, and LLVM spilled to the stack (42 stack moves per 32 fma): 30 against 53 GF/s
    on one core at the shipped model's shapes, 32 rows.
    Every y[m, n] is computed the same way whatever mr and nr are: lane l sums x[m, k] w[n, k] over k = l, l + 8,
    ... in order with fma, then the lanes add in one fixed tree ((0+1)+(2+3))+((4+5)+(6+7)). Written by hand, not
    left to LLVM's vectoriser, because that order is the point: the vectoriser picks its own interleaving per
    loop (another order for the 4-row loop than for the 1-row one), and numba leaves its SLP vectoriser off.
    Rows are contiguous inside (any row stride). No bounds checks: the caller keeps the indices in range."""
    @intrinsic
    def tile(typingctx, x, w, y, m0, n0, steps):
        if not all(isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.float32 for a in (x, w, y)):
            return None                                        # float32 matrices only (a typing error otherwise)
        sig = types.void(x, w, y, types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            xa, wa, ya = (context.make_array(t)(context, builder, v) for t, v in zip(signature.args[:3], args[:3]))
            m0, n0, steps = args[3:]

            def row(arr, i):                                   # float* to row i of a 2-D array
                stride = cgutils.unpack_tuple(builder, arr.strides, 2)[0]
                at = builder.add(builder.ptrtoint(arr.data, I64), builder.mul(i, stride))
                return builder.inttoptr(at, ir.FloatType().as_pointer())

            def const(v):
                return ir.Constant(I64, v)
            xr = [row(xa, builder.add(m0, const(i))) for i in range(mr)]
            wr = [row(wa, builder.add(n0, const(j))) for j in range(nr)]
            fma = builder.module.declare_intrinsic("llvm.fma.v8f32", fnty=ir.FunctionType(VF, [VF] * 3))
            zero = ir.Constant(VF, [0.0] * LANES)
            entry, loop, done = builder.block, builder.append_basic_block("loop"), builder.append_basic_block("done")
            builder.cbranch(builder.icmp_signed(">", steps, const(0)), loop, done)

            builder.position_at_end(loop)                      # for k in range(steps): acc[i][j] += x_i . w_j
            k = builder.phi(I64)
            acc = [[builder.phi(VF) for _ in range(nr)] for _ in range(mr)]
            off = builder.mul(k, const(LANES))

            def load(p):
                return builder.load(builder.bitcast(builder.gep(p, [off]), VF.as_pointer()), align=4)
            xv, wv = [load(p) for p in xr], [load(p) for p in wr]
            new = [[builder.call(fma, [xv[i], wv[j], acc[i][j]]) for j in range(nr)] for i in range(mr)]
            k1 = builder.add(k, const(1))
            builder.cbranch(builder.icmp_signed("<", k1, steps), loop, done)
            k.add_incoming(const(0), entry)
            k.add_incoming(k1, loop)

            builder.position_at_end(done)                      # lanes added in a fixed tree, stored to y
            fin = [[builder.phi(VF) for _ in range(nr)] for _ in range(mr)]    # phis first in the block
            for i in range(mr):
                for j in range(nr):
                    for phi in (acc[i][j], fin[i][j]):
                        phi.add_incoming(zero, entry)
                        phi.add_incoming(new[i][j], loop)
            for i in range(mr):
                out = row(ya, builder.add(m0, const(i)))
                sums = _lane_sums(builder, fin[i])             # (nr,) vector: each column's lanes in the tree
                ptr = builder.gep(out, [n0])
                builder.store(sums, builder.bitcast(ptr, sums.type.as_pointer()), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return tile


_tile_2x4, _tile_1x4 = _make_tile(2, 4), _make_tile(1, 4)
_tile_4x1, _tile_2x1, _tile_1x1 = _make_tile(MR, 1), _make_tile(2, 1), _make_tile(1, 1)
STREAM_M = 8   # up to this many rows, a column at a time: each thread reads one weight row after another


@njit(parallel=True, fastmath=True, cache=True)
def linear_cpu(x, w, y):
    """y (M, N) = x (M, K) @ w (N, K)^T, in place: a blocked matmul. Tiles of NR output columns are split
    across threads (as run.c's `#pragma omp parallel for` over its matmul's rows). Up to STREAM_M rows (batch-1
    decode, the 1 + k tokens of speculative verification), a tile goes one column at a time, rows of x 4 at a
    time (4 x 1 micro-kernel), so the weights stream; beyond, rows go 2 at a time through the 2 x 4
    micro-kernel (each weight vector loaded once for 2 rows, each x vector for 4 columns: the largest tile whose
    accumulators stay in registers) and the last odd row through the 1 x 4 one. Either way a batch of M rows
    costs far less than M single rows. Each y[m, n] is summed in one fixed order (_make_tile: 8 lanes over k, a
    fixed tree, then the last K % 8 inputs in order), the same in every micro-kernel, so a row's result does not
    depend on what else is in the batch or where it sits in it, bit for bit (tests/test_numba_backend.py).
    Rows of x, w and y are contiguous inside."""
    M, K = x.shape
    N = w.shape[0]
    if x.strides[1] != 4 or w.strides[1] != 4 or y.strides[1] != 4:
        raise ValueError("linear_cpu: the rows of x, w and y must be contiguous (the micro-kernels load 8 at a time)")
    steps = K // LANES
    for t in prange((N + NR - 1) // NR):
        n0 = t * NR
        n1 = min(n0 + NR, N)
        if M <= STREAM_M or n1 - n0 < NR:
            # Few rows (decode, verification) or the last N % NR columns: one weight row at a time, every row of x
            # against it (4 at a time). Each thread then reads its weights as one stream, front to back, which
            # is what the prefetchers follow: reading 4 weight rows side by side (4 streams) was 1.3-1.7x slower
            # at one row once the weights came from memory (random stories15M's 37 MB classifier, AMD EPYC).
            for n in range(n0, n1):
                m0 = 0
                while m0 + MR <= M:
                    _tile_4x1(x, w, y, m0, n, steps)
                    m0 += MR
                if m0 + 2 <= M:
                    _tile_2x1(x, w, y, m0, n, steps)
                    m0 += 2
                if m0 < M:
                    _tile_1x1(x, w, y, m0, n, steps)
        else:                             # many rows: 2 x 4 register tiles, each weight vector serving 2 rows
            m0 = 0
            while m0 + 2 <= M:
                _tile_2x4(x, w, y, m0, n0, steps)
                _tile_2x4(x, w, y, m0, n0 + 4, steps)
                m0 += 2
            if m0 < M:
                _tile_1x4(x, w, y, m0, n0, steps)
                _tile_1x4(x, w, y, m0, n0 + 4, steps)
        if steps * LANES < K:             # the last K % 8 inputs, added in order
            for m in range(M):
                for n in range(n0, n1):
                    acc = y[m, n]
                    for k in range(steps * LANES, K):
                        acc += x[m, k] * w[n, k]
                    y[m, n] = acc


def matmul_cpu(x, w):
    """x (M, K) @ w (N, K)^T -> (M, N), numpy float32 in and out."""
    check_array("x", x, np.float32, 2)
    check_array("w", w, np.float32, 2, (None, x.shape[1]))
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    linear_cpu(x, w, y)
    return y


def gemv_cpu(w, x):
    """w (N, K) @ x (K,) -> (N,): the M = 1 case of linear_cpu (the same sums, bit for bit)."""
    check_array("w", w, np.float32, 2)
    check_array("x", x, np.float32, 1, (w.shape[1],))
    return matmul_cpu(x[None, :], w)[0]
