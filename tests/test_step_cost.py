"""The simulated clock of the serving lessons (minillm/bench/step_cost.py): the cost model fits what it is
given, a replay timed by it is the same on any machine, and the serving claims the notebooks make hold
under it (these are the assertions that used to sit in lesson cells, where a busy laptop failed them)."""
import pytest

from minillm.bench.serve import replay
from minillm.bench.step_cost import StepCost
from minillm.core.trace import StepRecord
from minillm.workload import SimClock, make_workload

COST = StepCost(overhead_s=5e-3, row_s=3e-4, token_s=2e-4)     # a laptop-like model: fixed, so tests are exact


def record(rows, tokens, seconds):
    return StepRecord(0, "decode", list(range(rows)), 0, tokens, 0, 0, 0, 0, 0.0, seconds)


def test_the_fit_recovers_the_terms_it_was_made_from():
    steps = [record(r, t, COST.seconds(r, t)) for r in (1, 2, 4, 8) for t in (r, r + 16, r + 64)]
    fit = StepCost.from_trace(steps)
    assert fit.overhead_s == pytest.approx(COST.overhead_s, rel=1e-6)
    assert fit.row_s == pytest.approx(COST.row_s, rel=1e-6)
    assert fit.token_s == pytest.approx(COST.token_s, rel=1e-6)


def test_the_fit_never_goes_negative():
    steps = [record(r, r, 0.01 - 0.001 * r) for r in range(1, 6)]      # cost falling with rows: nonsense
    fit = StepCost.from_trace(steps)
    assert min(fit.overhead_s, fit.row_s, fit.token_s) >= 0


def test_the_median_fit_recovers_the_terms_and_refuses_a_non_positive_one():
    groups = {(r, t): [COST.seconds(r, t) * f for f in (1.0, 1.02, 5.0)]       # one stalled step in each: medians
              for r, t in [(1, 1), (4, 4), (16, 16), (1, 8), (1, 32), (1, 96)]}
    fit = StepCost.fit_medians(groups)
    assert (fit.overhead_s, fit.row_s, fit.token_s) == pytest.approx(
        (COST.overhead_s * 1.02, COST.row_s * 1.02, COST.token_s * 1.02), rel=1e-6)
    flat = {(r, r): [1e-3 + 0.5e-4 * r] for r in (1, 4, 16)} | {(1, t): [1e-3 - 0.5e-4 + 1e-4 * t] for t in (8, 32)}
    with pytest.raises(ValueError, match="not positive .*per row -0.050 ms"):
        StepCost.fit_medians(flat)                  # a decode row cheaper than a prefill token: no per-row cost


def test_the_sim_clock_moves_only_when_told():
    c = SimClock()
    c.advance(0.5)
    c.skip_to(0.2)                   # never backwards
    assert c() == 0.5
    c.skip_to(2.0)
    assert c() == 2.0


def test_calibration_gives_a_positive_cost(shakespeare):
    model, tok = shakespeare
    cost = StepCost.calibrate(model, tok)
    assert min(cost.overhead_s, cost.row_s, cost.token_s) > 0          # a step, a row and a token each cost time
    assert cost.seconds(16, 16) < 16 * cost.seconds(1, 1)               # so batching 16 decodes saves time


@pytest.fixture(scope="module")
def shakespeare():
    from minillm import load
    return load("shakespeare")


def test_a_simulated_replay_is_the_same_every_time(shakespeare):
    model, tok = shakespeare
    wl = make_workload(8, tok.vocab_size, rate=30.0, prompt_median=16, output_median=8, max_len=128, seed=0)
    a, b = (replay(model, tok, wl, step_cost=COST, max_model_len=128) for _ in range(2))
    assert a == b


def test_ttft_p99_grows_with_load_under_the_cost_model(shakespeare):
    model, tok = shakespeare
    rates = [5, 1000]                # well under capacity (about 30 requests/s here) and far past it
    p99 = [replay(model, tok, make_workload(12, tok.vocab_size, rate=r, prompt_median=32, output_median=16,
                                            max_len=256, seed=1), step_cost=COST, max_model_len=256).ttft_p99
           for r in rates]
    assert p99[0] * 2 < p99[-1]


def test_chunked_prefill_shortens_the_longest_decode_stall(shakespeare):
    """A long prompt arriving while others decode: without chunking one step carries the whole prompt and
    every decode waits for it; with a token budget no step is longer than the budget's cost."""
    model, tok = shakespeare
    wl = make_workload(4, tok.vocab_size, rate=0, prompt_median=4, output_median=40, output_sigma=0.01,
                       max_len=512, seed=2)
    wl.append(type(wl[0])(0.05, [1] + list(range(300, 600)), 4))                   # a 301-token prompt at 50 ms
    worst = {}
    for chunked in (False, True):
        _, engine, _ = replay(model, tok, wl, return_engine=True, step_cost=COST, max_model_len=512,
                              enable_chunked_prefill=chunked, max_num_batched_tokens=64 if chunked else None)
        ends = [s.start + s.seconds for s in engine.trace.steps if s.num_decode_tokens]
        worst[chunked] = max(b - a for a, b in zip(ends, ends[1:]))       # the longest wait between two tokens
    assert worst[True] < worst[False] / 2


def test_dynamic_batching_waits_out_its_window_on_the_simulated_clock(shakespeare):
    """A dynamic batch waits for its window with no model call: the simulated clock must jump to the window's
    end (it once stood still, and the replay never returned)."""
    model, tok = shakespeare
    wl = make_workload(3, tok.vocab_size, rate=5.0, prompt_median=8, output_median=4, max_len=128, seed=3)
    r = replay(model, tok, wl, step_cost=COST, max_model_len=128, batching="dynamic", batch_window_s=0.05)
    assert r.requests == 3
    assert r.ttft_p50 >= 0.05              # every first token waited for a window (no batch filled it sooner)
