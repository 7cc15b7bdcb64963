"""What every checker shares: the result type, the registry and its guard, a tolerance check.

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
    assert torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol), \
        f"{name}: max abs error {err:.3g} (tolerance {atol:g})"
