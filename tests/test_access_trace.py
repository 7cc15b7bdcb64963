"""minillm.kernels.access_trace outside the simulator: the log is plain data, and recording refuses
with a message that says how to turn the simulator on (the recordings themselves: tests/cudasim)."""
import numpy as np
import pytest
from minillm.kernels import simulating
from minillm.kernels.access_trace import Access, AccessLog, record_accesses
from minillm.kernels.matmul import matmul_tiled


def small_log():
    """Two threads of one block: thread 0 reads a[0] twice (global) and s[1] (shared), thread 1 writes a[3]."""
    log = AccessLog((1, 1, 1), (2, 1, 1), shapes={"a": (2, 2), "s": (4,)}, spaces={"a": "global", "s": "shared"})
    t0, t1, b = (0, 0, 0), (1, 0, 0), (0, 0, 0)
    log.events += [Access(b, t0, "a", 0, "read"), Access(b, t0, "a", 0, "read"), Access(b, t0, "s", 1, "read"),
                   Access(b, t1, "a", 3, "write")]
    return log


def test_counts_and_totals():
    log = small_log()
    assert log.reads_per_element("a").tolist() == [[2, 0], [0, 0]]
    assert log.writes_per_element("a").tolist() == [[0, 0], [0, 1]]
    assert log.reads_per_element("s").tolist() == [0, 1, 0, 0]
    assert log.global_reads_total == 2 and log.shared_reads_total == 1
    assert len(log.thread_events(0, 0)) == 3 and len(log.thread_events((0, 0, 0), (1, 0))) == 1
    assert log.touched("a", 0, 0) == [(0, 0)] and log.touched("a", 0, 1, "write") == [(1, 1)]
    with pytest.raises(ValueError, match="no array named 'b'"):
        log.reads_per_element("b")
    with pytest.raises(ValueError, match="1 to 3 components"):
        log.thread_events(0, (1, 2, 3, 4))


def test_refuses_without_the_simulator():
    if simulating():
        pytest.skip("this process runs the simulator; tests/cudasim checks the refusal with a monkeypatch")
    x = np.ones((2, 2), np.float32)
    with pytest.raises(RuntimeError, match="use_simulator"):
        record_accesses(matmul_tiled, (1, 1), (16, 16), x, x, x)
