"""CUDA kernels in numba's simulator: run as their own pytest invocation with NUMBA_ENABLE_CUDASIM=1
(`make test` does), because numba fixes simulator-or-GPU when numba.cuda is first imported.
Shapes stay at most 32 per dimension: every simulated thread is a Python thread."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))   # tests/close.py

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    raise pytest.UsageError("tests/cudasim runs with NUMBA_ENABLE_CUDASIM=1 set (see the Makefile's test-unit)")


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.cudasim)
