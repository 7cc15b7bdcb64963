"""The capstone (minillm.bench.capstone, notebook 16, `bench serve --score`): the clock prices each engine's own
bytes, the trace and SLO are fixed, the score is deterministic on the shipped cost model, the reference beats the
plain engine by the issue's 3x, and a student's bad policy or option is graded, not a traceback."""
import json

import pytest

from minillm.__main__ import main
from minillm.bench import capstone
from minillm.core.batch import ScheduledBatch
from minillm.core.sampling import SamplingParams
from minillm.core.sequence import Sequence
from minillm.formats.loader import load


@pytest.fixture(scope="module")
def shipped():
    return load("shakespeare")


@pytest.fixture(scope="module")
def task(shipped):
    return capstone.setup(*shipped)


def decode_batch(rows: int, context: int, lookahead: int = 0) -> ScheduledBatch:
    batch = ScheduledBatch("decode")
    for i in range(rows):
        seq = Sequence(i, str(i), 0, list(range(1, context + 1)), SamplingParams(), 0, 0.0)
        batch.add(seq, context - 1, context, lookahead)
    return batch


def test_the_clock_prices_the_engines_own_bytes(shipped):
    """int8 weights read a quarter of the bytes: a memory-bound decode step (batch 1) costs less; at a batch where
    the FLOPs bind, the same; an int8 KV cache reads less per context token; a draft model adds its calls."""
    m, tok = shipped
    cost = {name: capstone._engine_cost(m, tok, capstone.REFERENCE, opts) for name, opts in
            [("fp32", {}), ("int8", {"quantization": "int8"}), ("kv8", {"kv_cache_dtype": "int8"}),
             ("draft", {"speculative": {"method": "draft", "gamma": 3}})]}
    one, full = decode_batch(1, 64), decode_batch(48, 64)
    assert cost["int8"](one) < 0.6 * cost["fp32"](one)
    assert cost["int8"](full) == pytest.approx(cost["fp32"](full), rel=0.05)
    assert cost["kv8"].kv_bytes_per_token < 0.3 * cost["fp32"].kv_bytes_per_token
    assert cost["draft"].draft_params and cost["draft"](decode_batch(1, 64, 3)) > cost["fp32"](decode_batch(1, 64, 3))
    c, r = cost["fp32"], capstone.REFERENCE
    memory_bound = r.overhead_s + c.weight_bytes / r.bandwidth + 64 * c.kv_bytes_per_token / r.bandwidth
    assert c(one) == pytest.approx(memory_bound)


def test_the_trace_and_the_slo(shipped, task):
    m, _ = shipped
    assert capstone.trace(m.config.vocab_size) == capstone.trace(m.config.vocab_size)      # seeded
    classes = {r.client for r in task.workload}
    assert classes == {"chat", "docs"} and set(task.slo) == classes
    assert capstone.shared_prefix(task.workload, "chat") == 96 and capstone.shared_prefix(task.workload, "docs") == 32
    assert task.rate == pytest.approx(capstone.LOAD * task.capacity)
    arrivals = [r.arrival for r in task.workload]
    assert arrivals == sorted(arrivals) and len(task.workload) / arrivals[-1] == pytest.approx(task.rate, rel=0.05)


def test_the_score_is_deterministic_and_the_reference_beats_plain_by_3x(shipped, task):
    """The issue's goal, on the shipped cost model (bench serve --score): the reference configuration's goodput at
    least 3x the plain FCFS engine's on the same trace and budget. Deterministic: the clock is simulated."""
    plain = capstone.score(*shipped, {}, setup_=task)
    ref = capstone.score(*shipped, capstone.REFERENCE_OPTIONS, setup_=task)
    assert ref["goodput"] >= 3 * plain["goodput"]
    assert ref["peak_kv_bytes"] < plain["peak_kv_bytes"]
    again = capstone.score(*shipped, capstone.REFERENCE_OPTIONS, setup_=task)
    assert again["goodput"] == ref["goodput"] and again["ttft_p99"] == ref["ttft_p99"]


def test_the_budget_and_the_trace_cannot_be_configured_away(shipped, task):
    with pytest.raises(ValueError, match=r"\['kv_cache_bytes'\]: the KV budget"):
        capstone.score(*shipped, {"kv_cache_bytes": 10**9}, setup_=task)


def test_score_cli_grades_a_policy_file_and_a_broken_one(tmp_path, capsys):
    good = tmp_path / "edf.py"
    good.write_text("from minillm.scheduling.orders import Order\n"
                    "class EDF(Order):\n"
                    "    def key(self, seq):\n"
                    "        return (seq.metrics.arrival_time + (0.02 if seq.client == 'chat' else 0.3),) "
                    "+ self.tiebreak(seq)\n"
                    "def order():\n    return EDF()\n")
    out = tmp_path / "score.json"
    options = json.dumps({"block_size": 16, "enable_prefix_caching": True})
    assert main(["bench", "serve", "--score", "--options", options, "--policy", str(good), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["score"] > res["plain"]["goodput"] and res["reference_vs_plain"] >= 3
    assert "plain FCFS" in capsys.readouterr().out
    broken = tmp_path / "broken.py"
    broken.write_text("def order():\n    raise RuntimeError('my order is not done')\n")
    main(["bench", "serve", "--score", "--policy", str(broken), "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["verdict"].startswith("fail:") and "my order is not done" in res["yours"]["fail"]
    assert "RuntimeError" in capsys.readouterr().out
    main(["bench", "serve", "--score", "--options", '{"no_such_option": 1}', "--json", str(out)])
    assert "no_such_option" in json.loads(out.read_text())["verdict"]
