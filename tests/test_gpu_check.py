"""tests/gpu_check.py (`make gpu-check`) on a machine without a GPU: the report, a failing section recorded while
the others run, the racecheck skip, the bandwidth arithmetic, timeouts, --dry-run, and one kernel section for real
in numba's CUDA simulator (its own process, as the script runs it on a GPU)."""
import itertools
import json
import os
import re
import sys
import time
from pathlib import Path

import gpu_check as gc
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gpu_check import CASES, SHAPES, Ctx, Ran, Section

SAMPLE_JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_kernels_gpu" name="test_a" time="0.1"/>
<testcase classname="tests.test_kernels_gpu" name="test_b" time="0.1"><failure message="AssertionError: off by 1">
trace</failure></testcase>
<testcase classname="tests.test_kernels_gpu" name="test_c" time="0"><skipped message="needs a CUDA GPU"/></testcase>
</testsuite></testsuites>"""


def racecheck_output(hazards, errors, warnings):
    return (f"========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: {hazards} hazards displayed "
            f"({errors} errors, {warnings} warnings)\n")


# ----------------------------------------------------------------------------- arithmetic

def test_bytes_and_bandwidth_arithmetic():
    assert gc.gb_per_s(2e9, 0.5) == 4.0
    rng = np.random.default_rng(0)
    s = SHAPES["tiny"]                                        # dim 48, hidden 40, vocab 300, rows 5, group 8
    M, C, N, K, G = s["rows"], s["dim"], s["vocab"], s["dim"], s["group"]
    want = {"gemv": 4 * (N * K + K + N), "matmul_tiled": 4 * (M * C + s["hidden"] * C + M * s["hidden"]),
            "rmsnorm": 4 * (2 * M * C + C),                   # x in, out, weight once
            "add_rmsnorm": 4 * (4 * M * C + C),               # the kernel's own bytes_moved, fused
            "add_then_rmsnorm": 4 * (5 * M * C + C),          # ... and unfused
            "swiglu": 4 * 3 * M * s["hidden"], "swiglu_unfused": 4 * 5 * M * s["hidden"],
            "int8_gemv": N * K + 4 * N + 4 * (K + N),         # int8 weights, a scale per row, x in, y out
            "int4_gemv": N * K // 2 + 4 * N * (K // G) + 4 * (K + N)}
    for name, nbytes in want.items():
        assert CASES[name].nbytes(CASES[name].inputs(s, rng)) == nbytes, name
    a = CASES["paged_attention"].inputs(s, rng)
    ctx, BS = a["context_lens"], s["block"]
    assert CASES["paged_attention"].nbytes(a) == (4 * (2 * s["seqs"] * s["heads"] * s["head_dim"] + 2 * int(ctx.sum())
                                                       * s["kv_heads"] * s["head_dim"])
                                                  + 8 * (s["seqs"] + sum(-(-int(c) // BS) for c in ctx)))


def test_max_rel_err_is_normwise_and_fails_on_nan():
    want = torch.tensor([10.0, -2.0, 0.5])
    assert gc.max_rel_err(want + torch.tensor([0.0, 1e-3, 0.0]), want) == pytest.approx(1e-4, rel=1e-3)  # fp32 1e-3
    assert not gc.max_rel_err(torch.tensor([10.0, float("nan"), 0.5]), want) <= gc.TOL
    with pytest.raises(ValueError, match="shape"):
        gc.max_rel_err(want[:2], want)


def test_time_calls_syncs_around_each_timed_call_and_flushes_outside():
    events, ticks = [], iter(range(100))

    def clock():
        events.append("clock")
        return next(ticks) * 0.5
    times = gc.time_calls(lambda: events.append("fn"), lambda: events.append("sync"), repeats=2, warmup=1,
                          before=lambda: events.append("flush"), clock=clock)
    assert times == [0.5, 0.5]
    timed = ["flush", "sync", "clock", "fn", "sync", "clock"]
    assert events == ["fn", "sync"] + timed + timed


def test_a_fast_but_wrong_kernel_is_caught():
    s = SHAPES["tiny"]

    def right(gate, up):
        return F.silu(gate) * up

    def wrong(gate, up):                                       # silu(gate) * up with a 1% error
        return F.silu(gate) * up * 1.01
    for launch, ok in ((right, True), (wrong, False)):
        r = gc.run_case(CASES["swiglu"], s, "cpu", lambda: None, repeats=2, warmup=0, launch=launch)
        assert r["correct"] is ok and r["status"] == ("ok" if ok else "wrong")
        assert r["kernel_gb_s"] == pytest.approx(r["bytes"] / r["kernel_s"] / 1e9)
        assert r["speed_vs_torch"] == pytest.approx(r["torch_s"] / r["kernel_s"])
    assert r["max_rel_err"] == pytest.approx(0.01, rel=1e-3)


# ----------------------------------------------------------------------------- sections and the report

def fake(result):
    def run(ctx, timeout):
        if isinstance(result, Exception):
            raise result
        return dict(result)
    return run


def test_a_failing_section_is_recorded_and_the_others_still_run(tmp_path):
    out = tmp_path / "sub" / "gpu_check.md"
    sections = [Section("env", "Machine", fake({"status": "ok", "gpu": True, "gpu_name": "Fake GPU"}), 10, False),
                Section("tests", "tests", fake(RuntimeError("pytest exploded")), 10),
                Section("decode", "decode", fake({"status": "ok", "command": "bench", "model": "m", "backend": "cuda",
                                                  "repeats": 3, "steps": 64, "tok_s_median": 123.4, "tok_s_min": 120.0,
                                                  "tok_s_max": 130.0}), 10)]
    report = gc.run_sections(sections, Ctx(tmp_path), {"started": "now", "budget_s": 100, "command": "x",
                                                      "sections": {}}, out, budget_s=100)
    assert [report["sections"][n]["status"] for n in ("env", "tests", "decode")] == ["ok", "error", "ok"]
    assert "RuntimeError: pytest exploded" in report["sections"]["tests"]["error"]
    text = out.read_text()
    assert "# GPU check: Fake GPU" in text and "pytest exploded" in text and "123.4 tok/s median" in text
    raw = json.loads(re.search(r"```json\n(.*)\n```", text, re.S).group(1))
    assert raw["sections"]["decode"]["tok_s_median"] == 123.4


def test_without_a_gpu_or_without_time_the_gpu_sections_are_skipped(tmp_path):
    out = tmp_path / "r.md"
    ran = []
    gpu = Section("kernels", "kernels", lambda ctx, t: ran.append(t) or {"status": "ok"}, 10)
    no_gpu = Section("env", "Machine", fake({"status": "ok", "gpu": False}), 10, False)
    r = gc.run_sections([no_gpu, gpu], Ctx(tmp_path), {"started": "", "budget_s": 1, "command": "", "sections": {}},
                        out, budget_s=100)
    assert r["sections"]["kernels"]["status"] == "skipped" and "no CUDA GPU" in r["sections"]["kernels"]["reason"]
    clock = itertools.chain([0.0, 0.0, 0.0], itertools.repeat(95.0))   # the first section takes 95 of the 100 s
    env = Section("env", "Machine", fake({"status": "ok", "gpu": True}), 10, False)
    r = gc.run_sections([env, gpu], Ctx(tmp_path), {"started": "", "budget_s": 1, "command": "", "sections": {}},
                        out, 100, clock=lambda: next(clock))
    assert r["sections"]["kernels"]["status"] == "skipped" and "budget" in r["sections"]["kernels"]["reason"]
    assert ran == []


def test_every_renderer_on_results_shaped_as_the_sections_make_them(tmp_path):
    """The markdown code runs for real only on a GPU day: here it renders each section's real result shape."""
    junit = tmp_path / "j.xml"
    junit.write_text(SAMPLE_JUNIT)
    tests = {"status": "fail", "files": ["tests/test_kernels_gpu.py"], **gc.parse_junit(junit)}
    case = gc.run_case(CASES["rope"], SHAPES["tiny"], "cpu", lambda: None, 1, 0, launch=CASES["rope"].torch_ref)
    kernels = {"status": "fail", "device": "cuda", "scale": "full", "shape": SHAPES["full"], "repeats": 20,
               "warmup": 3, "l2_flush_bytes": gc.FLUSH_BYTES,
               "cases": [case, {"name": "gemv", "status": "timeout", "error": "timed out", "tail": "..."}]}
    race = {"status": "fail", "sanitizer": "/usr/local/cuda/bin/compute-sanitizer", "version": ["13.0"],
            "shape": SHAPES["tiny"], "cases": [{"name": "gemv", **gc.racecheck_verdict(Ran(0, 2.0, False,
                                                                                           racecheck_output(0, 0, 0)))},
                                               {"name": "softmax", **gc.racecheck_verdict(
                                                   Ran(99, 3.0, False, "Race at softmax_kernel\n" +
                                                       racecheck_output(2, 2, 0)))}]}
    report = {"started": "now", "budget_s": 450, "total_s": 200, "command": "python tests/gpu_check.py",
              "sections": {"env": {"status": "ok", "gpu": True, "gpu_name": "H200", "copy_gb_s": 4000.0,
                                   "numba_error": "ImportError: x"},
                           "tests": tests, "kernels": kernels,
                           "decode": {"status": "error", "error": "bench decode exited with 1", "tail": "Traceback"},
                           "racecheck": race}}
    text = gc.render(report)
    assert "1 passed, 1 failed, 0 errors, 1 skipped" in text and "FAILED tests.test_kernels_gpu::test_b" in text
    assert re.search(r"\| rope \| [\d.]+ \| [\d.]+ \|", text) and "| gemv | | " in text
    assert "| softmax | fail | 2 | 2 | 0 |" in text and "Race at softmax_kernel" in text
    assert "bench decode exited with 1" in text and "numba_error: ImportError" in text
    assert "gemv (timeout): timed out" in text and "- rope: rope.rope_cuda vs" in text


