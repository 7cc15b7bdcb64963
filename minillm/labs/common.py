"""What every checker shares: the result type, the registry, the guard around the reader's code.

A notebook exercise is a function (or class) the reader writes between `### BEGIN SOLUTION` and
`### END SOLUTION`; the next cell calls a checker from here on it. A checker runs the reader's code
(against the engine's own code, or plugged into the engine itself) and returns an ExerciseResult that
says pass or fail and why. It never raises: the reader's code may raise, hang, return the wrong shape,
or take the wrong arguments, and each of those is a "fail: <reason>" within LIMIT_S seconds.

Warm-ups ask for a formula or a definition; a core exercise asks for the technique's mechanism and
plugs it into the real engine or kernel harness (`checker(kind="core")`).
"""
from __future__ import annotations

import inspect
import random
import signal
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

CHECKERS: dict = {}
KINDS = ("warm-up", "core")
LIMIT_S = 30.0          # a checker that runs the reader's code longer than this fails ("it hangs?")


@dataclass
class ExerciseResult:
    name: str
    passed: bool
    message: str
    kind: str = "warm-up"
    drawing: object = field(default=None, repr=False, compare=False)   # what the checker kept to draw (viz reads it)

    def __repr__(self):
        return f"{self.name} ({self.kind}): {'pass' if self.passed else 'fail'}: {self.message}"

    def __bool__(self):
        return self.passed


class TimeLimit(BaseException):
    """Raised inside the reader's code when the limit is up (a BaseException: `except Exception` in the
    reader's code does not swallow it)."""


def run_limited(fn, seconds: float | None = None):
    """fn() with a wall-clock limit (LIMIT_S unless given). On the main thread (a notebook, pytest, the grade
    command) an alarm interrupts it. Elsewhere it runs on a helper thread, abandoned when the limit passes."""
    seconds = LIMIT_S if seconds is None else seconds
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def alarm(signum, frame):
            raise TimeLimit()
        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeLimit()
    if "error" in box:
        raise box["error"]
    return box.get("value")


