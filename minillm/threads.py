"""How many threads to compute with: the cores that are actually free, not the cores that exist.

torch's and numba's OpenMP pools spin-wait between parallel regions. When another process holds one of
two cores, a 2-thread pool keeps waiting on a thread that is not running, and batch-1 decode of a small
model falls from ~140 to ~40 tok/s here (sometimes to 3); with 1 thread it keeps ~140. So the engine, the
CLI and the notebooks ask `fair_threads()`: the machine's cores minus the CPU time other processes used
over a short sample (Linux /proc/stat; else the 1-minute load average), at least 1.
`python -m minillm bench decode --busy` measures the difference with a busy loop running beside it.
"""
from __future__ import annotations

import os
import time
import warnings

_chosen = False          # a thread count was set in this process (by the user through us, or automatically)


def num_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's first line; None where there is none."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)       # idle + iowait
    total = sum(parts[:8])                                      # guest time is already inside user time
    return total - idle, total


def _own_cpu_seconds() -> float:
    return time.process_time()


def busy_cores(sample_s: float = 0.2) -> float:
    """Cores' worth of CPU that *other* processes used during the last `sample_s` seconds (or, without
    /proc/stat, the 1-minute load average)."""
    a, own0 = _cpu_jiffies(), _own_cpu_seconds()
    if a is None:
        try:
            return float(os.getloadavg()[0])
        except OSError:
            return 0.0
    time.sleep(sample_s)
    b, own1 = _cpu_jiffies(), _own_cpu_seconds()
    busy, total = b[0] - a[0], b[1] - a[1]
    if total <= 0:
        return 0.0
    ncpu = os.cpu_count() or 1
    used = busy / total * ncpu                                  # cores' worth busy, this process included
    return max(0.0, used - (own1 - own0) / sample_s)


def fair_threads(busy: float | None = None) -> int:
    """Threads to use: the free cores (cores this process may run on minus `busy`, other processes' load,
    sampled now unless given), >= 1."""
    busy = busy_cores() if busy is None else busy
    return max(1, min(num_cores(), round(num_cores() - busy)))


def check_threads(n: int) -> int:
    """A thread count the user asked for: 0 or less is an error; more than the cores is allowed, with a warning."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"threads must be a whole number >= 1, got {n!r} (this machine has {num_cores()} cores)")
    if n > num_cores():
        warnings.warn(f"threads={n} is more than this machine's {num_cores()} cores: the threads will take turns "
                      "on the cores and spin-wait for each other, which is usually slower", stacklevel=2)
    return n


def use_threads(n: int | None = None, busy: float | None = None) -> int:
    """Set torch's, numpy's BLAS and (if loaded) numba's thread count: `n` if given (checked), else fair_threads().
    Returns the count set."""
    import sys

    import torch
    global _chosen
    n = check_threads(n) if n is not None else fair_threads(busy)
    if "numba" in sys.modules:   # first: launching numba's OpenMP layer resets the shared pool to one per core
        import numba
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(n)
    try:                         # numpy's BLAS (OpenBLAS) has a spinning pool of its own
        from threadpoolctl import threadpool_limits
        threadpool_limits(n, user_api="blas")
    except ImportError:
        pass
    _chosen = True
    return n


def auto_threads(busy: float | None = None) -> int:
    """The engine's and the CLI's default: once per process, if nobody has chosen a thread count (torch is at
    its own default, one per core), use fair_threads(busy). Returns torch's thread count."""
    global _chosen
    import torch
    if not _chosen and torch.get_num_threads() == (os.cpu_count() or 1):
        use_threads(busy=busy)
    _chosen = True
    return torch.get_num_threads()
