import os

os.environ.setdefault("MINILLM_PROGRESS", "0")

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

# tests/cudasim needs the CUDA simulator chosen before numba.cuda is imported: its own invocation.
if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    collect_ignore = ["cudasim"]

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.fixture
def data_dir():
    return DATA