class _Clean:
    """Global state a checker or the reader's code may change, put back afterwards: random generators,
    torch's default dtype, grad mode and thread count. (The engines a checker builds are its own.)"""

    def __enter__(self):
        self.state = (torch.get_rng_state(), np.random.get_state(), random.getstate(), torch.get_default_dtype(),
                      torch.is_grad_enabled(), torch.get_num_threads())
        return self

    def __exit__(self, *exc):
        rng, np_rng, py_rng, dtype, grad, threads = self.state
        torch.set_rng_state(rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return False


def _signature_problem(user_obj, signature: str | None) -> str | None:
    """Why user_obj cannot be called as the exercise asks (None when it can)."""
    if not callable(user_obj):
        return f"expected a function or class, got {type(user_obj).__name__} {user_obj!r:.60}"
    if signature is None or inspect.isclass(user_obj):
        return None
    names = [s.strip() for s in signature.split(",") if s.strip()]
    try:
        inspect.signature(user_obj).bind(*names)
    except TypeError:
        pass
    except ValueError:      # a builtin without a signature: let the call decide
        return None
    else:
        return None
    name = getattr(user_obj, "__name__", "the function")
    try:
        have = str(inspect.signature(user_obj))
    except ValueError:
        have = "(...)"
    return f"wrong signature: {name}{have}; the checker calls it as {name}({', '.join(names)})"


def _task(user_obj) -> str:
    """'write my_attend(q, k, v): Causal grouped-query attention.': what the stub asks for, from its docstring."""
    name = getattr(user_obj, "__name__", "the function")
    try:
        sig = "" if inspect.isclass(user_obj) else str(inspect.signature(user_obj))
    except ValueError:
        sig = "(...)"
    doc = (inspect.getdoc(user_obj) or "").split("\n")[0]
    return f"write {name}{sig}" + (f": {doc}" if doc else "")


DRAWINGS: dict = {}     # checker name -> what its last run kept for drawing (notebook 03's kernel launches)


def _reference_problem(user_obj) -> str | None:
    """The engine's own implementation handed in as the answer (imported, assigned, or wrapped by functools).
    minillm.labs' own functions are let through here (the tests hand checkers the labs' planted mistakes);
    `minillm grade` refuses any import from minillm.labs but its checkers (minillm.labs.isolate)."""
    inner = getattr(user_obj, "func", None) or getattr(user_obj, "__wrapped__", None) or user_obj
    module = getattr(inner, "__module__", None) or ""
    if (module == "minillm" or module.startswith("minillm.")) and not module.startswith("minillm.labs"):
        return (f"{getattr(inner, '__qualname__', inner)!s:.60} is minillm's own (from {module}): the exercise asks "
                "you to write it, not to hand in the engine's")
    return None


def checker(fn=None, *, kind: str = "warm-up", signature: str | None = None, allow: tuple = ()):
    """Register a checker. `signature` ("q, k, v") is how the checker calls the reader's function: a
    function that cannot take those arguments fails before it runs. Everything the reader's code does
    becomes a result: an assertion's message, an exception's type and text, "timed out" past LIMIT_S.
    allow: the minillm names the exercise cell may import ("minillm.core.policies.SchedulingPolicy": a base
    class to extend); `minillm grade` fails a cell that imports any other (minillm.labs.isolate)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def register(body):
        def run(user_obj) -> ExerciseResult:
            def result(passed, msg):
                return ExerciseResult(body.__name__, passed, msg, kind, DRAWINGS.get(body.__name__))
            problem = _reference_problem(user_obj) or _signature_problem(user_obj, signature)
            if problem:
                return result(False, problem)
            try:
                with _Clean():
                    return result(True, run_limited(lambda: body(user_obj)))
            except TimeLimit:
                return result(False, f"timed out after {LIMIT_S:.0f} s: an endless loop, or far too slow?")
            except NotImplementedError:
                return result(False, "not implemented yet (the stub raises NotImplementedError): " + _task(user_obj))
            except AssertionError as e:
                return result(False, str(e))
            except Exception as e:  # the reader's code crashed: say how, don't crash the notebook
                return result(False, f"{type(e).__name__}: {e}")
        run.__name__ = run.__qualname__ = body.__name__
        run.__doc__ = body.__doc__
        run.kind, run.signature, run.allow = kind, signature, tuple(allow)
        CHECKERS[body.__name__] = run
        return run
    return register(fn) if fn is not None else register


def calls_building(fn, args: tuple, shape: tuple, besides=None) -> list[str]:
    """The torch calls inside fn(*args) that return a tensor of this shape (other than `besides`): how a checker
    sees that an answer built what the technique exists to avoid (a merged weight, a full score matrix)."""
    from torch.overrides import TorchFunctionMode
    found = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, a=(), kwargs=None):
            out = func(*a, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(shape) and \
                        (besides is None or t.data_ptr() != besides.data_ptr()):
                    found.append(getattr(func, "__name__", str(func)))
            return out
    with Watch():
        fn(*args)
    return found


def _close(name, got, want, atol=1e-5, rtol=1e-5, mistakes: dict | None = None):
    """Assert got ~= want. `mistakes` maps a common mistake's explanation to what that mistake computes: when
    got matches one of them instead, the failure names the mistake, not just the error."""
    got = torch.as_tensor(got)
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert got.dtype.is_floating_point == want.dtype.is_floating_point, \
        f"{name}: dtype {got.dtype}, expected {want.dtype}"
    if torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol):
        return
    for why, wrong in (mistakes or {}).items():
        wrong = torch.as_tensor(wrong).double()
        if wrong.shape == got.shape and torch.allclose(got.double(), wrong, atol=atol, rtol=rtol, equal_nan=True):
            raise AssertionError(f"{name}: {why}")
    err = (got.double() - want.double()).abs().max().item()
    raise AssertionError(f"{name}: max abs error {err:.3g} (tolerance {atol:g})")
