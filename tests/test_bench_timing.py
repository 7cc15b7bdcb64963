"""minillm.bench.timing: warm-up first, rounds interleaved with a rotating order, medians, spreads and paired
ratios. A fake clock makes every number exact: no timing in this test."""
import pytest

from minillm.bench.timing import Timing, interleaved


def test_warms_up_every_setting_first_then_rotates_the_order_each_round():
    calls = []
    runs = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    interleaved(runs, repeats=3, warmup=1, clock=iter(range(100)).__next__)
    assert calls[:3] == ["a", "b", "c"]                                   # warm-up, unmeasured
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]     # nobody always first


def test_a_run_that_reports_its_own_seconds_is_charged_exactly_that():
    t = interleaved({"x": lambda: 0.5, "y": lambda: 2.0}, repeats=2, warmup=0)
    assert t.samples == {"x": [0.5, 0.5], "y": [2.0, 2.0]}
    assert t.ratio("y", "x") == 4 and t.speedup("x", "y") == (4, 4, 4)


def test_medians_spreads_and_paired_ratios():
    t = Timing({"fast": [1.0, 2.0, 1.5], "slow": [2.0, 3.0, 4.5]})
    assert t.median("fast") == 1.5 and t.spread("slow") == (2.0, 4.5)
    assert t.ratios("slow", "fast") == [2.0, 1.5, 3.0]
    assert t.speedup("fast", "slow") == (2.0, 1.5, 3.0)
    assert t.text("fast") == "1500.00 ms (1000.00-2000.00, 3 rounds)"
    assert t.speedup_text("fast", "slow") == "2.00x (1.50-3.00 over 3 rounds)"


def test_the_clock_times_a_run_that_returns_anything_but_a_number():
    ticks = iter([0.0, 0.25, 1.0, 1.75])
    t = interleaved({"a": lambda: None, "b": lambda: [1.0, 2.0]}, repeats=1, warmup=0, clock=ticks.__next__)
    assert t.samples == {"a": [0.25], "b": [0.75]}


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one"):
        interleaved({})
    with pytest.raises(ValueError, match="repeats"):
        interleaved({"a": lambda: 1.0}, repeats=0)
    with pytest.raises(ValueError, match="positive"):
        interleaved({"a": lambda: 0.0}, repeats=1, warmup=0)
