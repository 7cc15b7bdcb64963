"""`bench lora --quick`: the smoke run finishes and its JSON holds what the report prints (the full run's numbers
are in the closing notes; no timing is asserted here)."""
import json

from minillm.__main__ import main


def test_bench_lora_quick_json(tmp_path):
    out = tmp_path / "lora.json"
    assert main(["bench", "lora", "--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["runs"]) == {"merged", "lora x1", "lora mixed"} and res["adapters"] == ["comedies", "tragedies",
                                                                                          "histories"]
    assert all(r["tok_s_median"] > 0 for r in res["runs"].values()) and res["mixed_over_merged"] > 0
    m = res["memory"]
    assert len(m["adapter_bytes"]) == 3 and max(m["adapter_bytes"]) * 10 < m["merged_copy_bytes"]   # ~4% each
    assert m["adapter_loads"] == 3 and m["adapter_evictions"] == 0       # 3 adapters in 4 slots: loaded once
    assert res["greedy_compared"] == 3                                    # rows 0, 3, 6 of 8 use the first adapter
