"""The CLI: `run` prints exactly what llama2.c's run.c prints (golden files made by run.c itself)."""
import json
import subprocess
import sys

import pytest

from minillm.__main__ import main
from minillm.core.sampling import RunCSampler

GOLDEN = [  # file, run.c arguments (see tests/data/README.md)
    ("golden_greedy.txt", ["-t", "0", "-n", "0", "-i", "Hamlet"]),
    ("golden_sampled.txt", ["-t", "1.0", "-p", "0.9", "-s", "1234", "-n", "100", "-i", "To be, or not to be"]),
    ("golden_empty.txt", ["-t", "0", "-n", "50"]),
]


@pytest.mark.parametrize("golden,args", GOLDEN, ids=[g for g, _ in GOLDEN])
def test_run_is_byte_identical_to_runc(data_dir, golden, args, capfdbinary):
    rc = main(["run", f"{data_dir}/golden.bin", "-z", f"{data_dir}/golden_tok.bin", *args])
    out, err = capfdbinary.readouterr()
    assert rc == 0
    assert out == open(f"{data_dir}/{golden}", "rb").read()
    assert err.startswith(b"achieved tok/s: ")


def test_run_subprocess_and_bad_file(data_dir, tmp_path):
    r = subprocess.run([sys.executable, "-m", "minillm", "run", f"{data_dir}/golden.bin",
                        "-z", f"{data_dir}/golden_tok.bin", "-t", "0", "-n", "0", "-i", "Hamlet"], capture_output=True)
    assert r.returncode == 0 and r.stdout == open(f"{data_dir}/golden_greedy.txt", "rb").read()
    open(tmp_path / "cut.bin", "wb").write(open(f"{data_dir}/golden.bin", "rb").read()[:1000])
    r = subprocess.run([sys.executable, "-m", "minillm", "run", str(tmp_path / "cut.bin"),
                        "-z", f"{data_dir}/golden_tok.bin"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cut.bin: expected 179868 bytes" in r.stderr and "found 1000" in r.stderr


def test_runc_sampler_coins_match_xorshift():
    """First coins of run.c's xorshift64* for seed 42, computed with Python integers."""
    state, want = 42, []
    for _ in range(5):
        state ^= state >> 12
        state ^= (state << 25) & (2**64 - 1)
        state ^= state >> 27
        want.append((((state * 0x2545F4914F6CDD1D) & (2**64 - 1)) >> 32 >> 8) / 16777216.0)
    s = RunCSampler(1.0, 0.9, 42)
    assert [float(s.random_f32()) for _ in range(5)] == want


def test_generate_command(capsys):
    rc = main(["generate", "--model", "random:tiny", "--prompt", "Hamlet", "--temperature", "0", "--max-tokens", "5"])
    assert rc == 0 and capsys.readouterr().out.startswith("Hamlet")
    rc = main(["generate", "--model", "random:tiny", "--prompt", "x", "--top-p", "2"])
    assert rc == 2 and "SamplingParams.top_p" in capsys.readouterr().err


def test_bench_decode_quick_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "decode", "--model", "random:tiny", "--steps", "16", "--repeats", "2",
                 "--json", str(out)]) == 0
    res = json.load(open(out))
    assert res["steps"] == 16 and res["tok_s_min"] > 0 and len(res["tok_s_all"]) == 2
    assert res["tok_s_min"] <= res["tok_s_median"] <= res["tok_s_max"]


def test_generate_takes_every_engine_option_with_dashes(capsys):
    import argparse
    from dataclasses import fields

    from minillm.__main__ import engine_flags
    from minillm.config import EngineConfig
    ap = argparse.ArgumentParser()
    engine_flags(ap)
    names = {a.dest for a in ap._actions}
    assert {f.name for f in fields(EngineConfig)} - {"tokenizer"} <= names
    rc = main(["generate", "--model", "random:tiny", "--prompt", "x", "--max-tokens", "2", "--block-size", "8",
               "--max-model-len", "32", "--kv-cache-bytes", "100000", "--trace", "false"])
    assert rc == 0
    assert main(["generate", "--model", "random:tiny", "--prompt", "x", "--preemption-mode", "swap"]) == 2
    assert "preemption_mode='swap' needs swap_bytes" in capsys.readouterr().err


