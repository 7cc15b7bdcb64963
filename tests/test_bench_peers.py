"""`bench peers` and run.c's files and checks: a worker process's numbers are what it says they are; the parent
starts a fresh process per measurement, engines interleaved (workers stood in for: their rates are made up);
HF's copy of the weights is checked equal before it is timed (and a wrong copy is caught); run.c gets files for
any model; a wrong --runc fails up front in one line. Speeds are printed by the bench, never asserted here."""
import json

import pytest
import torch

from minillm.__main__ import main
from minillm.bench import peers
from minillm.bench.decode import bench_decode, runc_files
from minillm.formats.llama2c import load_bin
from minillm.formats.loader import MODELS_DIR, random_model
from minillm.llama.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers", reason="transformers is in the dev extra")


@pytest.fixture(scope="module")
def tiny():
    """The tiny preset with large weights (std 0.15): logits that differ at every position, so a wrong
    conversion shows. float32, as every engine in the bench runs."""
    net, tok = random_model("tiny", seed=0)
    net.init_weights(seed=5, std=0.15)
    return net.eval(), tok


@pytest.fixture
def stand_in_runc(tmp_path):
    """Stands in for a run.c binary: fails unless its checkpoint and tokenizer files exist, then prints run.c's
    rate line (the only thing read from it)."""
    fake = tmp_path / "runc"
    fake.write_text('#!/bin/sh\ntest -f "$1" && test -f "$3" || exit 4\necho "achieved tok/s: 50.0" >&2\n')
    fake.chmod(0o755)
    return str(fake)


def test_worker_process_reports_what_it_measured():
    w = peers.Worker("minillm-torch", "random:tiny", None, [1, 3], 5, 1)   # the real subprocess and protocol
    try:
        res = w.measure()
    finally:
        w.kill()
    n_prompt = len(random_model("tiny")[1].encode(peers.PROMPT))
    assert res["engine"] == "minillm-torch" and res["steps"] == 5 and res["prompt_tokens"] == n_prompt
    assert res["backend"] == "torch" and res["threads"] == 1
    for b in (1, 3):
        r = res["runs"][str(b)]
        assert r["decode_tokens"] == b * 4                       # tokens 2..5 of each sequence: the first is prefill's
        assert r["decode_seconds"] > 0 and r["tok_s"] == r["decode_tokens"] / r["decode_seconds"]


def test_hf_engine_decodes_exact_lengths(tiny):
    net, tok = tiny
    gen, info = peers._engine_runner("hf", net, tok, [2], 6)
    assert info["hf_logits_max_abs_diff"] <= peers.LOGITS_ATOL
    n_tok, secs = gen(2, 6)                                      # asserts (2, P + 6) tokens out, 6 logits calls
    assert n_tok == 2 * 5 and secs > 0


def test_hf_logits_check_passes_and_catches_a_wrong_copy(tiny):
    net, tok = tiny
    ids = tok.encode(peers.CHECK_TEXT)[:32]
    assert len(ids) >= 8
    hf = peers.to_hf(net)
    assert peers.check_hf_logits(net, hf, ids) < peers.LOGITS_ATOL
    with torch.no_grad():                                        # one weight off by 0.05 (std 0.15): a real change
        hf.model.layers[1].mlp.down_proj.weight[3, 7] += 0.05
    with pytest.raises(RuntimeError, match="logits differ"):
        peers.check_hf_logits(net, hf, ids)
    # wk left in llama2.c's interleaved RoPE layout: position 0 is blind to it (RoPE is the identity there),
    # so only a check over several positions catches it
    hf = peers.to_hf(net)
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            layer.self_attn.k_proj.weight.copy_(net.layers[i].attention.wk.weight)
    peers.check_hf_logits(net, hf, ids[:1])
    with pytest.raises(RuntimeError, match="position [1-9]"):
        peers.check_hf_logits(net, hf, ids)


def test_runc_files_for_every_kind_of_model(tiny, tmp_path):
    net, tok = tiny
    ck, tk = runc_files("random:tiny", None, (net, tok))        # written for run.c: not a file of its own
    back = load_bin(ck)
    for k, v in net.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k           # float32 written and read back: exact
    assert Tokenizer.load(tk, net.config.vocab_size).pieces == tok.pieces
    ck2, _ = runc_files("random:tiny")                          # loads it itself (seed 0), into a folder of its own
    assert ck2 != ck
    for k, v in random_model("tiny", seed=0)[0].state_dict().items():
        assert torch.equal(load_bin(ck2).state_dict()[k], v), k
    assert runc_files("shakespeare") == (f"{MODELS_DIR}/shakespeare.bin", f"{MODELS_DIR}/tokenizer.bin")
    assert runc_files(ck, "/my/tok.bin") == (ck, "/my/tok.bin")
    with pytest.raises(ValueError, match="tokenizer.bin, not /x/tokenizer.json"):
        runc_files("random:tiny", "/x/tokenizer.json")


def test_bench_decode_gives_run_c_files_for_a_random_model(stand_in_runc):
    res = bench_decode("random:tiny", steps=8, repeats=1, runc=stand_in_runc)
    assert res["runc_tok_s_median"] == 50.0 and res["over_runc"] == res["tok_s_median"] / 50.0


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("bench,kind,says", [
    ("peers", "missing", "no such file"), ("peers", "plain", "is not executable"),
    ("peers", "silent", "exited 0 but is not run.c"), ("peers", "fails", "failed \\(exit 3\\)"),
    ("decode", "silent", "exited 0 but is not run.c"), ("batched", "missing", "no such file")])
