"""`bench sparsity --quick` and `bench longctx --quick`: the smoke runs finish and their JSON holds what the report
prints (the full runs' numbers are in the closing notes; no timing is asserted here)."""
import json

from minillm.__main__ import main


def test_bench_sparsity_quick_json(tmp_path):
    out = tmp_path / "sparsity.json"
    assert main(["bench", "sparsity", "--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = res["perplexity"]["rows"]
    assert {(r["method"], str(r["pattern"])) for r in rows} >= {("magnitude", "0.5"), ("wanda", "0.5"),
                                                                ("magnitude", "2:4"), ("wanda", "2:4")}
    assert all(r["perplexity"] > 0 for r in rows)
    two_four = [r for r in rows if r["pattern"] == "2:4"]
    assert all(0.5 < r["weight_ratio"] < 0.6 for r in two_four)   # values + 2-bit indices: 1/2 + 1/16 of fp32
    assert res["gemv"]["max_abs_error"] < 1e-4                     # the 2:4 GEMV against the dense product


def test_bench_longctx_quick_json(tmp_path):
    out = tmp_path / "longctx.json"
    assert main(["bench", "longctx", "--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert {r["method"] for r in res["rows"]} >= {"streaming", "h2o"}
    for r in res["rows"]:     # every budget below the 1023-token window evicts, and its perplexity is a number
        assert r["budget"] < res["window_tokens"] and r["evicted_blocks"] > 0 and r["ppl"] > 1
    past = res["past_context"]
    assert past["total_tokens"] > past["max_model_len"]           # generation went past the context
    assert past["kv_bytes_max"] < past["kv_bytes_full_attention"]  # with the KV held to the budget
