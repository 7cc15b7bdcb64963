"""The grader's fences (issue 41): the exploits a reviewer found, each failing with a message that names it, and
nothing one exercise does reaching the next (each runs in its own process: minillm.labs.isolate)."""
import json

from minillm.labs.grade import grade_notebook

SOFTMAX = ("import torch\n\ndef my_temperature_softmax(logits, temperature):\n"
           "    z = logits / temperature\n    return torch.softmax(z, -1)\n")
STUB_TOP_P = "def my_top_p(probs, p):\n    raise NotImplementedError()\n"
CHECKS = ["check_temperature_softmax(my_temperature_softmax)", "check_top_p(my_top_p)"]


def grade(tmp_path, *cells) -> list:
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "00_tour.ipynb").write_text(json.dumps(nb))
    return [(r["passed"], r["message"]) for r in grade_notebook(str(tmp_path / "00_tour.ipynb"))]


def test_an_honest_answer_passes_and_a_stub_fails(tmp_path):
    (ok, _), (stub, why) = grade(tmp_path, SOFTMAX, CHECKS[0], STUB_TOP_P, CHECKS[1])
    assert ok and not stub and "not implemented" in why


def test_a_cell_that_replaces_later_checkers_fails_and_they_stay_real(tmp_path):
    """The reviewer's five lines: every later checker replaced by one that passes anything."""
    hack = SOFTMAX + ("import minillm.labs as L\nfrom minillm.labs.common import ExerciseResult\n"
                      "for name in list(L.CHECKERS):\n"
                      "    L.CHECKERS[name] = lambda fn, n=name: ExerciseResult(n, True, 'ok')\n"
                      "    setattr(L, name, L.CHECKERS[name])\n")
    (first, why), (later, why_later) = grade(tmp_path, hack, CHECKS[0], STUB_TOP_P, CHECKS[1])
    assert not first and ("imports minillm.labs" in why or "changed minillm.labs" in why)
    assert not later and "not implemented" in why_later                  # the next exercise's checker is real


def test_patching_the_checker_or_torch_fails_naming_what_changed(tmp_path):
    allowed_import = "from minillm.labs import check_top_p\n"
    patch_torch = SOFTMAX + allowed_import + "import torch\ntorch.allclose = lambda *a, **k: True\n"
    (passed, why), _ = grade(tmp_path, patch_torch, CHECKS[0], STUB_TOP_P, CHECKS[1])
    assert not passed and "changed torch.allclose" in why
    patch_labs = SOFTMAX + "import sys\nsys.modules['minillm.labs.nb00_tour']._close = lambda *a, **k: None\n"
    (passed, why), _ = grade(tmp_path, patch_labs, CHECKS[0], STUB_TOP_P, CHECKS[1])
    assert not passed and "changed minillm.labs.nb00_tour._close" in why


def test_the_engines_own_implementation_is_not_an_answer(tmp_path):
    imported = SOFTMAX + "from minillm.core.sampling import apply_penalties as my_top_p\n"
    (passed, why), _ = grade(tmp_path, imported, CHECKS[0], STUB_TOP_P, CHECKS[1])
    assert not passed and "imports minillm.core.sampling.apply_penalties" in why
    dynamic = "my_top_p = __import__('minillm.core.sampling').core.sampling.apply_penalties\n"
    _, (passed, why) = grade(tmp_path, SOFTMAX, CHECKS[0], dynamic, CHECKS[1])
    assert not passed and "__import__" in why


def test_a_checker_refuses_an_engine_function_handed_in_directly():
    from minillm.core.sampling import apply_penalties
    from minillm.labs import check_top_p
    result = check_top_p(apply_penalties)
    assert not result.passed and "minillm's own (from minillm.core.sampling)" in result.message


def test_a_cell_that_ends_the_interpreter_fails_that_exercise_only(tmp_path):
    (passed, why), (later, why_later) = grade(tmp_path, "import os\nos._exit(3)\n" + SOFTMAX, CHECKS[0],
                                              STUB_TOP_P, CHECKS[1])
    assert not passed and "process died (exit code 3)" in why
    assert not later and "not implemented" in why_later                  # graded on, in a process of its own