def test_bench_serve_quick_json(tmp_path):
    out = tmp_path / "s.json"
    assert main(["bench", "serve", "--model", "random:tiny", "--quick", "--json", str(out)]) == 0
    res = json.load(open(out))
    assert set(res["runs"]) >= {"continuous", "static", "shared prefix, prefix caching"}
    assert res["runs"]["shared prefix, prefix caching"]["cached_tokens"] > 0
    assert all(v > 0 for v in res["ratios"].values())


def test_bench_quant_quick_json(tmp_path):
    out = tmp_path / "q.json"
    assert main(["bench", "quant", "--quick", "--json", str(out)]) == 0
    runs = json.load(open(out))["runs"]
    assert set(runs) == {"fp32", "int8", "int4 g32", "int4 g128", "awq g32", "awq g128", "q8_0", "w8a8", "smoothquant",
                         "fp32, KV int8", "w8a8, outliers", "smoothquant, outliers"}
    assert runs["fp32"]["delta_ppl"] == 0 and runs["fp32"]["decode_speedup"] == 1
    assert runs["int8"]["weight_ratio"] < 0.5 and runs["int4 g32"]["weight_ratio"] < runs["int8"]["weight_ratio"]
    assert runs["fp32, KV int8"]["kv_ratio"] < 0.3 and all(r["decode_tok_s"] > 0 for r in runs.values())
    assert abs(runs["int8"]["delta_ppl"]) < 0.005 and abs(runs["int4 g32"]["delta_ppl"]) < 0.05


def test_bench_spec_quick_json(tmp_path):
    out = tmp_path / "s.json"
    assert main(["bench", "spec", "--quick", "--json", str(out)]) == 0
    res = json.load(open(out))
    assert {(r["proposer"], r["temperature"]) for r in res["rows"]} == {("draft", 0.0), ("ngram", 0.0), ("medusa", 0.0),
                                                                        ("draft", 1.0), ("ngram", 1.0)}
    assert res["repeats"] == 3
    for r in res["rows"]:
        assert 0 <= r["alpha"] <= 1 and r["c"] >= 0 and r["r"] > 0 and r["measured"] > 0 and r["predicted_k"] > 0
        assert r["same_as_plain"] or r["temperature"] > 0          # greedy speculation never changes the text
        assert r["rounds"] == 3 and r["measured_min"] <= r["measured"] <= r["measured_max"]   # median of 3, spread
    assert [s["batch"] for s in res["batch_sweep"]] == [1, 4] and isinstance(res["goals"]["best_at_least_2x"], bool)
    assert all(s["speedup_min"] <= s["speedup"] <= s["speedup_max"] for s in res["batch_sweep"])


def test_bench_batched_quick_with_a_stand_in_runc(tmp_path):
    fake = tmp_path / "runc"        # stands in for a run.c binary: only its "achieved tok/s" line is read
    fake.write_text('#!/bin/sh\necho "achieved tok/s: 50.0" >&2\n')
    fake.chmod(0o755)
    model, tok = tmp_path / "m.bin", tmp_path / "tokenizer.bin"
    from minillm.formats.llama2c import save_bin
    from minillm.formats.loader import random_model
    net, t = random_model("tiny")
    save_bin(net, str(model))
    t.save(str(tok))
    out = tmp_path / "b.json"
    assert main(["bench", "batched", "--model", str(model), "--quick", "--runc", str(fake), "--json", str(out)]) == 0
    res = json.load(open(out))
    assert res["batch"] == 4 and res["runc_tok_s_median"] == 50.0
    assert res["batched_over_runc"] == res["tok_s_median"] / 50.0 and 0 < res["flop_fraction"]
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\nexit 3\n")
    bad.chmod(0o755)
    assert main(["bench", "batched", "--model", str(model), "--quick", "--runc", str(bad)]) == 2   # checked up front


