"""Workload generation and replay mechanics (no timing is asserted)."""
import numpy as np
import pytest

from minillm.bench.serve import replay
from minillm.formats.loader import random_model
from minillm.workload import SkipClock, make_workload


def test_workload_is_seeded_skewed_and_shares_prefixes():
    a = make_workload(200, 512, rate=10, max_len=256, seed=3)
    assert [r.prompt_ids for r in a] == [r.prompt_ids for r in make_workload(200, 512, rate=10, max_len=256, seed=3)]
    arrivals = [r.arrival for r in a]
    assert arrivals == sorted(arrivals) and 10 < len(a) / arrivals[-1] * 2 and len(a) / arrivals[-1] < 20  # ~10/s
    lens = np.array([len(r.prompt_ids) for r in a])
    assert np.mean(lens) > np.median(lens)  # a long tail
    assert all(len(r.prompt_ids) + r.max_tokens <= 256 and r.prompt_ids[0] == 1 for r in a)
    s = make_workload(20, 512, max_len=256, shared_prefix=0.8, prompt_median=64, seed=1)
    k = min(int(round(0.8 * len(r.prompt_ids))) for r in s)
    assert len({tuple(r.prompt_ids[1:k]) for r in s}) == 1
    with pytest.raises(ValueError, match="shared_prefix"):
        make_workload(2, 512, shared_prefix=1.0)


def test_skip_clock_jumps_without_sleeping():
    c = SkipClock()
    t0 = c()
    c.skip_to(t0 + 100.0)
    assert c() >= t0 + 100.0 and c.skipped >= 99.0


@pytest.mark.parametrize("opts", [dict(), dict(batching="static"), dict(enable_prefix_caching=True)])
def test_replay_serves_every_request_exactly(opts):
    model, tok = random_model("tiny")
    wl = make_workload(6, 512, rate=50, max_len=64, prompt_median=10, output_median=5, shared_prefix=0.5, seed=2)
    r = replay(model, tok, wl, "x", max_model_len=64, block_size=4, **opts)
    assert r.requests == 6 and r.output_tokens == sum(w.max_tokens for w in wl)
    assert r.seconds >= wl[-1].arrival - wl[0].arrival and r.throughput > 0 and 0 <= r.kv_waste < 1
    assert (r.cached_tokens > 0) == bool(opts.get("enable_prefix_caching"))


def test_memory_by_request_matches_the_engines_own_peak_and_paging_wastes_less():
    from minillm.bench.serve import memory_by_request
    model, tok = random_model("tiny")
    wl = make_workload(4, 512, rate=0, prompt_median=10, output_median=8, max_len=64, seed=2)
    per_token = model.config.kv_bytes_per_token(4)
    waste = {}
    for bs in (4, 64):                                     # paged, and the contiguous cache (bs = max_model_len)
        rows = []
        for req in wl:                                     # alone, so the engine's peak is this request's
            _, engine, outs = replay(model, tok, [req], return_engine=True, block_size=bs, max_model_len=64)
            (row,) = memory_by_request(outs, bs, per_token)
            steps = engine.trace.steps
            assert row.allocated_bytes == max(s.kv_bytes_used for s in steps)
            assert row.used_bytes == max(s.kv_bytes_filled for s in steps)
            assert 0 <= row.wasted_bytes < bs * per_token
            rows.append(row)
        waste[bs] = sum(r.wasted_bytes for r in rows) / sum(r.allocated_bytes for r in rows)
    assert waste[4] < 0.25 < waste[64]
