"""What the server tests share: the engine loop's counters, and waiting for it to be idle."""
import time

import httpx


def stats(server) -> dict:
    """The engine loop's counters (GET /stats): requests, running, waiting, free_blocks of num_blocks, streams."""
    return httpx.get(f"http://{server.host}:{server.port}/stats").json()


def wait_idle(server, timeout_s: float = 20.0) -> dict:
    """The loop applies aborts between steps: wait until it holds no request, then its counters."""
    deadline = time.monotonic() + timeout_s
    while (s := stats(server))["requests"] and time.monotonic() < deadline:
        time.sleep(0.02)
    return s
