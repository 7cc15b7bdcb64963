"""A rank group: world_size processes joined by torch.distributed (gloo), rank 0 being the user's own process.

    group = start_group(2)        # once: spawns rank 1 and joins it over gloo on 127.0.0.1 (a few seconds)
    group.call(fn, *args)         # fn(state, *args) on every rank at once -> [rank 0's result, rank 1's, ...]
    LLM(model, tensor_parallel_size=2)   # engines and forwards reuse the running group (minillm.parallel.sharded)
    with group.recording() as rec: ...   # every rank's compute and communication events -> rec.events
    group.close()                 # also at exit

Ranks 1 .. N-1 are spawned processes (torch.multiprocessing, "spawn") that run one loop: take a command (a
module-level function and its arguments) from their queue, run it, repeat. Commands travel on those queues
(pickled; tensors through shared memory), as vLLM's scheduler output reaches its workers through a shared-memory
message queue; the tensors of a step travel by torch.distributed's collectives (gloo: TCP on the loopback
interface), which minillm.parallel.comm counts. Each rank computes with one torch thread (rank 0 too, while the
group runs): two ranks on two cores, not four threads fighting over them.

The group owns its gloo ProcessGroup (built from a TCPStore on a free port) rather than torch.distributed's global
default group, so it coexists with a user's own init_process_group, or with another group.

Failure: every collective waits with a timeout (30 s by default, `timeout_s`); a rank that dies closes its
sockets, so the others' collectives fail at once rather than at the timeout. Rank 0 then names the rank (its exit
code or the exception it raised), closes the group and raises RankFailure; the workers exit when rank 0 does (they
watch their parent). Idle ranks wait on their queue, not in a collective, so an idle group never times out.
"""
from __future__ import annotations

import atexit
import gc
import os
import queue
import signal
import threading
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..threads import num_cores
from .comm import Comm
from .main_module import check_sendable, hidden_main, importable_main

HOST = "127.0.0.1"
START_TIMEOUT = timedelta(seconds=300)   # joining: a spawned rank imports torch first (seconds on a busy machine)


class RankFailure(RuntimeError):
    """A rank died, raised, or did not answer within the timeout. The group is closed: start a new one."""


@dataclass
class RankState:
    """What one rank holds: who it is, its Comm, and what commands built on it (shards by id)."""
    rank: int
    world: int
    comm: Comm
    objects: dict = field(default_factory=dict)


@dataclass
class _Failed:
    rank: int
    error: str           # the worker's traceback


def _process_group(store, rank: int, world: int, timeout: timedelta):
    """A gloo ProcessGroup over TCP on the loopback interface; every op waits at most `timeout` (joining it, longer:
    a spawned rank imports torch first)."""
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=HOST)]
    opts._timeout = START_TIMEOUT
    pg = dist.ProcessGroupGloo(store, rank, world, opts)
    pg.set_timeout(timeout)
    return pg


# ---------------------------------------------------------------------------- ranks 1 .. N-1
def _worker(rank: int, world: int, port: int, timeout_s: float, commands, results, parent: int):
    torch.set_num_threads(1)
    timeout = timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(HOST, port, world, False, timeout=START_TIMEOUT)
        state = RankState(rank, world, Comm(_process_group(store, rank, world, timeout), rank, world))
        while (msg := _next_command(commands, parent)) is not None:
            fn, args, reply = msg
            out = fn(state, *args)
            if reply:
                results.put((rank, out))
    except BaseException:
        results.put((rank, _Failed(rank, traceback.format_exc())))
        results.close()
        results.join_thread()         # flushed before the exit below
        os._exit(1)                   # closes this rank's sockets now: the others' collectives stop at once


def _next_command(commands, parent: int):
    """The next command, or None when rank 0 closed the group or is gone."""
    while True:
        try:
            return commands.get(timeout=0.5)
        except queue.Empty:
            if os.getppid() != parent:
                return None


