"""Guided compiles in worker processes (the server's): a pattern's DFA is built in a child Python, so that a hostile
pattern's compile holds none of the server's GIL, and its time budget holds even where a check comes late.

Why a process and not a thread: built in a thread of the server, a 2 s compile stalled 20 streams for 0.5-0.9 s
and /health for 0.25 s (minillm.serve.hostile): numpy calls of 100-200 ms (np.unique over a (S, 256) table, the
gathers of the subset construction) hold the GIL whole, and the event loop waits for it again after every send
(Beazley's "convoy effect"). vLLM compiles grammars in a thread only because xgrammar's C++ releases the GIL.

    a prepare thread --(function, args) pickled--> child `python -m minillm.guided.workers` (imports minillm once)
                     <--("ok", result) | ("error", exception)--
The child checks the budget itself (minillm.guided.budget) and raises its own message; the parent waits the
budget plus GRACE_S, then kills the child (a new one starts for the next compile) and refuses the request.
"""
from __future__ import annotations

import gc
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Optional

GRACE_S = 2.0           # past the budget, the parent stops waiting for the child's own refusal and kills it


def _write(f, obj):
    data = pickle.dumps(obj)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _read_exact(fd: int, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError("the compile worker exited")
        out += chunk
    return bytes(out)


class CompileWorkers:
    """Up to `processes` children, started on demand and kept; run() borrows an idle one (or waits for one, within
    the timeout). close() kills them all. Safe to call from several threads."""

    def __init__(self, processes: int = 2):
        self.processes = processes
        self._idle: queue.Queue = queue.Queue()
        self._all: list = []
        self._lock = threading.Lock()

    def start(self) -> "CompileWorkers":
        """Start one child now (its imports take a second or two, better spent before the first request)."""
        self._idle.put(self._spawn())
        return self

    def _spawn(self) -> subprocess.Popen:
        with self._lock:
            path = os.pathsep.join(p or os.getcwd() for p in sys.path)      # what this process imports from
            child = subprocess.Popen([sys.executable, "-m", "minillm.guided.workers"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path})
            self._all.append(child)
            return child

    def _borrow(self, deadline: float) -> subprocess.Popen:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            room = len(self._all) < self.processes
        if room:
            return self._spawn()
        try:
            return self._idle.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("no compile worker became free") from None

    def _retire(self, child: subprocess.Popen):
        child.kill()
        child.wait()
        with self._lock:
            if child in self._all:
                self._all.remove(child)

    def run(self, fn, args: tuple, timeout_s: Optional[float] = None):
        """fn(*args) in a child; its exception re-raised here. TimeoutError after timeout_s (the child killed)."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else 1e9)
        child = self._borrow(deadline)
        try:
            _write(child.stdin, (fn, args))
            fd = child.stdout.fileno()
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError("the compile worker did not answer in time")
            n, = struct.unpack("<Q", _read_exact(fd, 8))
            status, value = pickle.loads(_read_exact(fd, n))
        except BaseException:                  # timed out, died, or interrupted mid-message: never reuse it
            self._retire(child)
            raise
        self._idle.put(child)
        if status == "error":
            raise value
        return value

    def close(self):
        with self._lock:
            children, self._all = list(self._all), []
        for child in children:
            child.kill()
            child.wait()


def main():
    """The child's loop: one (function, args) after another from stdin, each answer to the real stdout."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                              # a stray print goes to stderr, never into the answers
    fd = sys.stdin.fileno()
    while True:
        try:
            n, = struct.unpack("<Q", _read_exact(fd, 8))
        except EOFError:                       # the parent closed the pipe: it is done with us
            return
        fn, args = pickle.loads(_read_exact(fd, n))
        try:
            answer = ("ok", fn(*args))
        except Exception as e:                 # the caller's to report (a RegexError, a budget's refusal)
            answer = ("error", e)
        try:
            _write(out, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            _write(out, ("error", RuntimeError(f"the compile worker's answer did not pickle: {e}")))
        del answer
        gc.collect()                           # a big pattern's garbage, now, between requests (not in the next one)


if __name__ == "__main__":
    main()
