"""The student package runs outside the repository (issue 37): the built wheel holds the shipped models; the student
zip holds the notebooks without solutions or self-check answers, the wheel and a README; unzipped in a temporary
folder and installed in a fresh venv (this torch: TORCH_SPEC, as the Makefile pins it), notebook 00 runs there with a
student's solutions in it, and `minillm grade` scores a core exercise, failed while stubbed and passed once done.
No checkout is on the path: PYTHONPATH is unset and every command runs in the temporary folder.
About 90 s (a venv, torch from the local index, the wheel's dependencies): `make test-dist`."""
import json
import os
import shlex
import subprocess
import sys
import zipfile

import pytest

from minillm.labs.dist import write_student_zip

pytestmark = pytest.mark.dist
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SHIPPED = ["minillm/models/shakespeare.bin", "minillm/models/tokenizer.bin", "minillm/models/val_slice.txt",
           "minillm/models/shakespeare-draft.bin", "minillm/models/lora/comedies/adapter_model.safetensors"]
CORE = "02_kv_cache.ipynb"                       # its core exercise: check_cached_attention


def run(cmd: list, cwd, timeout=600, ok=True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(cmd, cwd=cwd, env={**env, "MINILLM_PROGRESS": "0"}, capture_output=True, text=True,
                       timeout=timeout)
    if ok:
        assert r.returncode == 0, f"{cmd}: {r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    build = tmp_path_factory.mktemp("build")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ROOT, "-w", str(build)],
        cwd=build)
    wheel = next(str(build / n) for n in os.listdir(build) if n.endswith(".whl"))
    out = str(build / "minillm-student.zip")
    write_student_zip(out, wheel, os.path.join(ROOT, "notebooks"))
    return wheel, out


def test_the_wheel_holds_the_shipped_models(package):
    wheel, _ = package
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(SHIPPED) <= names, set(SHIPPED) - names
    assert os.path.getsize(wheel) > 30e6                        # the models themselves, not pointers to them


def test_the_zip_has_no_solutions_nor_answers_and_refuses_to_overwrite(package):
    wheel, out = package
    z = zipfile.ZipFile(out)
    notebooks = [n for n in z.namelist() if n.endswith(".ipynb")]
    assert len(notebooks) == len([n for n in os.listdir(os.path.join(ROOT, "notebooks")) if n.endswith(".ipynb")])
    assert {"README.md", os.path.basename(wheel)} <= set(z.namelist())
    assert not [n for n in z.namelist() if "teachers" in n or "Instructor notes" in z.read(n).decode(errors="ignore")]
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("teachers")]   # the instructor notes
    for n in notebooks:
        text = z.read(n).decode()
        assert "BEGIN SOLUTION" not in text and "<summary>Answer" not in text and "YOUR CODE HERE" in text, n
        assert all(not c.get("outputs") for c in json.loads(text)["cells"]), n
    with pytest.raises(ValueError, match="exists: pass --force"):
        write_student_zip(out, wheel, os.path.join(ROOT, "notebooks"))


def test_unzipped_elsewhere_it_installs_runs_notebook_00_and_grades(package, tmp_path):
    wheel, out = package
    zipfile.ZipFile(out).extractall(tmp_path)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = str(venv / "bin" / "python")
    torch_spec = os.environ.get("TORCH_SPEC", "torch==2.13.0")
    run([py, "-m", "pip", "install", "-q", *shlex.split(os.environ.get("TORCH_PIP_ARGS", "")), torch_spec, "numpy"],
        cwd=tmp_path)
    run([py, "-m", "pip", "install", "-q", f"{tmp_path / os.path.basename(wheel)}[student]", "nbconvert",
         "ipykernel"], cwd=tmp_path)
    where = run([py, "-c", "import minillm; print(minillm.__file__)"], cwd=tmp_path).stdout
    assert str(venv) in where and ROOT not in where                  # the installed package, not the checkout

    teacher = {n: json.load(open(os.path.join(ROOT, "notebooks", n))) for n in ("00_tour.ipynb", CORE)}
    solved = tmp_path / "solved"
    solved.mkdir()
    for name, nb in teacher.items():                                  # a student who did every exercise
        student = json.load(open(tmp_path / "notebooks" / name))
        for mine, theirs in zip(student["cells"], nb["cells"]):
            if mine["cell_type"] == "code" and "YOUR CODE HERE" in "".join(mine["source"]):
                mine["source"] = theirs["source"]
        json.dump(student, open(solved / name, "w"))
    run([str(venv / "bin" / "jupyter"), "nbconvert", "--to", "notebook", "--execute", "00_tour.ipynb",
         "--output", "executed.ipynb"], cwd=solved)
    executed = json.load(open(solved / "executed.ipynb"))
    assert not [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]

    os.remove(solved / "00_tour.ipynb")
    os.remove(solved / "executed.ipynb")
    graded = run([py, "-m", "minillm", "grade", str(solved), "--json"], cwd=tmp_path)
    rows = json.loads(graded.stdout)
    assert rows and all(r["passed"] for r in rows) and any(r["kind"] == "core" for r in rows)
    stub = tmp_path / "stub"
    stub.mkdir()
    os.rename(tmp_path / "notebooks" / CORE, stub / CORE)
    failed = run([py, "-m", "minillm", "grade", str(stub), "--json"], cwd=tmp_path, ok=False)
    assert failed.returncode == 1
    assert all(not r["passed"] and "NotImplementedError" in r["message"] for r in json.loads(failed.stdout))