# ---------------------------------------------------------------------------- rank 0
class RankGroup:
    def __init__(self, world_size: int = 2, timeout_s: float = 30.0):
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not 0 < timeout_s < 1e6:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if world_size > num_cores():
            warnings.warn(f"a rank group of {world_size} ranks on {num_cores()} cores: the ranks take turns on the "
                          f"cores, so every collective waits for a rank that is not running (slower, not a hang: "
                          f"each waits at most timeout_s={timeout_s:g} s)", stacklevel=2)
        self.world, self.timeout_s, self.closed = world_size, float(timeout_s), False
        timeout = timedelta(seconds=timeout_s)
        ctx = mp.get_context("spawn")
        # port 0: a free port, chosen by the OS; the store's timeout covers joining, the group's every collective
        self._store = dist.TCPStore(HOST, 0, world_size, True, timeout=START_TIMEOUT, wait_for_workers=False)
        self._results = ctx.Queue()
        self._queues = [ctx.Queue() for _ in range(world_size - 1)]
        self._procs = [ctx.Process(target=_worker, name=f"minillm-rank{r}", daemon=True,
                                   args=(r, world_size, self._store.port, float(timeout_s), q, self._results,
                                         os.getpid()))
                       for r, q in enumerate(self._queues, start=1)]
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(1)
        atexit.register(self.close)
        self.main_hidden = not importable_main()        # stdin, -c, an unguarded script: ranks skip the main
        with hidden_main(self.main_hidden):
            for p in self._procs:
                p.start()
        self.state = RankState(0, world_size, Comm(self._join(timeout), 0, world_size, on_error=self._failure))

    def _join(self, timeout: timedelta):
        """Build rank 0's ProcessGroup (it waits for every rank to join), watching the workers meanwhile: one that
        dies while starting is named now, not after the timeout."""
        box = {}

        def connect():
            try:
                box["pg"] = _process_group(self._store, 0, self.world, timeout)
            except BaseException as e:           # noqa: BLE001 (reported below)
                box["error"] = e
        t = threading.Thread(target=connect, daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.05)
            if self._dead():
                raise self._failure(None, "starting the group")
        if "error" in box:
            raise self._failure(box["error"], "starting the group")
        return box["pg"]

    # ------------------------------------------------------------------ commands
    @property
    def comm(self) -> Comm:
        """Rank 0's Comm: its counters and timeline."""
        return self.state.comm

    def launch(self, fn, *args, reply: bool = False, each: Optional[list] = None):
        """Have every worker run fn(state, *args) (fn: a module-level function; args: picklable), and with `each`
        (one item per rank, rank 0's first) fn(state, *args, each[rank]). Returns at once; rank 0 then does its own
        part (the collectives pair up)."""
        self._check_open()
        check_sendable(fn, self.main_hidden)
        if self._dead():
            raise self._failure(None, f"sending {fn.__name__}")
        for r, q in enumerate(self._queues, start=1):
            q.put((fn, args + ((each[r],) if each is not None else ()), reply))

    def call(self, fn, *args, each: Optional[list] = None) -> list:
        """fn(state, *args[, each[rank]]) on every rank at once -> the results in rank order. An exception on rank 0
        closes the group (the other ranks may be waiting for it inside a collective)."""
        self.launch(fn, *args, reply=True, each=each)
        with self.closing_on_error(fn.__name__):
            results = {0: fn(self.state, *args, *((each[0],) if each is not None else ()))}
        deadline = time.monotonic() + self.timeout_s
        while len(results) < self.world:
            try:
                rank, out = self._results.get(timeout=0.05)
            except queue.Empty:
                if self._dead() or time.monotonic() > deadline:
                    raise self._failure(None, f"waiting for {fn.__name__}'s results") from None
                continue
            if isinstance(out, _Failed):
                raise self._failure(None, fn.__name__, [out])
            results[rank] = out
        return [results[r] for r in range(self.world)]

    @contextmanager
    def closing_on_error(self, what: str):
        """Rank 0's part of a step: if it raises (an interrupt included), the other ranks are left inside a
        collective, so the group is closed and the error re-raised (named, if a rank failed)."""
        try:
            yield
        except RankFailure:
            raise
        except BaseException:
            self.close()
            raise

    @contextmanager
    def recording(self):
        """Every rank's events while the block runs: `with group.recording() as rec: ...` then rec.events, sorted
        by start (minillm.parallel.timeline)."""
        rec = Recording()
        self.call(_timeline_on)
        try:
            yield rec
        finally:
            if not self.closed:
                rec.events = sorted((e for events in self.call(_timeline_take) for e in events),
                                    key=lambda e: e.start)

    def comm_stats(self) -> list:
        """Every rank's counters: [{"totals": {op: bytes}, "calls": {op: n}}, ...] in rank order."""
        return self.call(_stats)

    # ------------------------------------------------------------------ failure and shutdown
    def _dead(self) -> list:
        return [(r, p) for r, p in enumerate(self._procs, start=1) if p.exitcode is not None]

    def _failure(self, exc: Optional[BaseException], what: str, failed: Optional[list] = None) -> RankFailure:
        """Name what failed and close the group. -> the RankFailure to raise."""
        deadline = time.monotonic() + 1.0               # a dead peer's socket closes before its exit is reported
        while not self._dead() and time.monotonic() < deadline:
            time.sleep(0.01)
        failed = list(failed or [])
        while True:
            try:
                _, out = self._results.get(timeout=0.05 if self._dead() else 0.0)
            except (queue.Empty, OSError, ValueError):
                break
            if isinstance(out, _Failed):
                failed.append(out)
        dead = self._dead()
        self.close()
        lines = []
        for f in failed:
            last = f.error.strip().splitlines()[-1]
            lines.append(f"rank {f.rank} raised {last}\n{f.error}")
        for rank, p in dead:
            if not any(f.rank == rank for f in failed):
                lines.append(f"rank {rank} (pid {p.pid}) died ({_exit_reason(p.exitcode)}; anything it printed is "
                             f"on this process's stderr)")
        if not lines:
            reason = f"{exc}" if exc is not None else "no answer"
            lines.append(f"no rank exited; rank 0 got: {reason} (every collective waits at most "
                         f"timeout_s={self.timeout_s:g} s)")
        return RankFailure(f"rank group failed during {what}: " + "; ".join(lines) +
                           ". The group is closed: start a new one (minillm.parallel.start_group).")

    def _check_open(self):
        if self.closed:
            raise RankFailure("this rank group is closed (a rank failed, or close() was called): start a new one "
                              "(minillm.parallel.start_group) and build the engine again")

    def live_objects(self) -> list:
        """Ids of the shards rank 0 still holds (engines and models using this group)."""
        return list(self.state.objects) if hasattr(self, "state") else []

    def close(self):
        """Stop the workers (they finish their command first, for at most a second each); idempotent."""
        global _default
        if self.closed:
            return
        self.closed = True
        for q in self._queues:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for p in self._procs:
            if p.pid is not None:
                p.join(timeout=1.0)
                if p.exitcode is None:
                    p.terminate()
                    p.join(timeout=1.0)
        for q in self._queues + [self._results]:
            q.cancel_join_thread()
            q.close()
        if hasattr(self, "state"):
            self.state.objects.clear()
        torch.set_num_threads(self._threads_before)
        atexit.unregister(self.close)
        if _default is self:
            _default = None

    def __repr__(self) -> str:
        pids = [os.getpid()] + [p.pid for p in self._procs]
        return f"RankGroup({self.world} ranks, pids {pids}, timeout_s={self.timeout_s:g}" + \
            (", closed)" if self.closed else ")")


