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