def test_bad_runc_is_one_clear_error_before_any_measurement(tmp_path, capsys, bench, kind, says):
    bad = tmp_path / "notrunc"
    if kind != "missing":
        body = {"plain": "", "silent": "echo hello", "fails": "exit 3"}[kind]
        bad.write_text(f"#!/bin/sh\n{body}\n")
        bad.chmod(0o644 if kind == "plain" else 0o755)
    assert main(["bench", bench, "--model", "random:tiny", "--runc", str(bad)]) == 2   # not --quick: nothing ran
    line = one_error_line(capsys.readouterr().err)
    assert str(bad) in line and "run.c" in line
    import re
    assert re.search(says, line), line


RATE = {"minillm": 100.0, "minillm-torch": 50.0, "hf": 80.0}      # made-up tok/s at batch 1, x batch


@pytest.fixture
def fake_workers(monkeypatch):
    """Workers that answer at once, with made-up rates (RATE x batch + how many times that engine measured
    before): what bench_peers does with them, in which order, is what these tests check."""
    calls, count = [], {}

    class FakeWorker:
        def __init__(self, engine, model, tokenizer, batches, steps, threads):
            self.engine, self.batches = engine, list(batches)
            calls.append(("start", engine, tuple(batches)))

        def ready(self):
            calls.append(("ready", self.engine))

        def measure(self):
            calls.append(("measure", self.engine, tuple(self.batches)))
            n = count[self.engine] = count.get(self.engine, -1) + 1
            return {"engine": self.engine, "backend": "torch", "hf_logits_max_abs_diff": 1e-6, "setup_seconds": 1.0,
                    "runs": {str(b): {"tok_s": RATE[self.engine] * b + n} for b in self.batches}}

        def kill(self):
            pass

    def fake_runc(runc, model, tokenizer, steps, prompt="", threads=None):
        calls.append(("runc", steps))
        return 50.0
    monkeypatch.setattr(peers, "Worker", FakeWorker)
    monkeypatch.setattr("minillm.bench.decode.runc_tok_s", fake_runc)
    return calls


def test_bench_peers_interleaves_engines_and_reports_medians(fake_workers, stand_in_runc):
    res = peers.bench_peers("random:tiny", batches=(1, 2), steps=4, repeats=3, runc=stand_in_runc)
    n_prompt = res["prompt_tokens"]
    one_repeat = [("start", "minillm", (1,)), ("measure", "minillm", (1,)), ("start", "minillm-torch", (1,)),
                  ("measure", "minillm-torch", (1,)), ("start", "hf", (1,)), ("measure", "hf", (1,)),
                  ("runc", n_prompt + 4),                         # run.c's -n counts the prompt's positions too
                  ("start", "minillm", (2,)), ("measure", "minillm", (2,)), ("start", "minillm-torch", (2,)),
                  ("measure", "minillm-torch", (2,)), ("start", "hf", (2,)), ("measure", "hf", (2,))]
    assert [c for c in fake_workers if c[0] != "ready"] == one_repeat * 3   # a fresh process per measurement
    m = res["engines"]["minillm"]["2"]                            # measured 2nd, 4th, 6th: 200 + 1, 3, 5
    assert (m["tok_s_min"], m["tok_s_median"], m["tok_s_max"], m["tok_s_all"]) == (201, 203, 205, [201, 203, 205])
    assert res["engines"]["runc"] == {"1": {"tok_s_median": 50.0, "tok_s_min": 50.0, "tok_s_max": 50.0,
                                            "tok_s_all": [50.0] * 3}}
    assert res["ratios"] == {"minillm / hf, batch 1": 102 / 82, "minillm / hf, batch 2": 203 / 163,
                             "minillm / run.c, batch 1": 102 / 50}
    assert res["minillm_backend"] == "torch" and res["hf_logits_max_abs_diff"] == 1e-6


def test_bench_peers_quick_loads_every_engine_before_any_measures(fake_workers, stand_in_runc, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["bench", "peers", "--model", "random:tiny", "--quick", "--runc", stand_in_runc,
                 "--json", str(out)]) == 0
    kinds = [c[0] for c in fake_workers]
    assert kinds == ["start"] * 3 + ["ready"] * 3 + ["measure"] * 3 + ["runc"]
    assert all(c[2] == (1, 4) for c in fake_workers if c[0] == "measure")   # one process per engine, both batches
    res = json.load(open(out))
    assert (res["batches"], res["steps"], res["repeats"], res["quick"]) == ([1, 4], 16, 1, True)
    table = capsys.readouterr().out
    for want in ("minillm (torch: default)", "HF transformers", "llama2.c run.c", "400 (400-400)",
                 "minillm / hf, batch 4: 1.25x", "minillm / run.c, batch 1: 2.00x"):
        assert want in table, (want, table)


@pytest.mark.parametrize("argv,says", [(["--batches", "1,x"], "--batches"), (["--batches", "0"], "--batches"),
                                       (["--steps", "1"], "--steps must be a whole number from 2"),
                                       (["--steps", "300"], "max_seq_len=256"), (["--repeats", "0"], "--repeats")])
def test_bench_peers_bad_numbers(argv, says, capsys):
    assert main(["bench", "peers", "--model", "random:tiny", *argv]) == 2
    assert says in one_error_line(capsys.readouterr().err)
