"""bench cluster's --quick smoke run (minillm/bench/cluster.py) and its pieces that make the traces. No timing is
asserted: the verdicts are measured and reported by the bench (tests/test_cluster_disagg.py checks a win and a loss
on traces built for each); here, that every section ran, served every request, and counted the handover bytes."""
import json

import pytest

from minillm.__main__ import main
from minillm.bench.cluster import disagg_workloads, mixed_workload, system_prompt_workload
from minillm.bench.step_cost import StepCost
from minillm.cluster import ROUTING_POLICIES


def test_system_prompt_workload_shares_prefixes():
    wl = system_prompt_workload(40, 512, rate=10.0, num_prompts=3, system_len=32, seed=0)
    heads = {tuple(r.prompt_ids[:32]) for r in wl}
    assert len(heads) == 3 and all(r.prompt_ids[0] == 1 and len(r.prompt_ids) > 32 for r in wl)
    assert all(b.arrival > a.arrival for a, b in zip(wl, wl[1:]))


def test_disagg_workloads_fit_the_context():
    cost = StepCost(0.0, 5e-4, 1e-3)
    for trace in disagg_workloads(50, 512, cost, 256).values():
        assert all(len(r.prompt_ids) + r.max_tokens <= 256 for r in trace)
    wl = mixed_workload(30, 512, [(1.0, 100, 4), (3.0, 10, 20)], max_len=128, seed=0)
    assert {len(r.prompt_ids) > 50 for r in wl} == {True, False}        # both classes drawn


def test_bench_cluster_quick_json(tmp_path):
    out = tmp_path / "cluster.json"
    assert main(["bench", "cluster", "--model", "random:tiny", "--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    router = res["router"]
    assert set(router["runs"]) == set(ROUTING_POLICIES)
    for m in router["runs"].values():
        assert m["requests"] == router["requests"] and sum(m["routed"]) == router["requests"]
        assert 0.0 <= m["prefix_hit_rate"] <= 1.0
    disagg = res["disagg"]
    assert set(disagg["workloads"]) == {"long prompts interrupt decodes", "short prompts, decode heavy"}
    for w in disagg["workloads"].values():
        assert set(w["runs"]) == {"colocated", "disaggregated"}
        assert all(r["requests"] == w["requests"] for r in w["runs"].values())
        assert w["verdict"] in ("wins", "loses") and w["reason"]
        assert w["timelines"]["disaggregated"][0]["handover_bytes"] > 0
    for row in disagg["handover"]["rows"]:
        assert row["bytes"] == row["formula_bytes"] == row["blocks"] * disagg["handover"]["block_bytes"]
    assert disagg["real"] == {} and router["real"] == {}              # --quick starts no process


def test_bench_cluster_refuses_an_unknown_section():
    with pytest.raises(SystemExit):
        main(["bench", "cluster", "--section", "tensor"])
