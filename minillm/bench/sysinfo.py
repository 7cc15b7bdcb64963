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
    for k, v in machine_info().items():
        print(f"{k:>14}: {v}")