def test_an_unrenderable_report_still_writes_the_raw_results(tmp_path):
    out = tmp_path / "r.md"
    gc.write_report(out, {"sections": {"kernels": {"status": "ok", "cases": "not a list"}}})   # no 'started'
    assert "could not be rendered" in out.read_text() and '"not a list"' in out.read_text()


def test_default_out_follows_OUT():
    assert gc.default_out({"OUT": "/some/where"}) == Path("/some/where/gpu_check.md")
    assert gc.default_out({}) == Path("gpu_check.md")


def test_dry_run_lists_every_section_and_kernel_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "r.md"
    assert gc.main(["--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for name in [s.name for s in gc.SECTIONS] + list(CASES) + ["tests/test_kernels_gpu.py", "--backend cuda"]:
        assert name in text
    assert not out.exists()
    with pytest.raises(SystemExit):
        gc.main(["--sections", "env,nope", "--dry-run"])


# ----------------------------------------------------------------------------- racecheck

def test_racecheck_is_skipped_when_compute_sanitizer_is_missing(tmp_path):
    assert gc.find_sanitizer(env={}, which=lambda name: None, exists=lambda p: False) is None
    at = "/opt/cuda/bin/compute-sanitizer"
    assert gc.find_sanitizer({"CUDA_HOME": "/opt/cuda"}, lambda name: None, lambda p: p == at) == at
    assert gc.find_sanitizer({}, lambda name: "/bin/compute-sanitizer", lambda p: False) == "/bin/compute-sanitizer"
    r = gc.section_racecheck(Ctx(tmp_path, sanitizer=None), 60)
    assert r["status"] == "skipped" and "compute-sanitizer not found" in r["reason"]
    assert list(tmp_path.iterdir()) == []                    # nothing was started


def test_racecheck_verdicts():
    def verdict(rc, out, timed_out=False):
        return gc.racecheck_verdict(Ran(rc, 1.0, timed_out, out))["status"]
    assert verdict(0, racecheck_output(0, 0, 0)) == "pass"
    assert verdict(99, racecheck_output(3, 3, 0)) == "fail"
    assert verdict(0, racecheck_output(1, 0, 1)) == "warn"
    assert verdict(1, racecheck_output(0, 0, 0)) == "error"          # the kernels' process itself failed
    assert verdict(1, "========= Error: Device not supported\n") == "error"   # the tool could not run
    assert verdict(None, "", timed_out=True) == "timeout"


# ----------------------------------------------------------------------------- children and timeouts

def test_a_child_past_its_timeout_is_killed_with_its_own_children(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    t = time.monotonic()
    ran = gc.run_child([sys.executable, "-c", code], 2, tmp_path / "log")
    assert ran.timed_out and ran.rc is None and time.monotonic() - t < 20 and "started" in ran.tail
    grandchild = int(pid_file.read_text())
    for _ in range(50):                                      # the kill reaches the whole group: reaped by init
        if not os.path.exists(f"/proc/{grandchild}") or "Z" in open(f"/proc/{grandchild}/stat").read().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {grandchild} outlived the timeout")


def test_a_child_that_stops_making_progress_is_killed(tmp_path):
    progress = tmp_path / "p.jsonl"
    code = f"import time; open({str(progress)!r}, 'a').write('x\\n'); time.sleep(60)"
    ran = gc.run_child([sys.executable, "-c", code], 60, tmp_path / "log", idle_timeout=1.0, progress=progress)
    assert ran.timed_out and ran.seconds < 20
    assert gc.failed(ran, "it")["status"] == "timeout"


def kernel_runs(outcomes):
    """A stand-in for run_child in section_kernels: per call, a list of case names to report ok (each as one
    JSON line), then how the process ended: a Ran."""
    calls = []

    def run(cmd, timeout, log, env=None, idle_timeout=None, progress=None):
        cases = cmd[cmd.index("--cases") + 1].split(",")
        calls.append(cases)
        ok, ran = outcomes[len(calls) - 1]
        with open(progress, "a") as f:
            for name in cases[:ok]:
                f.write(json.dumps({"name": name, "status": "ok"}) + "\n")
        return ran
    return run, calls


def test_kernel_cases_go_on_in_a_new_process_after_a_crash_or_a_hang(tmp_path, monkeypatch):
    run, calls = kernel_runs([(1, Ran(-11, 1.0, False, "Segmentation fault")),   # dies in the 2nd case
                              (0, Ran(None, 90.0, True, "")),                   # hangs in the 3rd
                              (1, Ran(0, 1.0, False, ""))])
    monkeypatch.setattr(gc, "run_child", run)
    names = ["rmsnorm", "rope", "swiglu", "softmax"]
    r = gc.section_kernels(Ctx(tmp_path), 600, cases=names)
    assert calls == [names, names[2:], names[3:]]
    assert [c["status"] for c in r["cases"]] == ["ok", "error", "timeout", "ok"] and r["status"] == "fail"
    assert r["cases"][1]["error"] == "the kernel process exited with -11 during this case"
    assert "Segmentation fault" in r["cases"][1]["tail"]


def test_kernel_processes_that_never_finish_a_case_stop_the_section(tmp_path, monkeypatch):
    run, calls = kernel_runs([(0, Ran(1, 1.0, False, "ImportError: no numba"))] * 5)
    monkeypatch.setattr(gc, "run_child", run)
    r = gc.section_kernels(Ctx(tmp_path), 600, cases=["rmsnorm", "rope", "swiglu", "softmax"])
    assert len(calls) == 2 and [c["status"] for c in r["cases"]] == ["error", "error", "skipped", "skipped"]


FAKE_GPU_TESTS = """import sys
import pytest


@pytest.mark.gpu
def test_minillm_imports_from_the_source_tree():
    # as on the GPU machine: this checkout on PYTHONPATH and no pip install, so no editable finder to map
    # minillm.kernels to kernels/ (without gpu_check.use_source_tree, `import minillm` fails there)
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    import minillm.kernels.matmul as m
    assert m.__file__ == {matmul!r}


@pytest.mark.gpu
def test_bad():
    assert 1 == 2, "off by one"


@pytest.mark.gpu
def test_skip():
    pytest.skip("needs a CUDA GPU")


def test_not_gpu():
    pass
"""


def test_the_tests_section_runs_pytest_on_the_uninstalled_source_tree_and_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")   # this venv's notebook plugins take seconds to load
    f = tmp_path / "test_fake_gpu.py"
    f.write_text(FAKE_GPU_TESTS.format(matmul=str(gc.ROOT / "kernels" / "matmul.py")))
    r = gc.section_tests(Ctx(tmp_path), 120, files=[str(f)])
    assert (r["passed"], r["failed"], r["errors"], r["skipped"]) == (1, 1, 0, 1) and r["status"] == "fail", r
    assert "off by one" in r["failures"][0]["message"] and r["skips"][0]["message"].endswith("needs a CUDA GPU")


def test_gpu_test_files_are_found_by_their_marker():
    assert "tests/test_kernels_gpu.py" in gc.gpu_test_files()
    assert "tests/test_gpu_check.py" not in gc.gpu_test_files()


# ----------------------------------------------------------------------------- the source tree, uninstalled

def test_the_source_tree_maps_what_pyproject_maps():
    tomllib = pytest.importorskip("tomllib")
    dirs = tomllib.loads((gc.ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert gc.PACKAGE_DIRS == {k: v for k, v in dirs.items() if k != "minillm"}
    spec = gc.SourceTree().find_spec("minillm.kernels")
    assert Path(spec.origin) == gc.ROOT / "kernels" / "__init__.py"
    assert spec.submodule_search_locations == [str(gc.ROOT / "kernels")]
    assert gc.SourceTree().find_spec("numpy") is None


def test_bench_decode_takes_the_cuda_backend():
    """The parser accepts --backend cuda (argparse would exit 2); without a GPU the backend says what it needs."""
    from minillm.kernels import gpu_available

    from minillm.bench.cli import main
    if gpu_available():
        pytest.skip("a GPU is here: make gpu-check runs this bench for real")
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA GPU"):
        main(["decode", "--model", "random:tiny", "--backend", "cuda", "--quick"])


# ----------------------------------------------------------------------------- one section for real, simulated

def test_a_kernel_section_in_the_cuda_simulator(tmp_path):
    """The kernels child as make gpu-check starts it, on CPU tensors in numba's simulator (device='cpu'): checked
    against torch and timed. RoPE only: the cheapest to simulate (every simulated thread is a Python thread); the
    others were run this way once, at the same shapes, when this check was written."""
    r = gc.section_kernels(Ctx(tmp_path), 300, cases=["rope"], device="cpu", scale="tiny", repeats=2, warmup=0)
    assert r["status"] == "ok", r
    for c in r["cases"]:
        assert c["correct"] and c["max_rel_err"] <= gc.TOL and len(c["kernel_s_all"]) == 2
        case = CASES[c["name"]]
        assert c["bytes"] == case.nbytes(case.inputs(SHAPES["tiny"], np.random.default_rng(0)))
