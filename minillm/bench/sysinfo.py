"""What machine a measurement ran on: the first cell of every notebook prints this."""
from __future__ import annotations

import os
import platform


def machine_info() -> dict:
    import numpy
    import torch
    info = {"python": platform.python_version(), "os": f"{platform.system()} {platform.release()}",
            "cpu": _cpu_name(), "cores": os.cpu_count(), "torch threads": torch.get_num_threads(),
            "torch": torch.__version__, "numpy": numpy.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}
    try:
        import numba
        info["numba"] = numba.__version__
    except ImportError:
        pass
    return info


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def print_machine():
    """The first cell of every notebook: what this machine is, how busy it is now, and the thread count the
    engine will use (the free cores, minillm/threads.py). Warns when other work holds a core."""
    from ..threads import auto_threads, busy_cores, num_cores
    busy = busy_cores()
    threads = auto_threads(busy)                  # the same sample: the free cores
    for k, v in machine_info().items():
        print(f"{k:>14}: {v}")
    print(f"{'busy now':>14}: other processes use {busy:.1f} of {num_cores()} cores")
    if busy >= 0.5:
        print(f"WARNING: this machine is busy ({busy:.1f} of {num_cores()} cores taken by other work). Timings in "
              "this notebook will be slower and noisier than on an idle machine; the engine uses "
              f"{threads} thread(s) so it does not spin-wait on a taken core, and the serving lessons use a "
              "simulated clock, so their plots keep their shape. Close other programs for cleaner numbers.")
