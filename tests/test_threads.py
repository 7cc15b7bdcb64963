"""minillm/threads.py: the thread count comes from the free cores, and a user's choice is checked."""
import subprocess
import sys
import time

import pytest
import torch

from minillm import threads


@pytest.fixture
def keep_threads():
    from threadpoolctl import threadpool_limits
    before, chosen = torch.get_num_threads(), threads._chosen
    with threadpool_limits(limits=None):       # restores numpy's BLAS pool afterwards
        yield
    torch.set_num_threads(before)
    threads._chosen = chosen


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_a_bad_thread_count_names_the_cores(bad):
    with pytest.raises(ValueError, match=f"got {bad!r}.*{threads.num_cores()} cores"):
        threads.check_threads(bad)


def test_more_threads_than_cores_warns():
    with pytest.warns(UserWarning, match=f"{threads.num_cores()} cores"):
        assert threads.check_threads(threads.num_cores() + 1) == threads.num_cores() + 1


def test_a_busy_loop_beside_us_is_seen_and_leaves_a_core_free():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy = threads.busy_cores(0.3)
        assert busy >= 0.7                 # one process spinning: ~1 core (more if the machine is busier still)
        assert threads.fair_threads() <= max(1, threads.num_cores() - 1)
    finally:
        hog.kill()
        hog.wait()


def test_our_own_work_is_not_counted_as_busy(monkeypatch):
    """The arithmetic, on made-up counters: 2 CPUs, 100 jiffies each over the sample; 150 busy of which this
    process used 0.5 core's worth (its own threads): 1.5 - 0.5 = 1.0 core busy with other work."""
    readings = iter([(1000, 4000), (1150, 4200)])                      # (busy, total) jiffies, all CPUs
    own = iter([10.0, 10.0 + 0.5 * 0.2])                               # our CPU seconds over a 0.2 s sample
    monkeypatch.setattr(threads, "_cpu_jiffies", lambda: next(readings))
    monkeypatch.setattr(threads, "_own_cpu_seconds", lambda: next(own))
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    assert threads.busy_cores(0.2) == pytest.approx(1.0)


def test_use_threads_sets_torch_even_after_numba_launches(keep_threads):
    """numba's OpenMP layer, launched by its first set_num_threads, resets the pool torch shares to one per
    core: use_threads sets numba first, so torch keeps the count asked for."""
    import numba  # noqa: F401  (loaded: use_threads must handle it)
    assert threads.use_threads(1) == 1
    assert torch.get_num_threads() == 1
    assert numba.get_num_threads() == 1
    from threadpoolctl import threadpool_info
    assert all(p["num_threads"] == 1 for p in threadpool_info() if p["user_api"] == "blas")


def test_auto_threads_keeps_a_users_choice(keep_threads):
    torch.set_num_threads(1)
    threads._chosen = False
    if threads.num_cores() > 1:
        assert threads.auto_threads() == 1          # not torch's default: somebody chose; left alone


def test_print_machine_warns_when_busy(monkeypatch, capsys, keep_threads):
    from minillm.bench import sysinfo
    monkeypatch.setattr(threads, "busy_cores", lambda sample_s=0.2: 1.0)
    sysinfo.print_machine()
    assert "WARNING: this machine is busy (1.0 of" in capsys.readouterr().out
    monkeypatch.setattr(threads, "busy_cores", lambda sample_s=0.2: 0.1)
    sysinfo.print_machine()
    assert "WARNING" not in capsys.readouterr().out
