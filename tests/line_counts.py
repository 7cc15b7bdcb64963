"""The size of the minimal engine, measured (issue 34's goals): `python tests/line_counts.py [--json]`.

- lines of core/ + engine/ + llama/ (Python, blank and comment lines included);
- files over 400 lines in the package, kernels/ and viz/;
- engine.py's lines and LLMEngine.step()'s (with the loop body it calls, advance());
- the distinct lines one greedy decode step runs: torch backend, the shipped model, 3 requests, counted with
  sys.settrace over the repository's own files (the step after the prefill, outputs built as step() builds them).
"""
from __future__ import annotations

import collections
import inspect
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LIMIT = 400


def py_files(*folders):
    for folder in folders:
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            yield from (os.path.join(dirpath, f) for f in files if f.endswith(".py"))


def lines(path: str) -> int:
    with open(path) as f:
        return sum(1 for _ in f)


def step_lines(requests: int = 3) -> tuple[int, dict]:
    """Distinct (file, line) pairs one greedy decode step of `requests` sequences runs, and per file."""
    from minillm import LLM, SamplingParams
    engine = LLM("shakespeare", backend="torch").engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for prompt in ["ROMEO:", "JULIET:", "Now is the winter"][:requests]:
        engine.add_request(prompt, params)
    engine.step()                                    # the prefill
    engine.step()                                    # a first decode: lazily built things are built
    seen = set()

    def trace(frame, event, arg):
        name = frame.f_code.co_filename
        if not name.startswith(ROOT) or "site-packages" in name:
            return None
        if event == "line":
            seen.add((name, frame.f_lineno))
        return trace
    sys.settrace(trace)
    try:
        engine.step()
    finally:
        sys.settrace(None)
    per_file = collections.Counter(os.path.relpath(f, ROOT) for f, _ in seen)
    return len(seen), dict(per_file.most_common())


def measure() -> dict:
    from minillm.engine.engine import LLMEngine
    core = {f: lines(f) for f in py_files("minillm/core", "minillm/engine", "minillm/llama")}
    every = {os.path.relpath(f, ROOT): lines(f) for f in py_files("minillm", "kernels", "viz")}
    n, per_file = step_lines()
    return {"core_engine_llama_lines": sum(core.values()),
            "files_over_limit": {f: n for f, n in sorted(every.items()) if n > LIMIT},
            "engine_py_lines": lines(os.path.join(ROOT, "minillm", "engine", "engine.py")),
            "step_lines": len(inspect.getsource(LLMEngine.step).splitlines()),
            "advance_lines": len(inspect.getsource(LLMEngine.advance).splitlines()),
            "greedy_step_distinct_lines": n, "greedy_step_files": len(per_file), "greedy_step_per_file": per_file}


if __name__ == "__main__":
    res = measure()
    if "--json" in sys.argv:
        print(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")
