"""minillm/threads.py: the thread count comes from the free cores, and a user's choice is checked."""
import subprocess
import sys
import time

import pytest
import torch

from minillm import threads


@pytest.fixture
def keep_threads():
    before, chosen = torch.get_num_threads(), threads._chosen
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


def test_our_own_work_is_not_counted_as_busy():
    import threading
    stop = time.time() + 0.5

    def spin():
        while time.time() < stop:
            pass
    t = threading.Thread(target=spin)
    t.start()
    busy = threads.busy_cores(0.3)       # our own thread spins: excluded
    t.join()
    assert busy < 0.9


def test_use_threads_sets_torch_even_after_numba_launches(keep_threads):
    """numba's OpenMP layer, launched by its first set_num_threads, resets the pool torch shares to one per
    core: use_threads sets numba first, so torch keeps the count asked for."""
    import numba  # noqa: F401  (loaded: use_threads must handle it)
    assert threads.use_threads(1) == 1
    assert torch.get_num_threads() == 1
    assert numba.get_num_threads() == 1


def test_auto_threads_keeps_a_users_choice(keep_threads):
    torch.set_num_threads(1)
    threads._chosen = False
    if threads.num_cores() > 1:
        assert threads.auto_threads() == 1          # not torch's default: somebody chose; left alone
