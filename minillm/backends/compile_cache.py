"""Compiled forwards cached across processes, keyed on every kernel source they call.

The numba backend's forward (minillm.backends.numba_model) is one compiled function that inlines the CPU
twins of minillm.kernels; compiling it takes several seconds, which every notebook and test would pay on
its first `generate`. numba can cache compiled code on disk (`@njit(cache=True)`), but its cache key is
the file the function is written in: edit a kernel in minillm/kernels/matmul.py and the cached forward
would keep running the old matmul. This module gives the forwards a key that covers all of them: a hash
of every source file in minillm/kernels and minillm/backends (any edit there recompiles on next use).

Use: `from .compile_cache import cached` and decorate a forward with `@cached` instead of `@njit`.
The cache lives in __pycache__ beside the source, or in numba's user-wide cache folder when that is not
writable (an installed package); `NUMBA_CACHE_DIR` moves it, as for any numba cache.
"""
from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path

from numba import njit
from numba.core import caching
from numba.core.errors import NumbaError

from ..kernels import matmul

WATCHED = (Path(__file__).resolve().parent, Path(matmul.__file__).resolve().parent)  # backends, the kernels they inline
_stamp = None


def sources_stamp() -> str:
    """sha256 over the names and bytes of every .py file the cached forwards can call (computed once)."""
    global _stamp
    if _stamp is None:
        h = hashlib.sha256()
        for folder in WATCHED:
            for path in sorted(folder.glob("*.py")):
                h.update(path.name.encode() + b"\0" + path.read_bytes())
        _stamp = h.hexdigest()
    return _stamp


class _KernelSources:
    """A locator mixin: the stamp numba compares before it trusts a cached entry is sources_stamp(), not the
    one file's modification time. Applies only to functions decorated with `cached`."""

    def get_source_stamp(self):
        return sources_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if not getattr(py_func, "_minillm_cached", False):
            return None
        return super().from_function(py_func, py_file)


class _InTree(_KernelSources, caching.InTreeCacheLocator):
    pass


class _UserWide(_KernelSources, caching.UserWideCacheLocator):
    pass


class _UserProvided(_KernelSources, caching.UserProvidedCacheLocator):
    pass


for _cls in (_UserWide, _InTree, _UserProvided):      # first match wins: numba's CACHE_DIR, in-tree, user-wide
    if _cls not in caching.CacheImpl._locator_classes:
        caching.CacheImpl._locator_classes.insert(0, _cls)


def cached(fn=None, **options):
    """@njit(cache=True, **options) with the all-sources key above. Set MINILLM_NO_COMPILE_CACHE=1 to compile
    afresh in every process (e.g. to time compilation)."""
    def wrap(f):
        f._minillm_cached = True
        return njit(cache=os.environ.get("MINILLM_NO_COMPILE_CACHE", "0") != "1", **options)(f)
    return wrap(fn) if fn is not None else wrap


def compile_error(kernel: str, arrays, e: Exception) -> RuntimeError:
    """A numba compile (typing, lowering) failure as one error that names the kernel and its arguments' shapes
    and dtypes, with numba's own message after it (raise it `from e`)."""
    shapes = ", ".join(f"{a.dtype}{list(a.shape)}" if hasattr(a, "shape") else repr(a) for a in arrays)
    return RuntimeError(f"numba could not compile {kernel} for arguments ({shapes}): {str(e).strip().splitlines()[0]}")


@contextmanager
def compile_errors(kernel: str, arrays):
    """compile_error around a block (a hot path writes the try itself: a generator context costs microseconds)."""
    try:
        yield
    except NumbaError as e:
        raise compile_error(kernel, arrays, e) from e
