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


@pytest.fixture(scope="module")
def tiny64():
    """The tiny preset with large random weights (varied text, so a wrong token shows), in float64 so that
    equality tests compare exactly (DESIGN rule 7): (model, tokenizer)."""
    from minillm.formats.loader import random_model
    model, tok = random_model("tiny", seed=0)
    model.init_weights(seed=5, std=0.15)
    return model.double(), tok
