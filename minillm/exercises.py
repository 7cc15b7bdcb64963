"""Checkers for the notebooks' "your turn" exercises.

A notebook exercise is a function the reader writes between `### BEGIN SOLUTION` and
`### END SOLUTION`; the next cell calls a checker from here on it. A checker compares the reader's
function with the engine's own code on a few inputs (odd shapes included), never raises, and returns
an ExerciseResult whose text says pass or fail and why. `make student` removes the solutions;
tests/test_exercises.py shows that every checker fails on the empty stub and passes on the solution.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

CHECKERS: dict = {}


@dataclass
class ExerciseResult:
    name: str
    passed: bool
    message: str

    def __repr__(self):
        return f"{'PASS' if self.passed else 'FAIL'} {self.name}: {self.message}"

    def __bool__(self):
        return self.passed


def checker(fn):
    """Register a checker; exceptions in the reader's code become a FAIL with the error's text."""
    def run(user_fn) -> ExerciseResult:
        try:
            msg = fn(user_fn)
            return ExerciseResult(fn.__name__, True, msg)
        except NotImplementedError:
            return ExerciseResult(fn.__name__, False, "not implemented yet (the stub raises NotImplementedError)")
        except AssertionError as e:
            return ExerciseResult(fn.__name__, False, str(e))
        except Exception as e:  # the reader's code crashed: say how, don't crash the notebook
            return ExerciseResult(fn.__name__, False, f"{type(e).__name__}: {e}")
    run.__name__ = run.__qualname__ = fn.__name__
    run.__doc__ = fn.__doc__
    CHECKERS[fn.__name__] = run
    return run


def _close(name, got, want, atol=1e-5, rtol=1e-5):
    got = torch.as_tensor(got)
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    err = (got.double() - want.double()).abs().max().item()
    assert torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol), f"{name}: max abs error {err:.3g} (tolerance {atol:g})"


# ---------------------------------------------------------------- 00_tour: sampling
@checker
def check_temperature_softmax(fn):
    """fn(logits (V,), temperature) -> probabilities (V,)"""
    g = torch.Generator().manual_seed(0)
    for V, t in [(7, 1.0), (50, 0.5), (33, 2.0)]:
        logits = torch.randn(V, generator=g) * 3
        _close(f"V={V}, T={t}", fn(logits, t), torch.softmax(logits / t, -1))
    return "matches softmax(logits / T) for T = 0.5, 1, 2"


@checker
def check_top_p(fn):
    """fn(probs (V,), p) -> probabilities restricted to the smallest top set reaching p, renormalised"""
    from .sampling import probs_from_logits
    g = torch.Generator().manual_seed(1)
    for V, p in [(10, 0.5), (40, 0.9), (5, 1.0), (17, 0.01)]:
        logits = torch.randn(V, generator=g) * 2
        _close(f"V={V}, p={p}", fn(torch.softmax(logits, -1), p), probs_from_logits(logits, 1.0, 0, p))
    return "matches minillm.sampling.probs_from_logits for p = 0.01 .. 1"


# ---------------------------------------------------------------- 01_model_from_scratch
@checker
def check_rmsnorm(fn):
    """fn(x (..., C), weight (C,), eps) -> (..., C)"""
    from .model import RMSNorm
    g = torch.Generator().manual_seed(2)
    for shape in [(3, 8), (2, 5, 17), (1, 1, 64)]:
        x, w = torch.randn(shape, generator=g), torch.randn(shape[-1], generator=g)
        ref = RMSNorm(shape[-1], 1e-5)
        ref.weight.data = w
        _close(f"shape {shape}", fn(x, w, 1e-5), ref(x).detach())
    return "matches minillm.model.RMSNorm on 3 shapes"


@checker
def check_rope(fn):
    """fn(x (B, T, H, D), positions (B, T), theta) -> (B, T, H, D), pairs (2j, 2j+1) rotated"""
    from .model import apply_rope, rope_tables
    g = torch.Generator().manual_seed(3)
    for B, T, H, D in [(1, 5, 2, 8), (2, 3, 3, 16)]:
        x = torch.randn(B, T, H, D, generator=g)
        pos = torch.randint(0, 100, (B, T), generator=g)
        cos, sin = rope_tables(D, 128, 10000.0)
        _close(f"shape {(B, T, H, D)}", fn(x, pos, 10000.0), apply_rope(x, cos[pos], sin[pos]), atol=1e-4)
    return "matches minillm.model.apply_rope (llama2.c pair layout) at random positions"


# ---------------------------------------------------------------- 02_kv_cache
@checker
def check_kv_cache_bytes(fn):
    """fn(config: ModelConfig, num_tokens, bytes_per_elem) -> bytes of K and V for num_tokens tokens"""
    from .config import ModelConfig
    for name, n, b in [("stories15M", 256, 4), ("shakespeare", 1024, 2), ("tiny", 7, 1)]:
        cfg = ModelConfig.from_name(name)
        want = n * cfg.kv_bytes_per_token(b)
        got = fn(cfg, n, b)
        assert got == want, f"{name}, {n} tokens, {b} bytes/elem: got {got}, expected {want} (2 x layers x Hkv x D x ...)"
    return "K and V bytes right for MHA and GQA shapes"


@checker
def check_slot_mapping(fn):
    """fn(block_table: list[int], positions: list[int], block_size) -> list of slots"""
    from .attention import AttentionMetadata
    cases = [([3, 0, 7], [0, 1, 15, 16, 40], 16), ([5], [0, 9], 256), ([2, 9, 4, 1], [0, 1, 2, 3, 4, 5, 6, 7], 2)]
    for table, pos, bs in cases:
        want = AttentionMetadata.build(torch.tensor([pos]), torch.tensor([table]), torch.tensor([max(pos) + 1]), bs).slot_mapping[0].tolist()
        got = [int(s) for s in fn(table, pos, bs)]
        assert got == want, f"table {table}, block_size {bs}: got {got}, expected {want}"
    return "slot = block_table[p // block_size] * block_size + p % block_size"


# ---------------------------------------------------------------- 03_kernels_numba_cuda
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
    pad = lambda d: tuple(d) + (1,) * (3 - len(d))
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
    import numpy as np

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


# ---------------------------------------------------------------- 04_flash_attention
@checker
def check_online_softmax_update(fn):
    """fn(m, d, x) -> (m_new, d_new): the running max and the running sum of exp(. - max) after one more
    element x (Milakov & Gimelshein's recurrence; the first call gets m = -inf, d = 0)"""
    import math

    import numpy as np

    from .kernels.softmax import online_softmax_steps, softmax_cpu
    rng = np.random.default_rng(4)
    cases = [("7 random values", rng.standard_normal(7) * 2), ("a rising row", np.arange(6.0)),
             ("a falling row", -np.arange(6.0)), ("values near 1000", 1000 + rng.standard_normal(9) * 5)]
    for name, xs in cases:
        m, d = -math.inf, 0.0
        for (i, m_ref, d_ref), x in zip(online_softmax_steps(xs), xs):
            m, d = (float(v) for v in fn(m, d, float(x)))
            assert math.isclose(m, m_ref, rel_tol=1e-12), f"{name}, after element {i}: m = {m:.6g}, expected {m_ref:.6g}"
            assert math.isclose(d, d_ref, rel_tol=1e-6), \
                f"{name}, after element {i}: d = {d:.6g}, expected {d_ref:.6g} (is the old sum rescaled when the max rises?)"
        if name == "7 random values":                       # (m, d) is all the softmax needs
            want = softmax_cpu(xs.astype(np.float32)[None])[0]
            got = np.exp(xs - m) / d
            assert np.allclose(got, want, atol=1e-6), f"{name}: exp(x - m) / d is not the softmax"
    return "matches online_softmax_steps after every element; exp(x - m) / d is the softmax, even near 1000"


def _split_partials(q, k, v, n, num_splits):
    """Flash-Decoding's per-split outputs o_s (S, H, D) and log-sum-exps (S, H) of one query row q (H, D)
    over its first n keys k, v (n, Hkv, D), in float64: split s covers ceil(n / S) positions."""
    import numpy as np
    H, D = q.shape
    group = H // k.shape[1]
    per = -(-n // num_splits)
    outs, lses = np.zeros((num_splits, H, D)), np.full((num_splits, H), -np.inf)
    for s in range(num_splits):
        p0, p1 = min(s * per, n), min((s + 1) * per, n)
        if p1 == p0:                                          # an empty split: o = 0, lse = -inf
            continue
        for h in range(H):
            sc = k[p0:p1, h // group].astype(np.float64) @ q[h] / np.sqrt(D)     # (p1 - p0,)
            e = np.exp(sc - sc.max())
            outs[s, h] = e @ v[p0:p1, h // group] / e.sum()
            lses[s, h] = sc.max() + np.log(e.sum())
    return outs, lses


@checker
def check_combine_splits(fn):
    """fn(outs (S, H, D), lses (S, H)) -> out (H, D): combine Flash-Decoding's per-split outputs, each
    normalised by its own sum, using their log-sum-exps (an empty split has lse = -inf)"""
    import numpy as np

    from .kernels.paged_attention import paged_attention_cpu
    rng = np.random.default_rng(5)
    BS = 4
    for name, n, S, H, Hkv, D, shift in [("context 100, 4 splits", 100, 4, 2, 2, 16, 0.0),
                                         ("context 37, 3 uneven splits, GQA", 37, 3, 4, 1, 8, 0.0),
                                         ("context 5, 8 splits (3 empty)", 5, 8, 2, 2, 4, 0.0),
                                         ("scores shifted by +1000", 64, 4, 2, 2, 8, 1000.0),
                                         ("one split", 20, 1, 1, 1, 8, 0.0)]:
        k, v = (rng.standard_normal((n, Hkv, D)).astype(np.float32) for _ in range(2))
        q = rng.standard_normal((H, D)).astype(np.float32)
        nb = -(-n // BS)
        table = rng.permutation(nb + 2)[:nb].astype(np.int64)                # blocks anywhere in a pool
        k_pool, v_pool = (np.zeros((nb + 2, BS, Hkv, D), np.float32) for _ in range(2))
        for p in range(n):
            k_pool[table[p // BS], p % BS], v_pool[table[p // BS], p % BS] = k[p], v[p]
        want = paged_attention_cpu(q[None], k_pool, v_pool, table[None], np.array([n], np.int64))[0]   # (H, D)
        outs, lses = _split_partials(q, k, v, n, S)
        got = np.asarray(fn(outs.copy(), lses + shift), dtype=np.float64)   # a common shift cancels out
        assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
        assert np.isfinite(got).all(), f"{name}: non-finite output (subtract the largest lse before exp)"
        err = np.abs(got - want).max()
        assert err < 2e-5, f"{name}: max abs error {err:.3g} against paged_attention_cpu over the whole context"
    return "matches paged_attention_cpu over the whole context: uneven and empty splits, GQA, lse near 1000"


# ---------------------------------------------------------------- 07_quantization
@checker
def check_quantize_int8_row(fn):
    """fn(w (K,) float32 tensor) -> (q (K,) integers in [-127, 127], scale float): symmetric absmax, w ~ scale * q"""
    import numpy as np
    from .kernels.quant_gemv import quantize_int8
    g = torch.Generator().manual_seed(7)
    rows = [torch.randn(64, generator=g), torch.randn(7, generator=g) * 1e-3, torch.zeros(5),
            torch.tensor([0.5, -2.0, 1.0, 0.25]), torch.randn(33, generator=g) * 40]
    for w in rows:
        want_q, want_s, _ = quantize_int8(w.numpy()[None])
        q, s = fn(w.clone())
        q = torch.as_tensor(np.asarray(q)).reshape(-1).double()
        s = float(s)
        assert q.shape == (w.numel(),), f"K={w.numel()}: q has shape {tuple(q.shape)}, expected ({w.numel()},)"
        assert abs(s - float(want_s[0])) <= 1e-6 * float(want_s[0]) + 1e-12, \
            f"K={w.numel()}, max |w|={w.abs().max().item():.3g}: scale {s:.6g}, expected max|w|/127 = {float(want_s[0]):.6g}"
        assert (q == q.round()).all() and q.abs().max() <= 127, f"K={w.numel()}: q must be integers in [-127, 127]"
        off = (q - torch.from_numpy(want_q[0]).double()).abs()
        assert off.max() <= 1 and (off > 0).sum() <= 1, f"K={w.numel()}: q differs from round(w / scale) in {(off > 0).sum()} places"
        err = (q * s - w.double()).abs().max().item()
        assert err <= s / 2 * (1 + 1e-4) + 1e-12, f"K={w.numel()}: max error {err:.3g} is more than half a step ({s / 2:.3g})"
    return "scale = max|w| / 127, q = round(w / scale), error within half a step; an all-zero row stays zero"


@checker
def check_smooth_factor(fn):
    """fn(act_max (K,), w_max (K,), alpha) -> s (K,): SmoothQuant's s_j = act_max_j^alpha / w_max_j^(1 - alpha)"""
    from .quant import smoothing_factors
    g = torch.Generator().manual_seed(8)
    for K, alpha in [(16, 0.5), (7, 0.0), (9, 1.0), (32, 0.8)]:
        act = torch.rand(K, generator=g) * 3 + 0.05
        act[0] *= 60                                            # an outlier channel
        w = torch.randn(5, K, generator=g) * 0.1
        want = smoothing_factors(act, w, alpha)
        got = torch.as_tensor(fn(act.clone(), w.abs().amax(0), alpha))
        _close(f"K={K}, alpha={alpha}", got, want, atol=1e-6, rtol=1e-5)
    return "matches minillm.quant.smoothing_factors: alpha = 0 puts all the range on the weights, 1 on the activations"


# ---------------------------------------------------------------- 08_speculative_decoding
@checker
def check_residual(fn):
    """fn(p (V,), q (V,)) -> the distribution sampled after a rejection: norm(max(0, p - q)), or p if that is 0"""
    from .speculative import residual
    g = torch.Generator().manual_seed(11)
    for V in (2, 5, 33):
        p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
        _close(f"V={V}", torch.as_tensor(fn(p.clone(), q.clone()), dtype=torch.float64), residual(p, q, 0), atol=1e-12)
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    _close("p == q (empty residual: fall back to p)", torch.as_tensor(fn(p.clone(), p.clone()), dtype=torch.float64), p, atol=1e-12)
    return "matches minillm.speculative.residual: rejected mass goes where the target wants more than the draft gave"


@checker
def check_ngram_lookup(fn):
    """fn(tokens, k, n) -> up to k tokens that followed the latest earlier occurrence of the last n tokens"""
    cases = [([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], 2, 3, [4, 5]), ([7, 8, 9], 3, 2, []), ([4, 1, 4, 2, 4], 1, 1, [2]),
             ([5, 6, 5, 6, 7, 5, 6], 2, 2, [7, 5]), ([3, 3, 3], 1, 2, [3])]
    for tokens, k, n, want in cases:
        got = list(fn(list(tokens), k, n))
        assert got[:len(want)] == want and len(got) <= k, f"tokens={tokens}, k={k}, n={n}: got {got}, want {want}"
        assert got == want or len(got) > len(want), f"tokens={tokens}, k={k}, n={n}: got {got}, want {want}"
    return "finds the latest match and copies what followed it"


# ---------------------------------------------------------------- 09_training_and_distillation
@checker
def check_lr_schedule(fn):
    """fn(step, lr, min_lr, warmup_steps, max_steps) -> learning rate (linear warm-up, then cosine)"""
    from .train import TrainConfig, lr_at
    for lr, lo, w, m in [(1e-3, 1e-4, 10, 100), (3e-4, 0.0, 1, 50), (2.0, 0.5, 25, 26)]:
        tc = TrainConfig(lr=lr, min_lr=lo, warmup_steps=w, max_steps=m)
        for step in sorted({0, w - 1, w, (w + m) // 2, m - 1, m, m + 5}):
            got, want = fn(step, lr, lo, w, m), lr_at(step, tc)
            assert abs(got - want) <= 1e-9 + 1e-6 * abs(want), f"step {step} (lr={lr}, warmup={w}, max={m}): got {got}, expected {want}"
    return "warm-up, cosine decay and the floor after max_steps all match minillm.train.lr_at"


@checker
def check_kd_loss(fn):
    """fn(student_logits (B, T, V), teacher_logits (B, T, V), targets (B, T), T, lam) -> scalar loss"""
    from .train import kd_loss
    g = torch.Generator().manual_seed(4)
    for shape, temp, lam in [((2, 3, 11), 2.0, 0.5), ((1, 5, 7), 1.0, 0.0), ((3, 1, 13), 4.0, 1.0)]:
        s, t = torch.randn(shape, generator=g) * 2, torch.randn(shape, generator=g) * 2
        y = torch.randint(0, shape[-1], shape[:2], generator=g)
        _close(f"shape {shape}, T={temp}, lambda={lam}", torch.as_tensor(fn(s, t, y, temp, lam)).reshape(()),
               kd_loss(s, t, y, temp, lam).reshape(()), atol=1e-5)
    return "T^2 KL(p_teacher^T || q_student^T) + lambda CE matches minillm.train.kd_loss"


@checker
def check_alpha(fn):
    """fn(p (N, V), q (N, V)) -> mean over rows of sum_x min(p, q)"""
    g = torch.Generator().manual_seed(5)
    for N, V in [(1, 5), (7, 30)]:
        p = torch.softmax(torch.randn(N, V, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(torch.randn(N, V, generator=g, dtype=torch.float64), -1)
        want = torch.minimum(p, q).sum(-1).mean()
        _close(f"N={N}, V={V}", torch.as_tensor(fn(p, q), dtype=torch.float64).reshape(()), want.reshape(()), atol=1e-9)
    p = torch.softmax(torch.randn(3, 9, generator=g, dtype=torch.float64), -1)
    _close("alpha(p, p)", torch.as_tensor(fn(p, p), dtype=torch.float64).reshape(()), torch.tensor(1.0, dtype=torch.float64), atol=1e-9)
    return "alpha = E[sum_x min(p, q)], and 1 for a draft equal to the target"


# ---------------------------------------------------------------- 05_batching
def _engine_static_steps(lengths, max_num_seqs) -> int:
    """Model calls the engine makes to serve these output lengths under static batching, all arriving at once."""
    from .llm import LLM
    from .sampling import SamplingParams
    llm = LLM("random:tiny", batching="static", max_num_seqs=max_num_seqs, max_model_len=64)
    llm.generate([[1, 300 + i] for i in range(len(lengths))],
                 [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths])
    return len(llm.engine.trace.steps)


@checker
def check_static_steps(fn):
    """fn(output_lengths: list[int], max_num_seqs) -> model calls to serve them with static batching"""
    for lengths, B in [([3, 1, 7, 2], 2), ([5], 4), ([1, 1, 9, 2, 4], 3), ([4, 4, 4], 1)]:
        want = _engine_static_steps(lengths, B)
        got = fn(list(lengths), B)
        assert got == want, f"lengths {lengths}, max_num_seqs {B}: got {got}, the engine made {want} model calls"
    return "matches the engine: each batch of max_num_seqs runs as long as its longest request"


@checker
def check_latency_metrics(fn):
    """fn(arrival_time, token_times: list) -> (ttft, tpot); tpot is None for a single token"""
    cases = [(0.5, [0.9, 1.0, 1.2, 1.3]), (2.0, [2.25]), (0.0, [0.1, 0.4])]
    for arrival, times in cases:
        ttft, tpot = fn(arrival, list(times))
        want_tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        assert abs(ttft - (times[0] - arrival)) < 1e-12, f"arrival {arrival}, tokens at {times}: TTFT {ttft}, expected {times[0] - arrival}"
        assert (tpot is None) == (want_tpot is None) and (tpot is None or abs(tpot - want_tpot) < 1e-12), \
            f"tokens at {times}: TPOT {tpot}, expected {want_tpot}"
    return "TTFT = first token - arrival; TPOT = mean gap between later tokens (as minillm.bench_serve)"


# ---------------------------------------------------------------- 06_paged_attention
@checker
def check_wasted_slots(fn):
    """fn(lengths: list[int], block_size) -> KV slots reserved but empty when each sequence holds whole blocks"""
    from .block_manager import BlockManager
    from .sampling import SamplingParams
    from .sequence import Sequence
    for lengths, bs in [([5, 16, 17], 16), ([1, 2, 3], 1), ([100], 1024), ([7, 9], 4)]:
        bm = BlockManager(sum(-(-n // bs) for n in lengths) + 1, bs)
        for i, n in enumerate(lengths):                 # the block manager allocates; count its empty slots
            bm.allocate(Sequence(i, str(i), 0, list(range(n)), SamplingParams(), 0, 0.0), n)
        want = bm.num_used * bs - sum(lengths)
        got = fn(list(lengths), bs)
        assert got == want, f"lengths {lengths}, block_size {bs}: got {got}, expected {want}"
    return "whole blocks minus tokens: only each sequence's last block is partly empty"


@checker
def check_prefix_hit_tokens(fn):
    """fn(first_prompt, second_prompt, block_size) -> tokens of the second prompt served from the prefix cache
    after the first has run (ids lists)"""
    from .llm import LLM
    from .sampling import SamplingParams
    a = [1] + list(range(300, 337))                       # 38 tokens
    cases = [(a, a[:30] + [400, 401], 8), (a, a + [402], 8), (a, a[:5] + [403] * 20, 4), (a, a[:20], 16), (a, list(a), 4)]
    for first, second, bs in cases:
        llm = LLM("random:tiny", block_size=bs, enable_prefix_caching=True, max_model_len=64)
        one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        llm.generate([first], one)
        want = llm.generate([second], one)[0].metrics.num_cached_tokens
        got = fn(list(first), list(second), bs)
        assert got == want, f"first {len(first)} tokens, second {len(second)}, block_size {bs}: got {got}, the engine reused {want}"
    return "whole blocks of the shared prefix, never the second prompt's last token"
