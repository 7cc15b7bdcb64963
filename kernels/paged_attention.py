"""Paged decode attention (vLLM's PagedAttention, Kwon et al. 2023, "Efficient Memory Management for
Large Language Model Serving with PagedAttention") and Flash-Decoding (Dao, Haziza, Massa & Sizov 2023,
"Flash-Decoding for long-context inference"), in DESIGN.md's KV layout:

    k_pool, v_pool (NB, BS, Hkv, D)   block_tables (R, M)   context_lens (R,)

Row r holds one query token that attends to its first context_lens[r] cached positions; position p
lives in block block_tables[r, p // BS] at offset p % BS. The blocks of a sequence can sit anywhere in
the pool, so the kernel reads K/V through the table instead of from one contiguous buffer: that is all
"paged" means, and it is what lets a server hand out memory one small block at a time.

Why Flash-Decoding: in decode there is one query per sequence, so one block per (row, head) leaves most
of a GPU idle when the batch is small and the context long. Flash-Decoding splits each row's context into
num_splits chunks handled by independent blocks; each writes its partial output o_s (normalised by its
own sum), its max m_s and its log-sum-exp lse_s = m_s + log(l_s); a second kernel combines them:
out = sum_s exp(lse_s - max lse) o_s / sum_s exp(lse_s - max lse). PagedAttention is the num_splits = 1
case, and the CUDA side below is literally that: one kernel, launched with one split or many.
"""
from __future__ import annotations

import math

import numpy as np
from numba import float32, int64, njit, prange

from . import cdiv, check_array, cuda_kernel, empty_like, to_device
from .block_reduce import block_max, block_sum
from .softmax import exp32
from .vec8 import axpy8, dot8

cuda = None   # numba.cuda, bound when a kernel is first compiled (see minillm.kernels)

THREADS = 64              # threads per (row, head[, split]) block: a chunk of 64 positions, then dims
DMAX = 128                # the largest head dim the CUDA kernels handle
NACC = DMAX // THREADS    # output dims per thread: d = t, t + THREADS
NEG = -3.0e38             # "minus infinity" for the CPU twins (fastmath assumes no infs)
CHUNK = 64                # CPU twin: positions per attention task (attention_rows)


# ----------------------------------------------------------------------------- CUDA kernels

@cuda_kernel("void(float32[:, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], int64[:, ::1], int64[::1], "
             "float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1])")
