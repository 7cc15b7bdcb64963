"""`bench parallel --quick`: the smoke run finishes (it starts its own rank group and closes it) and its JSON holds what
the report prints: counted payload bytes equal the formula, the bubble table covers every m beside GPipe's formula,
the GPU projection is the bytes over the stated bandwidths. No timing is asserted."""
import json

import pytest

from minillm.__main__ import main
from minillm.parallel import current_group


def test_bench_parallel_quick_json(tmp_path):
    out = tmp_path / "parallel.json"
    try:
        assert main(["bench", "parallel", "--quick", "--json", str(out)]) == 0
    finally:
        if current_group() is not None:
            current_group().close()
    res = json.loads(out.read_text())
    assert set(res["decode"]) == {"batch_1", "batch_8"}
    assert all(r > 0 for rates in res["decode"].values() for r in rates.values())
    wanted = {"tensor": {"broadcast", "all_reduce", "all_gather"}, "pipeline": {"broadcast", "send", "recv"}}
    for kind, ops in wanted.items():
        for batch in res["bytes_per_token"][kind].values():
            times = batch.pop("rank0_step_s")
            assert set(batch) == ops and all(v["counted"] == v["formula"] for v in batch.values())
            assert times["compute"] > 0 and times["communication"] > 0
    assert res["bytes_per_token"]["tensor"]["batch_8"]["all_reduce"]["counted"] == 2 * 8 * 256 * 4   # 2 L C e
    assert [r["m"] for r in res["bubble"]] == [1, 2, 4, 8]
    assert [r["formula"] for r in res["bubble"]] == pytest.approx([1 / 2, 1 / 3, 1 / 5, 1 / 9])
    assert "skipped" in res["loopback"] or res["loopback"]["expected_wire_bytes"] > 0
    tp = res["gpu_projection"]["tensor"]
    nvlink = tp["seconds"]["NVLink (H100, ~450 GB/s per direction)"]
    assert nvlink == pytest.approx(tp["bytes_per_token_per_rank"] / 450e9)
