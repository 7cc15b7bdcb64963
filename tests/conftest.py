import os

os.environ.setdefault("MINILLM_PROGRESS", "0")

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.fixture
def data_dir():
    return DATA