def paged_attention_split(q, k_pool, v_pool, block_tables, context_lens, part_out, part_max, part_lse):
    """Grid (R, H, S), THREADS threads. Block (r, h, s) covers split s of row r's context in chunks of
    THREADS positions: thread t scores position p0 + c*THREADS + t (found through the block table), a tree
    reduction in shared memory gives the chunk's max and then its sum (online softmax across chunks), and
    then thread t accumulates output dims t, t + THREADS. Writes part_out[r, s, h] = o_s, part_max and
    part_lse[r, s, h]; a split with no positions writes o_s = 0, lse_s = -inf."""
    qs = cuda.shared.array(DMAX, float32)
    ps = cuda.shared.array(THREADS, float32)          # this chunk's scores, then probabilities
    red = cuda.shared.array(THREADS, float32)         # tree reductions
    slot = cuda.shared.array(THREADS, int64)          # pool slot (block * BS + offset) of each chunk position
    acc = cuda.local.array(NACC, float32)
    r, h, sp, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z, cuda.threadIdx.x
    H, D = q.shape[1], q.shape[2]
    BS, S = k_pool.shape[1], part_out.shape[1]
    hk = h // (H // k_pool.shape[2])
    ctx = context_lens[r]
    per = (ctx + S - 1) // S                          # positions per split, from this row's context
    p0 = sp * per
    n = min(per, ctx - p0)                            # positions in this split (<= 0: none)
    scale = float32(1.0 / math.sqrt(D))
    for d in range(t, D, THREADS):
        qs[d] = q[r, h, d]
    m, lsum = float32(-math.inf), float32(0.0)
    for a in range(NACC):
        acc[a] = float32(0.0)
    n_chunks = (n + THREADS - 1) // THREADS if n > 0 else 0   # every chunk holds >= 1 position
    for c in range(n_chunks):
        cuda.syncthreads()                            # qs loaded; the previous chunk's ps and slot read
        j = c * THREADS + t
        s = float32(-math.inf)
        if j < n:
            p = p0 + j
            blk, off = block_tables[r, p // BS], p % BS
            slot[t] = blk * BS + off
            dot = float32(0.0)
            for d in range(D):
                dot += qs[d] * k_pool[blk, off, hk, d]
            s = dot * scale
        m_new = max(m, block_max(red, s, t, THREADS))  # max: 64 -> 32 -> ... -> 1; finite: the chunk has a position
        e = math.exp(s - m_new) if j < n else float32(0.0)
        ps[t] = e                                     # read by every thread below: block_sum's syncs order it
        alpha = math.exp(m - m_new)                   # 0 at the first chunk (m = -inf)
        lsum = lsum * alpha + block_sum(red, e, t, THREADS)   # sum, same tree
        m = m_new
        for a in range(NACC):
            d = t + a * THREADS
            if d < D:
                x = acc[a] * alpha
                for jj in range(min(THREADS, n - c * THREADS)):
                    x += ps[jj] * v_pool[slot[jj] // BS, slot[jj] % BS, hk, d]
                acc[a] = x
    for a in range(NACC):
        d = t + a * THREADS
        if d < D:
            part_out[r, sp, h, d] = acc[a] / lsum if lsum > 0 else float32(0.0)
    if t == 0:
        part_max[r, sp, h] = m
        part_lse[r, sp, h] = m + math.log(lsum) if lsum > 0 else float32(-math.inf)


@cuda_kernel("void(float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1])")
def flash_decoding_combine(part_out, part_lse, out):
    """out (R, H, D) from the S partial outputs, weighted by exp(lse_s - max lse). Grid (R, H), THREADS
    threads over dims; each thread walks the splits in order (S is small)."""
    r, h, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    S, D = part_out.shape[1], part_out.shape[3]
    g = float32(-math.inf)
    for s in range(S):
        g = max(g, part_lse[r, s, h])
    for d in range(t, D, THREADS):
        num, den = float32(0.0), float32(0.0)
        for s in range(S):
            if part_lse[r, s, h] > -math.inf:
                w = math.exp(part_lse[r, s, h] - g)
                num += w * part_out[r, s, h, d]
                den += w
        out[r, h, d] = num / den if den > 0 else float32(0.0)


def _host(x):
    """A small metadata array as numpy on the host (to validate it before any launch)."""
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)


def check_paged(q, k_pool, v_pool, block_tables, context_lens, num_splits: int = 1):
    """Every launcher's (and CPU wrapper's) guard: dtypes, shapes, contiguity, GQA, and that each row
    reads only blocks that exist: a bad table entry would read another sequence's memory, or crash."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    check_array("q", q, np.float32, 3)
    R, H, D = q.shape
    check_array("k_pool", k_pool, np.float32, 4, (None, None, None, D))
    check_array("v_pool", v_pool, np.float32, 4, tuple(k_pool.shape))
    check_array("block_tables", block_tables, np.int64, 2, (R, None))
    check_array("context_lens", context_lens, np.int64, 1, (R,))
    NB, BS, Hkv, _ = k_pool.shape
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"k_pool has {Hkv} KV heads: must divide q's H = {H} (GQA)")
    M = block_tables.shape[1]
    ctx, table = _host(context_lens), _host(block_tables)
    for r in range(R):
        if not 0 <= ctx[r] <= M * BS:
            raise ValueError(f"context_lens[{r}] = {ctx[r]} is outside [0, M * block_size] = [0, {M * BS}]")
        used = table[r, :cdiv(int(ctx[r]), BS)]                             # (blocks read,) the entries row r reads
        bad = np.flatnonzero((used < 0) | (used >= NB))
        if bad.size:
            raise ValueError(f"row {r} reads block_tables[{r}, {bad[0]}] = {used[bad[0]]}, outside [0, NB) = [0, {NB})")


def _launch_splits(q, k_pool, v_pool, block_tables, context_lens, num_splits):
    R, H, D = q.shape
    if D > DMAX:
        raise ValueError(f"head dim D = {D} exceeds the CUDA kernel's DMAX = {DMAX}")
    part_out = empty_like(q, (R, num_splits, H, D))                           # (R, S, H, D)
    part_max = empty_like(q, (R, num_splits, H))                              # (R, S, H)
    part_lse = empty_like(q, (R, num_splits, H))                              # (R, S, H)
    if R:
        paged_attention_split[(R, H, num_splits), THREADS](
            to_device(q), to_device(k_pool), to_device(v_pool), to_device(block_tables), to_device(context_lens),
            to_device(part_out), to_device(part_max), to_device(part_lse))
    return part_out, part_max, part_lse


def paged_attention_cuda(q, k_pool, v_pool, block_tables, context_lens):
    """Decode attention, one block per (row, head): q (R, H, D) -> (R, H, D) float32."""
    check_paged(q, k_pool, v_pool, block_tables, context_lens)
    part_out, _, _ = _launch_splits(q, k_pool, v_pool, block_tables, context_lens, 1)
    return part_out.reshape(tuple(q.shape))      # one split: its partial output is the output


def flash_decoding_cuda(q, k_pool, v_pool, block_tables, context_lens, num_splits: int):
    """Flash-Decoding: num_splits blocks per (row, head), then a combine kernel. q (R, H, D) -> (R, H, D)."""
    check_paged(q, k_pool, v_pool, block_tables, context_lens, num_splits)
    part_out, _, part_lse = _launch_splits(q, k_pool, v_pool, block_tables, context_lens, num_splits)
    out = empty_like(q, tuple(q.shape))                                       # (R, H, D)
    if q.shape[0]:
        flash_decoding_combine[tuple(q.shape[:2]), THREADS](to_device(part_out), to_device(part_lse), to_device(out))
    return out


# ----------------------------------------------------------------------------- CPU twins

@njit(fastmath=True, cache=True)
def attend_heads(q, k_pool, v_pool, k_scale, v_scale, table, h0, h1, p0, p1, start, visible, s, m, lsum, acc):
    """Heads h0 .. h1 - 1 of one row over its positions [p0, p1): q (H, D), table (M,) its block table,
    s (h1 - h0, >= p1 - p0) scratch; writes m, lsum (h1 - h0,) each head's max score and sum_p exp(s_p - m),
    and acc (H, D) rows h0 .. h1 - 1 <- sum_p exp(s_p - m) v_p (not yet divided by lsum).
    Position-major: a position's K (then V) for all these heads is one contiguous piece of its slot
    (Hkv * D floats), read once and front to back, so the pool streams as run.c's contiguous cache does;
    head-major order read D floats every Hkv * D and was 5x slower once the pool left the caches.
    Each head's arithmetic is one fixed order (scores in position order, then exps and sums in position order)
    whatever h0, h1 and the other rows are, so grouping heads differently never changes a bit.
    An int8 pool (k_scale, v_scale (NB, BS, Hkv), non-empty) is dequantized on read: the score is
    (q . k_q) * k_scale / sqrt(D) and the value weight exp(s - m) * v_scale, one multiply on a scalar each.
    A tree of new tokens (Medusa): position p in [start, start + len(visible)) is skipped unless visible[p - start]
    (its ancestors); an empty `visible` sees every position."""
    BS, D = k_pool.shape[1], q.shape[1]
    D8 = D // 8                                         # 8-float steps of the vector loops (kernels.vec8)
    Hkv = k_pool.shape[2]
    group = q.shape[0] // Hkv                           # query heads per K/V head (GQA)
    quant = k_scale.shape[0] > 0
    scale = np.float32(1.0 / np.sqrt(q.shape[1]))
    for i in range(h1 - h0):
        m[i], lsum[i] = NEG, 0.0
        acc[h0 + i] = 0.0
    for p in range(p0, p1):
        blk, off = table[p // BS], p % BS
        hidden = start <= p < start + visible.shape[0] and not visible[p - start]
        for h in range(h0, h1):
            i, j, hk = h - h0, p - p0, h // group
            if hidden:
                s[i, j] = NEG
                continue
            at = ((blk * BS + off) * Hkv + hk) * D           # k_pool[blk, off, hk, 0]'s flat index
            dot = dot8(q, h * D, k_pool, at, D8)            # d < 8 * D8, then the rest in order
            for d in range(8 * D8, D):
                dot += q[h, d] * np.float32(k_pool[blk, off, hk, d])
            s[i, j] = dot * k_scale[blk, off, hk] * scale if quant else dot * scale
            m[i] = max(m[i], s[i, j])
    for p in range(p0, p1):
        blk, off = table[p // BS], p % BS
        for h in range(h0, h1):
            i, j, hk = h - h0, p - p0, h // group
            if s[i, j] == NEG:
                continue
            e = exp32(s[i, j] - m[i])
            lsum[i] += e
            w = e * v_scale[blk, off, hk] if quant else e
            axpy8(w, v_pool, ((blk * BS + off) * Hkv + hk) * D, acc, h * D, D8)    # acc[h] += w v[blk, off, hk]
            for d in range(8 * D8, D):
                acc[h, d] += w * np.float32(v_pool[blk, off, hk, d])


@njit(parallel=True, fastmath=True, cache=True)
def paged_attention_rows(q, k_pool, v_pool, block_tables, context_lens, out):
    """out (R, H, D) <- row r's query q[r] (H, D) attending to its first context_lens[r] cached positions,
    in place. Each (row, head) is computed alone in a fixed order, so a row's result is the same bit for bit
    whatever the other rows are (prefill can give each query token its own row)."""
    paged_attention_tree_rows(q, k_pool, v_pool, block_tables, context_lens, context_lens,
                              np.zeros((q.shape[0], 0), np.bool_), out)             # no tree: every position


@njit(fastmath=True, cache=True)
def paged_attention_tree_rows(q, k_pool, v_pool, block_tables, context_lens, starts, visible, out):
    """paged_attention_rows for a step whose new tokens form a tree (Medusa's candidates): row r's positions
    from starts[r] on are the step's new tokens, and it sees new token u only where visible[r, u] (R, T)
    (torch's AttentionMetadata.tree_mask); the cached positions before starts[r] it sees all. visible (R, 0):
    no tree, row r sees its first context_lens[r] positions."""
    no_scale = np.empty((0, 0, 0), np.float32)     # np.empty: under parallel=True, np.zeros is a parallel loop
    attention_rows(q, k_pool, v_pool, no_scale, no_scale, block_tables, context_lens, starts, visible, out)


@njit(fastmath=True, cache=True)
def _attend_chunk(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, starts, visible, r, c, m, lsum,
                  part):
    """One task of attention_rows: chunk c of row r (positions c * CHUNK .. up to its context), all heads ->
    m, lsum (H,) and part (H, D)."""
    p0 = c * CHUNK
    p1 = min(p0 + CHUNK, context_lens[r])
    H = q.shape[1]
    s = np.empty((H, max(p1 - p0, 1)), np.float32)                # (H, positions) scores
    mine = np.empty((2, H), np.float32)     # this task's max and sum, updated per position in its own memory:
    attend_heads(q[r], k_pool, v_pool, k_scale, v_scale, block_tables[r], 0, H, p0, p1, starts[r],   # m and lsum
                 visible[r], s, mine[0], mine[1], part)           # of neighbouring tasks share a cache line
    m[:] = mine[0]
    lsum[:] = mine[1]


@njit(parallel=True, fastmath=True, cache=True)
def attention_rows(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, starts, visible, out):
    """paged_attention_tree_rows over a float pool (k_scale, v_scale empty) or an int8 one (attend_heads).
    Each row's context is cut into chunks of CHUNK positions, and every (row, chunk) is one task over all of the
    row's heads (vLLM's paged_attention_v2 partitions a context the same way, in fixed PARTITION_SIZE pieces):
    a task reads each of its slots once, front to back, and a batch of one row with a long context still keeps
    every thread busy. Then each row's chunks are combined in chunk order, Flash-Decoding's way; a row of one
    chunk is divided by its own sum, as before there were chunks. The cut depends on the row's own context
    length only, so a row's result is the same bit for bit whatever else is in the batch.
    Measured on a batch-1 step of random stories15M at position 255 (AMD EPYC, 2 threads), against one task per
    head (a sixth of every slot, strided, latency-bound once the pool comes from memory): about 2.3 ms of
    attention per step before, 0.4-0.5 ms after."""
    R, H, D = q.shape
    first = np.empty(R + 1, np.int64)               # row r's chunks are tasks first[r] .. first[r + 1] - 1
    first[0] = 0
    for r in range(R):
        first[r + 1] = first[r] + max(1, (context_lens[r] + CHUNK - 1) // CHUNK)
    T = first[R]
    row = np.empty(T, np.int64)                     # (T,) each task's row
    for r in range(R):
        for t in range(first[r], first[r + 1]):     # a loop: a slice assignment here would be a parallel loop
            row[t] = r
    part = np.empty((T, H, D), np.float32)          # (T, H, D) sum_p exp(s_p - m) v_p over the chunk
    m, lsum = np.empty((T, H), np.float32), np.empty((T, H), np.float32)   # (T, H) its max and sum of exps
    if T == 1:                                      # one short row: less work than waking the threads
        _attend_chunk(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, starts, visible, 0, 0,
                      m[0], lsum[0], part[0])
    else:
        for t in prange(T):
            _attend_chunk(q, k_pool, v_pool, k_scale, v_scale, block_tables, context_lens, starts, visible, row[t],
                          t - first[row[t]], m[t], lsum[t], part[t])
    for r in range(R):                              # combine: tiny (R H D per chunk), one thread
        t0, t1 = first[r], first[r + 1]
        for h in range(H):
            if t1 - t0 == 1:                        # one chunk: its own sum, no weights
                den = lsum[t0, h]
                for d in range(D):
                    out[r, h, d] = part[t0, h, d] / den if den > 0 else 0.0
                continue
            g = m[t0, h]
            for t in range(t0 + 1, t1):
                g = max(g, m[t, h])
            den = np.float32(0.0)
            for d in range(D):
                out[r, h, d] = 0.0
            for t in range(t0, t1):                 # in chunk order; an empty chunk has weight exp(NEG - g) = 0
                w = exp32(m[t, h] - g)
                den += w * lsum[t, h]
                for d in range(D):
                    out[r, h, d] += w * part[t, h, d]
            for d in range(D):
                out[r, h, d] = out[r, h, d] / den if den > 0 else 0.0


@njit(parallel=True, fastmath=True, cache=True)
def flash_decoding_rows(q, k_pool, v_pool, block_tables, context_lens, num_splits, out):
    """out (R, H, D) as paged_attention_rows, computed Flash-Decoding's way: each row's context cut into
    num_splits chunks of ceil(n / num_splits) positions, every (row, split, head) a separate task writing
    o_s and lse_s, then a combine over splits in split order."""
    R, H, D = q.shape
    S = num_splits
    part_out = np.zeros((R, S, H, D), np.float32)                             # (R, S, H, D)
    part_lse = np.empty((R, S, H), np.float32)                                # (R, S, H)
    no_tree, no_scale = np.zeros(0, np.bool_), np.zeros((0, 0, 0), np.float32)
    for idx in prange(R * S * H):
        r, sp, h = idx // (S * H), (idx // H) % S, idx % H
        n = context_lens[r]
        per = (n + S - 1) // S
        p0 = min(sp * per, n)
        p1 = min(p0 + per, n)
        s = np.empty((1, max(per, 1)), np.float32)
        m, lsum = np.empty(1, np.float32), np.empty(1, np.float32)
        o = part_out[r, sp]                           # (H, D): attend_heads writes row h
        attend_heads(q[r], k_pool, v_pool, no_scale, no_scale, block_tables[r], h, h + 1, p0, p1, 0, no_tree,
                     s, m, lsum, o)
        for d in range(D):                            # an empty split: o = 0 and lse = NEG
            o[h, d] = o[h, d] / lsum[0] if lsum[0] > 0 else 0.0
        part_lse[r, sp, h] = m[0] + np.log(lsum[0]) if lsum[0] > 0 else NEG
    for idx in prange(R * H):                         # combine, in split order
        r, h = idx // H, idx % H
        g = part_lse[r, :, h].max()
        out[r, h] = 0.0
        den = np.float32(0.0)
        for sp in range(S):
            w = np.exp(part_lse[r, sp, h] - g)        # an empty split: exp(NEG - g) = 0 (or 1 * zeros if all are)
            den += w
            for d in range(D):
                out[r, h, d] += w * part_out[r, sp, h, d]
        for d in range(D):
            out[r, h, d] /= den


def paged_attention_cpu(q, k_pool, v_pool, block_tables, context_lens):
    """Decode attention, numpy in and out: q (R, H, D) -> (R, H, D)."""
    check_paged(q, k_pool, v_pool, block_tables, context_lens)
    out = np.empty(q.shape, np.float32)                                       # (R, H, D)
    paged_attention_rows(q, k_pool, v_pool, block_tables, context_lens, out)
    return out


def flash_decoding_cpu(q, k_pool, v_pool, block_tables, context_lens, num_splits: int):
    """Flash-Decoding, numpy in and out: q (R, H, D) -> (R, H, D)."""
    check_paged(q, k_pool, v_pool, block_tables, context_lens, num_splits)
    out = np.empty(q.shape, np.float32)                                       # (R, H, D)
    flash_decoding_rows(q, k_pool, v_pool, block_tables, context_lens, num_splits, out)
    return out
