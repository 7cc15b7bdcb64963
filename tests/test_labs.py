"""The labs' machinery: the guard around a reader's code, the grade command, show_source."""
import json
import os
import time

import pytest
import torch

from minillm.labs import CHECKERS, checker, common
from minillm.labs.grade import find_exercises, grade_notebook, score_sheet
from minillm.labs.grade import main as grade_main


@pytest.fixture
def probe():
    """A throwaway core checker: calls fn(x) and wants x + 1 back."""
    @checker(kind="core", signature="x")
    def check_probe(fn):
        got = fn(torch.arange(3.0))
        assert torch.as_tensor(got).shape == (3,), f"shape {tuple(torch.as_tensor(got).shape)}, expected (3,)"
        assert torch.equal(torch.as_tensor(got), torch.arange(3.0) + 1), "values differ from x + 1"
        return "x + 1"
    yield check_probe
    CHECKERS.pop("check_probe")


def test_guard_turns_every_kind_of_bad_code_into_a_fail(probe, monkeypatch):
    assert probe(lambda x: x + 1).passed
    assert repr(probe(lambda x: x + 1)) == "check_probe (core): pass: x + 1"

    def raises(x):
        raise ZeroDivisionError("oops")
    cases = {
        "ZeroDivisionError: oops": raises,
        "shape (4,), expected (3,)": lambda x: torch.zeros(4),
        "wrong signature": lambda x, y: x,
        "expected a function or class, got NoneType": None,
        "not implemented yet": lambda x: (_ for _ in ()).throw(NotImplementedError()),
    }
    for want, fn in cases.items():
        result = probe(fn)
        assert not result.passed and want in result.message, (want, result)
        assert repr(result).startswith("check_probe (core): fail: ")

    monkeypatch.setattr(common, "LIMIT_S", 0.3)

    def hangs(x):
        while True:
            try:
                time.sleep(0.01)
            except Exception:       # a reader's broad except must not swallow the time limit
                pass
    start = time.perf_counter()
    result = probe(hangs)
    assert not result.passed and "timed out" in result.message
    assert time.perf_counter() - start < 5


def test_guard_leaves_no_state_behind(probe):
    torch.manual_seed(0)
    before = torch.get_rng_state()
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()

    def vandal(x):
        torch.manual_seed(123)
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        torch.set_num_threads(1)
        raise RuntimeError("and then it crashed")
    assert not probe(vandal).passed
    assert torch.equal(torch.get_rng_state(), before) and torch.get_default_dtype() == dtype
    assert torch.is_grad_enabled() and torch.get_num_threads() == threads
    assert probe(lambda x: x + 1).passed          # the next attempt starts clean


def test_run_limited_off_the_main_thread():
    import threading
    box = {}

    def worker():
        try:
            common.run_limited(lambda: time.sleep(5), seconds=0.2)
        except common.TimeLimit:
            box["timed out"] = True
        box["value"] = common.run_limited(lambda: 7, seconds=2)
    t = threading.Thread(target=worker)
    t.start()
    t.join(10)
    assert box == {"timed out": True, "value": 7}


def test_checker_kinds():
    kinds = {run.kind for run in CHECKERS.values()}
    assert kinds <= {"warm-up", "core"}
    with pytest.raises(ValueError, match="kind"):
        checker(kind="bonus")


