"""bench sched's pieces (minillm/bench/sched.py) and its --quick smoke run. No timing is asserted: the claims
(MLFQ's mean JCT against FCFS's, the fair share) are measured by the bench and reported, not tested here; what is
tested is that the metrics compute what they say and that every order serves the same requests and tokens."""
import json

import numpy as np
import pytest

from minillm.__main__ import main
from minillm.bench.sched import client_shares, prefix_hit_rates, sched_metrics
from minillm.core.outputs import CompletionOutput, RequestOutput
from minillm.core.sequence import RequestMetrics
from minillm.workload import Request, at_rate, heavy_tailed, merge, multi_turn_chat, pareto_lengths


def fake_output(i, arrival, token_times, prompt_len=4):
    m = RequestMetrics(arrival, first_scheduled_time=arrival, first_token_time=token_times[0],
                       token_times=list(token_times), finished_time=token_times[-1])
    return RequestOutput(str(i), None, [1] * prompt_len, [CompletionOutput(0, "", [5] * len(token_times), "length")],
                         True, m)


def test_metrics_compute_jct_goodput_and_priority_classes():
    wl = [Request(0.0, [1] * 4, 3, "A", 0), Request(1.0, [1] * 4, 2, "B", 1), Request(2.0, [1] * 4, 1, "A", 1)]
    outs = [fake_output(0, 0.0, [0.5, 0.6, 0.7]), fake_output(1, 1.0, [3.0, 3.5]), fake_output(2, 2.0, [2.1])]
    m = sched_metrics(outs, wl, slo_ttft=1.0, slo_tpot=0.2)
    assert m["jct_mean"] == pytest.approx((0.7 + 2.5 + 0.1) / 3)
    assert m["ttft_p50"] == pytest.approx(0.5)
    # request 0 meets both targets; 1 misses TTFT (2.0 s); 2 has one token (no TPOT) and a TTFT of 0.1 s
    assert m["slo_attained"] == pytest.approx(2 / 3) and m["goodput"] == pytest.approx(2 / 3.5)
    assert m["jct_mean_by_priority"] == {"0": pytest.approx(0.7), "1": pytest.approx((2.5 + 0.1) / 2)}
    assert m["throughput"] == pytest.approx(6 / 3.5)


def test_client_shares_count_service_while_every_client_sends():
    wl = [Request(0.0, [1] * 4, 2, "A"), Request(1.0, [1] * 2, 2, "B"), Request(2.0, [1] * 4, 2, "A"),
          Request(3.0, [1] * 2, 2, "B")]
    outs = [fake_output(0, 0.0, [0.5, 0.6]), fake_output(1, 1.0, [1.5, 1.6], 2), fake_output(2, 2.0, [2.5, 9.0]),
            fake_output(3, 3.0, [3.5, 9.5], 2)]
    share = client_shares(outs, wl, w_p=1.0, w_q=2.0)        # window [1.0, 2.0]: only request 1 served in it
    assert share == {"A": 0.0, "B": 1.0}
    wl2 = [Request(0.0, [1] * 4, 2, "A"), Request(0.0, [1] * 2, 2, "B"), Request(10.0, [1] * 4, 2, "A"),
           Request(10.0, [1] * 2, 2, "B")]
    share = client_shares([fake_output(i, r.arrival, [r.arrival + 0.5, r.arrival + 1]) for i, r in enumerate(wl2)],
                          wl2)
    assert share["A"] == pytest.approx((4 + 4) / (4 + 4 + 2 + 4))      # two outputs at w_q = 2, prompts at w_p = 1


def test_heavy_tailed_workloads_are_seeded_and_heavy_tailed():
    rng = np.random.default_rng(0)
    x = pareto_lengths(rng, 20000, 1.0, 4, 400)
    assert x.min() >= 4 and x.max() <= 400
    assert 0.08 < np.mean(x > 40) < 0.12                  # P(X > 10 lo) ~ 1/10 for alpha 1 (bounded: a bit less)
    a = heavy_tailed(50, 512, 2.0, client="A", priorities=(0, 1), seed=3)
    assert [r.prompt_ids for r in a] == [r.prompt_ids for r in heavy_tailed(50, 512, 2.0, client="A",
                                                                               priorities=(0, 1), seed=3)]
    assert {r.client for r in a} == {"A"} and {r.priority for r in a} == {0, 1}
    assert np.mean([r.max_tokens for r in a]) > np.median([r.max_tokens for r in a])
    b = at_rate(a, 10.0)
    assert b[0].arrival == 0 and (len(b) - 1) / b[-1].arrival == pytest.approx(10.0)
    m = merge(a, heavy_tailed(5, 512, 1.0, client="B"))
    assert len(m) == 55 and [r.arrival for r in m] == sorted(r.arrival for r in m)


def test_multi_turn_chats_repeat_their_history():
    wl = multi_turn_chat(3, 4, 512, rate=5.0, seed=1)
    assert len(wl) == 12
    by_start = {}
    for r in wl:
        by_start.setdefault(tuple(r.prompt_ids[:60]), []).append(r)
    for r in wl:                                           # every prompt starts with the one system prompt
        assert r.prompt_ids[:48] == wl[0].prompt_ids[:48]
    longer = sorted(wl, key=lambda r: len(r.prompt_ids))
    assert any(b.prompt_ids[:len(a.prompt_ids)] == a.prompt_ids for a in longer for b in longer if a is not b)


def test_the_radix_tree_finds_at_least_what_the_block_hashes_find():
    chats = multi_turn_chat(6, 4, 512, rate=5.0, seed=2)
    rates = prefix_hit_rates(chats, capacity_tokens=4096, block_size=16)
    assert 0 < rates["block hashes"] < rates["radix tree"] < 1     # token granularity: no partial block is lost
    tight = prefix_hit_rates(chats, capacity_tokens=128, block_size=16)
    assert tight["radix tree"] < rates["radix tree"]


def test_bench_sched_quick_json(tmp_path):
    out = tmp_path / "s.json"
    assert main(["bench", "sched", "--model", "random:tiny", "--quick", "--json", str(out)]) == 0
    res = json.load(open(out))
    runs = res["runs"]
    assert set(runs) == {"fcfs", "sjf", "priority", "mlfq", "fair"} and set(res["real"]) == {"fcfs", "mlfq"}
    assert len({r["requests"] for r in runs.values()}) == 1                    # every order served every request
    tokens = {round(r["throughput"] * r["seconds"]) for r in runs.values()}
    assert len(tokens) == 1                                                     # ... and the same tokens
    assert runs["fcfs"]["preemptions"] == 0 and runs["mlfq"]["preemptions"] > 0
    assert 0.8 <= res["utilisation"] <= 0.9 and res["rate_rps"] == pytest.approx(0.85 * res["capacity_rps"])
    shares = res["fairness"]
    assert set(shares) == {"fcfs", "fair"} and sum(shares["fair"]["client_share"].values()) == pytest.approx(1.0)
    assert set(res["prefix"]["engine"]) == {"fcfs", "lpm"} and set(res["prefix"]["structures"]) == {
        "block hashes", "radix tree"}
