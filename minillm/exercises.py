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
