"""The rank group (minillm.parallel.group): commands on every rank, collectives counted, reuse, and failure: a rank
that raises or is killed is named and the group closed at once, a rank that does not answer is named after the
timeout, more ranks than cores is a warning. Each failing case breaks its own group (a few seconds to start)."""
import os
import signal
import time

import pytest
import torch
from parallel_helpers import module_group

from minillm.parallel import RankFailure, RankGroup, TensorParallelModel, start_group
from minillm.parallel import group as group_mod

group = module_group()


def _whoami(state):
    return state.rank, os.getpid(), torch.get_num_threads()


def _all_reduce_rank(state):
    return float(state.comm.all_reduce(torch.full((8,), float(state.rank + 1)))[0])


def test_every_rank_runs_the_command_with_one_thread(group):
    out = group.call(_whoami)
    assert [r for r, _, _ in out] == [0, 1]
    assert out[0][1] == os.getpid() != out[1][1]
    assert [n for _, _, n in out] == [1, 1]                  # one torch thread per rank, rank 0 included


def test_collectives_sum_and_are_counted(group):
    before = dict(group.comm.totals)
    assert group.call(_all_reduce_rank) == [3.0, 3.0]        # 1 + 2 on both ranks
    assert group.comm.totals["all_reduce"] - before["all_reduce"] == 8 * 4
    stats = group.comm_stats()
    assert stats[0]["totals"]["all_reduce"] == stats[1]["totals"]["all_reduce"]


def test_start_group_reuses_the_running_group_and_guards_its_models(group):
    assert start_group(2) is group
    from minillm.formats.loader import random_model
    tp = TensorParallelModel(random_model("tiny")[0], group)
    with pytest.raises(ValueError, match="a rank group of 2 ranks is running with 1 model"):
        start_group(3)
    tp.close()
    assert group.live_objects() == [] and not group.closed


def _raise_on_rank_1(state):
    if state.rank == 1:
        raise ValueError("a bug on rank 1")
    return state.comm.all_reduce(torch.ones(4))              # rank 0 waits here for a rank that is gone


def test_a_rank_that_raises_is_named_and_the_group_closed(monkeypatch):
    monkeypatch.setattr(group_mod, "num_cores", lambda: 1)   # more ranks than cores: a warning, not a hang
    with pytest.warns(UserWarning, match="2 ranks on 1 cores"):
        g = RankGroup(2, timeout_s=20)
    try:
        t0 = time.monotonic()
        with pytest.raises(RankFailure, match="rank 1 raised ValueError: a bug on rank 1"):
            g.call(_raise_on_rank_1)
        assert time.monotonic() - t0 < 10                    # at once, not after the 20 s timeout
        assert g.closed
        with pytest.raises(RankFailure, match="closed"):
            g.call(_whoami)
    finally:
        g.close()


def test_a_killed_rank_is_named_and_the_forward_stops(tiny_model):
    g = RankGroup(2, timeout_s=20)
    try:
        tp = TensorParallelModel(tiny_model, g)
        tokens = torch.randint(0, 512, (2, 5))
        tp(tokens)
        pid = g.call(_whoami)[1][1]
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RankFailure, match=r"rank 1 \(pid \d+\) died \(killed by signal 9, SIGKILL"):
            for _ in range(3):                               # detected before the next command, or inside it
                tp(tokens)
        assert time.monotonic() - t0 < 10 and g.closed
    finally:
        g.close()


def _late_on_rank_1(state, seconds):
    if state.rank == 1:
        time.sleep(seconds)
    return state.comm.all_reduce(torch.ones(4))


def test_a_rank_that_does_not_answer_times_out_with_a_message():
    g = RankGroup(2, timeout_s=1.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(RankFailure, match=r"no rank exited.*timeout_s=1.5"):
            g.call(_late_on_rank_1, 30.0)
        assert time.monotonic() - t0 < 10
    finally:
        g.close()


def test_bad_group_arguments():
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="world_size must be a whole number >= 1"):
            RankGroup(bad)
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        RankGroup(2, timeout_s=0)


@pytest.fixture(scope="module")
def tiny_model():
    from minillm.formats.loader import random_model
    return random_model("tiny")[0]
