"""Every notebook exercise: its checker passes on the notebook's solution and fails on the student stub."""
import glob
import json
import os
import re

import pytest

from minillm.labs import CHECKERS
from minillm.labs.student import strip_solutions, student_notebook

NB_DIR = os.path.join(os.path.dirname(__file__), "..", "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NB_DIR, "*.ipynb")))
CALL = re.compile(r"\b(check_\w+)\((\w+)\)")


def exercises():
    """(notebook, solution cell source, checker name, function name) for each exercise."""
    found = []
    for path in NOTEBOOKS:
        cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
        for i, cell in enumerate(cells):
            src = "".join(cell["source"])
            if "### BEGIN SOLUTION" not in src:
                continue
            calls = [CALL.search("".join(c["source"])) for c in cells[i + 1:i + 3]]
            call = next((m for m in calls if m), None)
            assert call, f"{os.path.basename(path)}: solution cell {i} is not followed by a check_...(fn) cell"
            found.append(pytest.param(src, call.group(1), call.group(2),
                                      id=f"{os.path.basename(path)}:{call.group(1)}"))
    return found


EXERCISES = exercises()


def test_there_are_notebooks_with_two_exercises_each():
    assert NOTEBOOKS, "no notebooks found"
    for path in NOTEBOOKS:
        src = open(path).read()
        assert src.count("### BEGIN SOLUTION") >= 2, f"{os.path.basename(path)} has fewer than two exercises"


@pytest.mark.parametrize("src,checker,fn_name", EXERCISES)
def test_checker_passes_solution_and_fails_stub(src, checker, fn_name):
    check = CHECKERS[checker]
    ns = {}
    exec(compile(src, "<solution>", "exec"), ns)
    result = check(ns[fn_name])
    assert result.passed, repr(result)
    stub_ns = {}
    exec(compile(strip_solutions(src), "<stub>", "exec"), stub_ns)
    result = check(stub_ns[fn_name])
    assert not result.passed and "not implemented" in result.message, repr(result)
    assert result.kind == check.kind and check.kind in ("warm-up", "core")


def test_every_checker_is_used_by_a_notebook():
    used = {p.values[1] for p in EXERCISES}
    assert set(CHECKERS) <= used, f"checkers no notebook uses: {set(CHECKERS) - used}"


def test_checkers_fail_on_wrong_answers():
    """A stub is not the only failure: plausible mistakes fail too."""
    import torch
    assert not CHECKERS["check_temperature_softmax"](lambda x, t: torch.softmax(x * t, -1))  # multiplied, not divided
    assert not CHECKERS["check_rmsnorm"](lambda x, w, eps: x / x.pow(2).mean(-1, keepdim=True).sqrt() * w + eps)
    # MHA formula under GQA
    assert not CHECKERS["check_kv_cache_bytes"](lambda cfg, n, b: 2 * cfg.n_layers * cfg.dim * n * b)
    assert not CHECKERS["check_slot_mapping"](lambda table, pos, bs: [table[0] * bs + p for p in pos])
    assert not CHECKERS["check_top_p"](lambda probs, p: probs)
    assert not CHECKERS["check_rope"](lambda x, pos, theta: x)
    assert not CHECKERS["check_global_reads"](lambda M, K, N, tile: (M * K * N, N * K * M))        # the naive kernel's
    assert not CHECKERS["check_online_softmax_update"](                                         # no rescale of d
        lambda m, d, x: (max(m, x), d + __import__("math").exp(x - max(m, x))))
    assert not CHECKERS["check_residual"](lambda p, q: (p - q).clamp_min(0))                   # not normalised
    assert not CHECKERS["check_ngram_lookup"](lambda t, k, n: next((t[i + n:i + n + k] for i in range(len(t) - n)
                                                                     if t[i:i + n] == t[-n:]), []))  # earliest match
    import numpy as np
    assert not CHECKERS["check_combine_splits"](lambda outs, lses: np.mean(outs, axis=0))       # ignores the lses
    assert not CHECKERS["check_smooth_factor"](lambda a, w, alpha: a ** alpha / w ** alpha)     # exponent of w wrong
    assert not CHECKERS["check_quantize_int8_row"](                                              # scale by 255, not 127
        lambda w: (torch.round(w / (w.abs().max() / 255)).to(torch.int8), float(w.abs().max() / 255)))

    ns = {}   # a kernel as a notebook cell defines it: `cuda` is a global of the cell
    exec("from numba import cuda\n"
         "def no_bounds_guard(x, scale, weight, out):\n"
         "    n, m = cuda.grid(2)\n"
         "    out[m, n] = x[m, n] * scale[m] * weight[n]\n", ns)
    result = CHECKERS["check_scale_rows_kernel"](ns["no_bounds_guard"])
    assert not result and "a thread past the edge must do nothing" in result.message


def test_student_edition_removes_solutions_and_outputs():
    for path in NOTEBOOKS:
        nb = student_notebook(json.load(open(path)))
        text = json.dumps(nb)
        assert "BEGIN SOLUTION" not in text and "raise NotImplementedError()" in text
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")


def test_strip_keeps_indentation_and_rejects_unbalanced():
    src = "def f(x):\n    y = 1\n    ### BEGIN SOLUTION\n    return x + y\n    ### END SOLUTION\n"
    assert strip_solutions(src) == "def f(x):\n    y = 1\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
    with pytest.raises(ValueError, match="unbalanced"):
        strip_solutions("### BEGIN SOLUTION\nx = 1\n")


def test_every_lesson_has_a_core_exercise_and_opens_the_engine():
    """Notebooks 01-09: at least one core exercise (plugged into the engine), and a "read the engine's
    code" cell whose stored listing shows 20-60 of the engine's lines (00, the tour, shows one step); a shorter
    listing beside it (10 lines at least: 03's plain-loop twin of the tiled matmul) may read the idea first."""
    header = re.compile(r"^(\S+):(\d+)-(\d+)  \S+ \((\d+) lines")
    for path in NOTEBOOKS:
        name = os.path.basename(path)
        cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
        checks = {m.group(1) for c in cells for m in CALL.finditer("".join(c["source"]))}
        listings = [header.match("".join(o.get("data", {}).get("text/plain", "")))
                    for c in cells if "show_source(" in "".join(c["source"]) for o in c["outputs"]]
        listings = [m for m in listings if m]
        assert listings, f"{name}: no show_source cell with a stored listing (run the notebook)"
        for m in listings:
            assert os.path.exists(os.path.join(NB_DIR, "..", m.group(1))), f"{name}: listing of {m.group(1)}"
            assert 10 <= int(m.group(4)) <= 60, f"{name}: listing of {m.group(1)} has {m.group(4)} lines"
        low = 10 if name.startswith("00_") else 20
        assert any(int(m.group(4)) >= low for m in listings), f"{name}: no listing of {low} lines or more"
        if not name.startswith("00_"):
            assert any(CHECKERS[c].kind == "core" for c in checks), f"{name} has no core exercise"


def test_grading_an_untouched_student_edition_fails_every_exercise(tmp_path):
    from minillm.labs.grade import grade_notebook
    for path in NOTEBOOKS:
        (tmp_path / os.path.basename(path)).write_text(json.dumps(student_notebook(json.load(open(path)))))
    rows = [r for path in NOTEBOOKS for r in grade_notebook(str(tmp_path / os.path.basename(path)))]
    assert len(rows) == len(EXERCISES)
    for r in rows:
        assert not r["passed"] and "not implemented" in r["message"], r


def test_no_listing_above_a_core_exercise_shows_its_answer_in_the_student_edition():
    """A "Read the engine's code" listing that shows a core exercise's solution lines comes after its checker in
    the student edition (minillm.labs.listings), with a line where it was; the teacher's notebook keeps its order."""
    from minillm.labs.listings import ANSWER_LINES, CALL, MOVED, giveaways, listing_lines, shown, solution_lines
    core = {k for k, run in CHECKERS.items() if run.kind == "core"}
    moved = 0
    for path in NOTEBOOKS:
        teacher = json.load(open(path))
        listing_of = {"".join(c["source"]): listing_lines(c) for c in teacher["cells"] if c["cell_type"] == "code"}
        solution_of = {name: solution_lines("".join(c["source"])) for c in teacher["cells"] for name in
                       re.findall(r"^(?:def|class)\s+(\w+)", "".join(c["source"]), re.M)}
        student = [("".join(c["source"]), c["cell_type"]) for c in student_notebook(teacher)["cells"]]
        assert len(student) == len(teacher["cells"]) + len(giveaways(teacher, core))      # one note per move
        moved += sum(src == MOVED for src, _ in student)
        for i, (src, _) in enumerate(student):
            for check, name in CALL.findall(src):
                if check in core:
                    above = [listing_of.get(s, []) for s, kind in student[:i] if "show_source(" in s]
                    worst = max([shown(solution_of.get(name, set()), lines) for lines in above], default=0)
                    assert worst < ANSWER_LINES, f"{os.path.basename(path)}: a listing above {check} shows its answer"
    assert moved >= 4                                                      # 03, 06, 08 and 15 move theirs