@dataclass
class Recording:
    events: list = field(default_factory=list)      # minillm.parallel.timeline.Event, every rank's, by start


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {-code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _timeline_on(state: RankState):
    state.comm.timeline.take()
    state.comm.timeline.enabled = True


def _timeline_take(state: RankState) -> list:
    state.comm.timeline.enabled = False
    return state.comm.timeline.take()


def _stats(state: RankState) -> dict:
    return {"totals": dict(state.comm.totals), "calls": dict(state.comm.calls)}


# ---------------------------------------------------------------------------- the running group
_default: Optional[RankGroup] = None


def start_group(world_size: int = 2, timeout_s: Optional[float] = None) -> RankGroup:
    """The process's rank group of world_size ranks: the running one if it has that size (and timeout_s, when
    given), else a new one (default timeout 30 s). Engines (LLM(..., tensor_parallel_size=N)) call this too, so a
    notebook starts the group once and every engine after reuses it. A running group of another size is closed
    first, unless engines still use it (ValueError: close them, or the group, first)."""
    global _default
    g = _default
    if g is not None and not g.closed and g.world == world_size and timeout_s in (None, g.timeout_s):
        return g
    if g is not None and not g.closed:
        if g.live_objects():
            gc.collect()                    # an engine dropped but caught in a reference cycle
        if g.live_objects():
            raise ValueError(f"a rank group of {g.world} ranks is running with {len(g.live_objects())} model(s) on "
                             f"it; a group of {world_size} needs it closed: delete those engines or call "
                             f"group.close() first")
        g.close()
    _default = RankGroup(world_size, 30.0 if timeout_s is None else timeout_s)
    return _default


def current_group() -> Optional[RankGroup]:
    """The running group started by start_group, or None."""
    return _default if _default is not None and not _default.closed else None