def _notebook(*cells):
    return {"cells": [{"cell_type": "code", "source": src, "metadata": {}, "outputs": []} for src in cells],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_grade_finds_exercises_and_scores_them(tmp_path, probe):
    good = _notebook("import torch\n\ndef my_inc(x):\n    return x + 1\n", "check_probe(my_inc)")
    bad = _notebook("x = 1\n", "def my_inc(x):\n    raise NotImplementedError()\n", "check_probe(my_inc)",
                    "def broken(x):\n    return x\nraise SystemExit('cell crashed')\n", "check_probe(broken)",
                    "check_probe(undefined)", "check_nonexistent(my_inc)")
    assert [e[:2] for e in find_exercises(bad)] == [("check_probe", "my_inc"), ("check_probe", "broken"),
                                                    ("check_probe", "undefined"), ("check_nonexistent", "my_inc")]
    for name, nb in [("a_good.ipynb", good), ("b_bad.ipynb", bad)]:
        (tmp_path / name).write_text(json.dumps(nb))
    rows = grade_notebook(str(tmp_path / "a_good.ipynb"), isolate=False) + \
        grade_notebook(str(tmp_path / "b_bad.ipynb"), isolate=False)             # check_probe lives in this process
    assert [r["passed"] for r in rows] == [True, False, False, False, False]
    messages = [r["message"] for r in rows[1:]]
    assert "not implemented" in messages[0]
    assert "the exercise cell raised SystemExit: cell crashed" in messages[1]
    assert "no code cell above the check defines undefined" in messages[2]
    assert "no checker named check_nonexistent" in messages[3]
    sheet = score_sheet(rows)
    assert "core: 1/4 passed" in sheet and "b_bad.ipynb" in sheet


def test_grade_command_errors(tmp_path, capsys):
    assert grade_main([str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert grade_main([str(tmp_path)]) == 2
    assert "no .ipynb notebooks" in capsys.readouterr().err


def test_show_source_lists_the_engine_code():
    from minillm.viz import show_source

    from minillm.core.block_manager import BlockManager
    listing = show_source(BlockManager.allocate)
    assert listing.path == os.path.join("minillm", "core", "block_manager.py")
    text = repr(listing)
    assert text.splitlines()[0].startswith(f"{listing.path}:{listing.first}-{listing.last}  BlockManager.allocate")
    assert f"{listing.first}  " in text.splitlines()[1] and "def allocate" in text.splitlines()[1]
    cut = show_source(BlockManager, start="def fork", end="return", max_lines=5)
    assert cut.lines[0].strip().startswith("def fork") and len(cut.lines) <= 5
    assert "<code>" in cut._repr_html_()
    with pytest.raises(ValueError, match="start='no such line'"):
        show_source(BlockManager, start="no such line")


def test_warm_up_checkers_name_the_common_mistake():
    from minillm.labs.nb00_tour import _top_p_inclusive, _top_p_unnormalised
    from minillm.labs.nb01_model import _rope_rotate_half
    def int8_no_zero_rows(w):
        scale = float(w.abs().max() / 127)
        return torch.round(w / scale).to(torch.int8), scale
    said = {
        "an all-zero row": CHECKERS["check_quantize_int8_row"](int8_no_zero_rows),
        "rotate_half layout": CHECKERS["check_rope"](lambda x, pos, theta: _rope_rotate_half(x, pos, theta).float()),
        "that is LayerNorm": CHECKERS["check_rmsnorm"](
            lambda x, w, eps: torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=eps) * w),
        "inclusive cumsum": CHECKERS["check_top_p"](_top_p_inclusive),
        "renormalise": CHECKERS["check_top_p"](_top_p_unnormalised),
        "multiplied the logits by T": CHECKERS["check_temperature_softmax"](lambda x, t: torch.softmax(x * t, -1)),
    }
    for mistake, result in said.items():
        assert not result.passed and mistake in result.message, (mistake, result)
    wrong = CHECKERS["check_temperature_softmax"](lambda x, t: torch.softmax(x, -1))   # no mistake we know: the error
    assert not wrong.passed and "max abs error" in wrong.message


def test_grade_csv_has_a_row_per_student_folder_and_a_column_per_exercise(tmp_path, probe, capsys, monkeypatch):
    import csv
    import io

    import minillm.kernels
    monkeypatch.setattr(minillm.kernels, "use_simulator", lambda on: None)   # numba.cuda is this process's already
    good = _notebook("def my_inc(x):\n    return x + 1\n", "check_probe(my_inc)")
    stub = _notebook("def my_inc(x):\n    raise NotImplementedError()\n", "check_probe(my_inc)")
    for student, nb in [("alice", good), ("bob", stub)]:
        (tmp_path / student).mkdir()
        (tmp_path / student / "01_lab.ipynb").write_text(json.dumps(nb))
    assert grade_main([str(tmp_path / "alice"), str(tmp_path / "bob"), "--csv", "--in-process"]) == 1   # bob fails
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["folder", "01_lab.ipynb:check_probe", "core_passed", "warmup_passed"]
    assert [r[:2] for r in rows[1:]] == [[str(tmp_path / "alice"), "pass"], [str(tmp_path / "bob"), "fail"]]
    assert grade_main([str(tmp_path / "alice"), "--csv", "--in-process"]) == 0
