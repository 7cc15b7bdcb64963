"""backend="auto" (the default): the fastest backend whose capability row covers every option asked for, and a
sentence saying which it chose; and the numba forward's on-disk compile cache, keyed on every kernel source."""
import pytest
import torch.nn as nn

from minillm import LLM
from minillm.backends import compile_cache
from minillm.backends.capabilities import choose_backend
from minillm.config import EngineConfig
from minillm.formats.loader import random_model


@pytest.fixture(scope="module")
def tiny():
    return random_model("tiny", seed=0)


@pytest.mark.parametrize("options,want,why", [
    (dict(), "numba", "cuda: no GPU"),
    (dict(dtype="float64"), "torch", "numba: does not run dtype='float64'"),
    (dict(quantization="smoothquant"), "torch", "numba: does not run quantization='smoothquant'"),
    (dict(quantization="int4", kv_cache_dtype="int8"), "numba", "cuda: no GPU"),
    (dict(backend="torch"), "torch", "asked for"),
])
def test_auto_picks_the_fastest_backend_that_runs_every_option(options, want, why, monkeypatch):
    monkeypatch.setattr("minillm.backends.capabilities._has_gpu", lambda: False)
    backend, sentence = choose_backend(EngineConfig(**options))
    assert backend == want and why in sentence


def test_auto_takes_cuda_on_a_gpu_machine(monkeypatch):
    monkeypatch.setattr("minillm.backends.capabilities._has_gpu", lambda: True)
    assert choose_backend(EngineConfig()) == ("cuda", "backend='auto' chose 'cuda'")


def test_auto_keeps_a_plugged_in_linear_on_torch(tiny, monkeypatch):
    """A student's weight type runs on torch only: auto must not hand it to numba (which copies nn.Linear weights)."""
    model, _ = tiny

    class MyLinear(nn.Module):
        def __init__(self, lin):
            super().__init__()
            self.lin, self.in_features, self.out_features = lin, lin.in_features, lin.out_features

        def forward(self, x):
            return self.lin(x)
    import copy
    plugged = copy.deepcopy(model)
    plugged.layers[0].attention.wq = MyLinear(plugged.layers[0].attention.wq)
    monkeypatch.setattr("minillm.backends.capabilities._has_gpu", lambda: False)
    backend, sentence = choose_backend(EngineConfig(), None, plugged)
    assert backend == "torch" and "MyLinear" in sentence
    assert choose_backend(EngineConfig(), None, model)[0] == "numba"


def test_the_engine_says_which_backend_it_chose(tiny):
    model, tok = tiny
    llm = LLM(model, tokenizer=tok)
    assert llm.engine.backend == "numba" and llm.engine.backend_choice.startswith("backend='auto' chose 'numba'")
    assert LLM(model, tokenizer=tok, dtype="float64").engine.backend == "torch"


def test_the_numba_forward_is_cached_under_a_key_covering_every_kernel_source():
    from minillm.backends.numba_model import forward_rows
    locator = forward_rows._cache._impl.locator
    assert isinstance(locator, compile_cache._KernelSources)
    assert locator.get_source_stamp() == compile_cache.sources_stamp()
    watched = {p.name for folder in compile_cache.WATCHED for p in folder.glob("*.py")}
    assert {"matmul.py", "paged_attention.py", "rmsnorm.py", "numba_model.py"} <= watched


def test_editing_any_watched_source_changes_the_key(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "fwd.py").write_text("x = 1\n")
    (tmp_path / "b" / "kernel.py").write_text("y = 2\n")
    monkeypatch.setattr(compile_cache, "WATCHED", (tmp_path / "a", tmp_path / "b"))
    monkeypatch.setattr(compile_cache, "_stamp", None)
    before = compile_cache.sources_stamp()
    (tmp_path / "b" / "kernel.py").write_text("y = 3\n")     # an edited kernel the forward inlines
    monkeypatch.setattr(compile_cache, "_stamp", None)
    assert compile_cache.sources_stamp() != before


def test_a_compile_failure_names_the_kernel_and_the_shapes():
    import numpy as np
    from numba import njit
    from numba.core.errors import NumbaError

    @njit
    def needs_2d(a):
        return a[0, 0] + "text"                 # no typing for float + str: numba refuses to compile
    with pytest.raises(RuntimeError, match=r"numba could not compile needs_2d for arguments \(float32\[3, 4\]\)") as e:
        with compile_cache.compile_errors("needs_2d", (np.zeros((3, 4), np.float32),)):
            needs_2d(np.zeros((3, 4), np.float32))
    assert isinstance(e.value.__cause__, NumbaError)


def test_a_forward_loaded_from_the_disk_cache_runs_in_a_fresh_process():
    """A cached forward calls numba's parallel scheduler; loaded from disk in a process that has not started
    numba's threads yet it aborted ("LLVM ERROR: Symbol not found: allocate_sched") until NumbaTransformer
    started them itself. Twice: the first run may compile and write the cache, the second loads it."""
    import subprocess
    import sys
    code = ("from minillm.formats.loader import random_model\n"
            "from minillm.backends.numba_model import NumbaTransformer\n"
            "from minillm.llama.kv_cache import KVCache\n"
            "m, _ = random_model('tiny', seed=0)\n"
            "kv = KVCache(m.config, num_blocks=1, block_size=m.config.max_seq_len)\n"
            "print(NumbaTransformer(m).decode_step(1, 0, kv)[1] >= 0)\n")
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-500:]
