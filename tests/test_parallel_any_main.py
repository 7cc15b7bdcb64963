"""Tensor and pipeline parallelism from any main (issue 36): a script read on standard input, `python -c`, a
script without an `if __name__ == "__main__":` guard. Spawned ranks would re-run such a main; they skip it instead
(minillm.parallel.main_module). A guarded script still has its main imported by the ranks, so a function defined
in it can be sent to them; from a main they skipped, sending one is a one-line error. Each case runs in its own
Python process, as a user's would (a few seconds each: two ranks start)."""
import os
import subprocess
import sys

import pytest

from minillm import LLM, SamplingParams

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GENERATE = """
from minillm import LLM, SamplingParams
llm = LLM("shakespeare", {option}=2)
print("TEXT=" + repr(llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=12))[0].text))
"""
SEND_LOCAL = """
from minillm.parallel import start_group
def local(state):
    return state.rank
try:
    start_group(2).call(local)
except ValueError as e:
    print("REFUSED=" + str(e))
"""
GUARDED = """
from minillm.parallel import start_group
def local(state):
    return state.rank
if __name__ == "__main__":
    print("RANKS=" + repr(start_group(2).call(local)))
"""


@pytest.fixture(scope="module")
def want() -> str:
    return repr(LLM("shakespeare").generate("ROMEO:", SamplingParams(temperature=0, max_tokens=12))[0].text)


def python(*args, stdin=None, cwd=None) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT, "MINILLM_PROGRESS": "0"}
    r = subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True, timeout=240,
                       env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def line(out: str, key: str) -> str:
    return next(x for x in out.splitlines() if x.startswith(key + "=")).split("=", 1)[1]


def test_tensor_parallel_from_standard_input_and_a_local_function_refused(want):
    out = python("-", stdin=GENERATE.format(option="tensor_parallel_size") + SEND_LOCAL)
    assert line(out, "TEXT") == want
    assert "defined in the main module" in line(out, "REFUSED") and "module file" in line(out, "REFUSED")


def test_pipeline_parallel_from_python_c(want):
    assert line(python("-c", GENERATE.format(option="pipeline_parallel_size")), "TEXT") == want


def test_an_unguarded_script_and_a_guarded_one(want, tmp_path):
    (tmp_path / "unguarded.py").write_text(GENERATE.format(option="tensor_parallel_size"))
    assert line(python(str(tmp_path / "unguarded.py"), cwd=tmp_path), "TEXT") == want
    (tmp_path / "guarded.py").write_text(GUARDED)                  # its main is imported: its function reaches rank 1
    assert line(python(str(tmp_path / "guarded.py"), cwd=tmp_path), "RANKS") == "[0, 1]"