# ---------------------------------------------------------------------------- user mistakes: one line, exit 2
def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv,says", [
    (["generate", "--model", "/no/such/model.bin", "--prompt", "x"], "/no/such/model.bin"),
    (["generate", "--model", "random:tiny", "--prompt", "x", "--speculative", "5"], "speculative"),
    (["bench", "decode", "--model", "nope"], "unknown model 'nope'"),
    (["bench", "decode", "--model", "/no/such/model.bin"], "/no/such/model.bin"),
    (["ship", "--target", "/no/such/run", "--data", "/no/such/data"], "/no/such/"),
    (["student", "/no/such/notebooks", "no/such/student-edition"], "/no/such/notebooks"),
])
def test_every_subcommand_reports_user_mistakes_in_one_line(argv, says, capsys):
    assert main(argv) == 2
    assert says in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("error", [TypeError("bad type\nsecond line"), ValueError("bad value"),
                                   FileNotFoundError("nope")])
@pytest.mark.parametrize("cmd", ["run", "bench", "train", "ship", "student"])
def test_user_errors_from_any_subcommand_are_one_line(cmd, error, monkeypatch, capsys):
    import importlib
    module = importlib.import_module({"run": "minillm.engine.runc", "bench": "minillm.bench.cli",
                                      "train": "minillm.training.train", "ship": "minillm.training.ship",
                                      "student": "minillm.labs.student"}[cmd])

    def fail(argv):
        raise error

    monkeypatch.setattr(module, "main", fail)
    assert main([cmd]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: " + " ".join(str(error).split("\n"))


def test_student_names_a_file_that_is_not_a_notebook(tmp_path, capsys):
    (tmp_path / "nb").mkdir()
    for text in ("[]", "{not json", '{"cells": 3}'):
        (tmp_path / "nb" / "a.ipynb").write_text(text)
        assert main(["student", str(tmp_path / "nb"), str(tmp_path / "out")]) == 2
        assert f"{tmp_path / 'nb' / 'a.ipynb'}: not a notebook" in one_error_line(capsys.readouterr().err)


def test_train_refuses_to_overwrite_a_run(tmp_path, capsys, monkeypatch):
    import minillm.training.train

    def prepare_data(*args, **kwargs):                                  # where an unrefused run would go on
        raise AssertionError("the run was not refused: it went on to prepare its data")

    monkeypatch.setattr(minillm.training.train, "prepare_data", prepare_data)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model.bin").write_bytes(b"a finished run")
    assert main(["train", "--out", str(tmp_path / "run"), "--data-dir", str(tmp_path / "data")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(tmp_path / "run") in line and "--resume" in line and "--force" in line
    assert (tmp_path / "run" / "model.bin").read_bytes() == b"a finished run"
    assert not (tmp_path / "data").exists()                             # refused before any work


@pytest.mark.parametrize("value,ok", [("true", True), ("FALSE", True), ("1", True), ("0", True), ("Yes", True),
                                      ("no", True), ("maybe", False), ("", False), ("2", False), ("on", False)])
def test_bool_flags_take_only_true_or_false(value, ok, capsys):
    argv = ["generate", "--model", "random:tiny", "--prompt", "x", "--max-tokens", "1",
            "--enable-prefix-caching", value]
    if ok:
        assert main(argv) == 0
    else:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert f"--enable-prefix-caching: expected true/false/1/0/yes/no, got {value!r}" in capsys.readouterr().err


def test_student_refuses_to_write_over_its_source(tmp_path, capsys):
    src = tmp_path / "nb"
    src.mkdir()
    nb = {"cells": [{"cell_type": "code",
                     "source": ["x = 1\n", "### BEGIN SOLUTION\n", "y = 2\n", "### END SOLUTION\n"],
                     "outputs": [], "execution_count": None, "metadata": {}}], "metadata": {}, "nbformat": 4,
          "nbformat_minor": 5}
    (src / "a.ipynb").write_text(json.dumps(nb))
    before = (src / "a.ipynb").read_bytes()
    (tmp_path / "link").symlink_to(src)
    for dst in (src, tmp_path / "nb" / ".", tmp_path / "link", tmp_path / "x" / ".." / "nb"):
        assert main(["student", str(src), str(dst)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert str(dst) in line and "is the source" in line
        assert (src / "a.ipynb").read_bytes() == before
    assert not (tmp_path / "x").exists()
    assert main(["student", str(src), str(tmp_path / "out")]) == 0
    assert "y = 2" not in (tmp_path / "out" / "a.ipynb").read_text()
