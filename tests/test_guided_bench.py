"""`python -m minillm bench guided`'s parts, tiny (no timing is asserted): what they count is right."""
import pytest

from minillm import LLM
from minillm.bench.guided import jump_forward, mask_cost, print_report, validity, versus_outlines


@pytest.fixture(scope="module")
def llm():
    return LLM("shakespeare", max_num_seqs=64)


def test_bench_parts_count_what_they_say(llm, capsys):
    v = validity(llm, 2, max_tokens=48)
    assert len(v) == 6 and all(r["valid"] == r["n"] == 2 for r in v.values())
    m = mask_cost(llm, batch=8, max_tokens=24, repeats=1)
    assert len(m["regex"]["round_step_ms"]) == len(m["json"]["round_step_ms"]) == 1 and m["plain_step_ms"] > 0
    assert 0 < m["json"]["mask_share"] < 1
    assert llm.engine.jump_forward                           # restored after the runs with it off
    j = jump_forward(llm, samples=2, max_tokens=80)
    greedy = j["greedy, 1 request"]
    assert greedy["on"]["forced"] > 0 and greedy["off"]["forced"] == 0
    assert greedy["on"]["steps"] < greedy["off"]["steps"] and greedy["on"]["valid"] and greedy["off"]["valid"]
    o = versus_outlines(llm.tokenizer, walks=1, only=("regex:phone",))
    if "skipped" not in o:                                   # outlines-core installed (the dev extra)
        equal, compared = o["regex:phone"]["masks_equal"].split("/")
        assert equal == compared != "0"
    print_report({"model": "shakespeare", "backend": llm.engine.backend, "validity": v, "mask_cost": m,
                  "jump_forward": j, "outlines": o})
    assert "jump-forward" in capsys.readouterr().out
