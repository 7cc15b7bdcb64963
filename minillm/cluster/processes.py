"""Measure it for real: engines as separate processes on the wall clock (one torch thread each).

    run = replay_routed_processes(model, tokenizer, workload, "prefix_aware", 2, **options)   # a RoutedRun
    res = disagg_processes(model, tokenizer, workload, **options)    # outputs + each handover's bytes and seconds

Data parallelism: this process is the router; each replica is a process running an LLMEngine loop (add requests
from its pipe, step, send finished outputs back). Requests are sent at their arrival times (this process waits for
them: real serving cannot skip ahead), routed by the same Router as on the simulated clock, with the loads it counts
from the finished outputs it receives.

Disaggregation: a prefill process and a decode process, and a pipe from the first to the second. The prefill
process steps its engine and sends every sequence whose first token is out as a KVHandover (minillm.cluster.
kv_transfer.send_handover: a pickled header, then the K/V tensors' raw bytes); the decode process receives it,
takes it in when its pool has room, and decodes. The transfer time of a handover is measured from the moment the
prefill engine let go of it to the moment the decode process has its last byte (pickling, the pipe, unpickling),
on CLOCK_MONOTONIC, which every process of a Linux machine shares.

Processes are started by a fork server (context(): forked from a clean process that has imported the engine once, so
no torch thread pool is inherited); a worker that fails sends its traceback and exits, and this side raises it;
every wait has a timeout, so nothing hangs.
"""
from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from multiprocessing.connection import wait
from typing import Optional

from .router import CacheAware, Router, check_policy, check_replicas

START_TIMEOUT_S = 120.0     # a worker loads its model and warms up within this
PRELOAD = ["minillm.cluster.processes", "minillm.engine.engine", "minillm.formats.loader"]


def context():
    """"forkserver" where there is one (Linux, macOS): a server process imports torch and the engine once, then
    forks a fresh worker from that clean state for each start (no thread pool inherited, no second import: a
    worker starts in well under a second after the first); else "spawn"."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return mp.get_context("spawn")


# ---------------------------------------------------------------------------- the workers (in their processes)
def _engine(model, tokenizer, options: dict, t0: list):
    """An LLMEngine on one thread whose clock is CLOCK_MONOTONIC minus t0[0] (set when the run starts)."""
    from ..config import EngineConfig
    from ..engine.engine import LLMEngine
    from ..formats.loader import load
    from ..threads import use_threads
    use_threads(1)
    net, tok = load(model, tokenizer, options.get("dtype", "float32"))
    return LLMEngine.from_model(net, tok, EngineConfig(**options), clock=lambda: time.monotonic() - t0[0])


def _warm_up(engine):
    """One short request, so that the first real step does not pay for first-call costs."""
    from .replica import trace_params
    engine.add_request([1, 2, 3], trace_params(2))
    while engine.has_unfinished_requests():
        engine.step()
    engine.pop_finished()


def _add(engine, msg):
    from .replica import trace_params
    _, rid, ids, max_tokens, arrival = msg
    engine.add_request(ids, trace_params(max_tokens), request_id=rid, arrival_time=arrival)


def _busy_s(engine) -> float:
    return sum(s.seconds for s in engine.trace.steps)


def _start(conn, model, tokenizer, options):
    """A worker's start: its engine loaded and warmed up, "ready" sent, the run's start time received."""
    t0 = [time.monotonic()]
    engine = _engine(model, tokenizer, options, t0)
    _warm_up(engine)
    engine.trace.steps.clear()
    conn.send(("ready",))
    t0[0] = conn.recv()[1]
    return engine


def _engine_main(conn, model, tokenizer, options, to_decode=None):
    """A replica, or (to_decode: the pipe to the decode process) the prefill engine: ("add", id, ids, max_tokens,
    arrival) in; ("done", RequestOutput) out; the prefill engine sends every sequence whose first token is out to the
    decode process (send_handover) and an empty message when it stops."""
    from .disagg import take_ready
    from .kv_transfer import send_handover
    try:
        engine = _start(conn, model, tokenizer, options)
        while True:
            while not engine.has_unfinished_requests() or conn.poll():
                msg = conn.recv()
                if msg[0] == "stop":
                    if to_decode is not None:
                        to_decode.send_bytes(b"")            # the decode process: no more handovers
                    conn.send(("stats", _busy_s(engine)))
                    return
                _add(engine, msg)
            engine.step()
            for out in engine.pop_finished():
                conn.send(("done", out))
            for h in take_ready(engine) if to_decode is not None else ():
                send_handover(to_decode, h)
    except Exception:
        conn.send(("error", traceback.format_exc()))


def _receiver(from_prefill, engine_clock, arrived, conn_lock, conn):
    """The decode process's receiving thread: reads each handover as soon as it is sent (while the engine steps),
    stamps its arrival, reports ("transfer", id, blocks, bytes, seconds), and queues it for the engine loop; None
    queued at the end (the prefill process's end marker, or its pipe closed)."""
    from .kv_transfer import recv_handover
    while True:
        try:
            h = recv_handover(from_prefill)
        except EOFError:
            arrived.put(None)
            return
        now = engine_clock()
        with conn_lock:
            conn.send(("transfer", h.request_id, h.num_blocks, h.nbytes, now - h.sent_at))
        arrived.put((now, h))


def _decode_main(conn, from_prefill, model, tokenizer, options):
    """The decode engine: handovers in (timed by a receiving thread), outputs out."""
    import queue
    import sys
    import threading

    from .disagg import Inbox
    sys.setswitchinterval(2e-4)      # the receiving thread gets the GIL within 0.2 ms of a handover landing (not 5)
    try:
        engine = _start(conn, model, tokenizer, options)
        inbox, arrived, lock = Inbox(engine), queue.Queue(), threading.Lock()
        threading.Thread(target=_receiver, args=(from_prefill, engine.clock, arrived, lock, conn), daemon=True).start()
        open_ = True
        while open_ or inbox or engine.has_unfinished_requests():
            idle = not (inbox or engine.has_unfinished_requests())
            while open_:
                try:
                    got = arrived.get(block=idle)
                except queue.Empty:
                    break
                if got is None:
                    open_ = False
                    break
                inbox.put(got[1], got[0])
                idle = False
            inbox.receive()
            if engine.has_unfinished_requests():
                engine.step()
                for out in engine.pop_finished():
                    with lock:
                        conn.send(("done", out))
        conn.recv()                                          # "stop"
        conn.send(("stats", _busy_s(engine)))
    except Exception:
        conn.send(("error", traceback.format_exc()))


# ---------------------------------------------------------------------------- this side
class _Workers:
    """Started worker processes and their pipes: start, wait until ready, collect messages, stop; a worker's error
    or a timeout is raised here, and every process is ended on the way out."""

    def __init__(self, targets: list, timeout_s: float):
        ctx = context()
        self.conns, self.procs, self.timeout_s = [], [], timeout_s
        try:
            for target, args in targets:
                mine, theirs = ctx.Pipe()
                p = ctx.Process(target=target, args=(theirs, *args), daemon=True)
                p.start()
                self.conns.append(mine)
                self.procs.append(p)
            for i in range(len(self.conns)):
                self.expect(i, "ready", START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        self.t0 = time.monotonic()
        for c in self.conns:
            c.send(("start", self.t0))

    def now(self) -> float:
        return time.monotonic() - self.t0

    def expect(self, i: int, kind: str, timeout_s: float):
        msg = self._recv(i, timeout_s)
        if msg[0] != kind:
            raise RuntimeError(f"worker {i} sent {msg[0]!r}, expected {kind!r}")
        return msg

    def _recv(self, i: int, timeout_s: float):
        if not self.conns[i].poll(timeout_s):
            raise RuntimeError(f"worker {i} did not answer within {timeout_s:.0f} s "
                               f"(alive: {self.procs[i].is_alive()})")
        try:
            msg = self.conns[i].recv()
        except EOFError:
            raise RuntimeError(f"worker {i} died (exit code {self.procs[i].exitcode})") from None
        if msg[0] == "error":
            raise RuntimeError(f"worker {i} failed:\n{msg[1]}")
        return msg

    def messages(self, timeout_s: float) -> list:
        """(worker, message) for every message that arrives within timeout_s (at least one, if any comes)."""
        ready = wait(self.conns, timeout=max(0.0, timeout_s))
        return [(self.conns.index(c), self._recv(self.conns.index(c), 0)) for c in ready]

    def stop(self) -> list:
        """Each worker's stats (busy seconds), in order."""
        for c in self.conns:
            c.send(("stop",))
        return [self.expect(i, "stats", self.timeout_s)[1] for i in range(len(self.conns))]

    def close(self):
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def _serve(workers: _Workers, workload: list, send, on_message, expected: int, timeout_s: float):
    """Send each request at its arrival time (send(i, request)), handing every message to on_message(worker,
    message) until `expected` "done" messages came; a stretch of timeout_s with no message is an error."""
    done, i = 0, 0
    while done < expected:
        wait_s = workload[i].arrival - workers.now() if i < len(workload) else timeout_s
        if i < len(workload) and wait_s <= 0:
            send(i, workload[i])
            i += 1
            continue
        got = workers.messages(wait_s)
        if not got and i >= len(workload):
            raise RuntimeError(f"no output from any worker for {timeout_s:.0f} s ({done} of {expected} finished)")
        for w, msg in got:
            on_message(w, msg)
            done += msg[0] == "done"


def replay_routed_processes(model, tokenizer, workload: list, policy: str, num_replicas: int,
                            cache_aware: Optional[CacheAware] = None, timeout_s: float = 120.0, **options):
    """Data parallelism for real: num_replicas engine processes behind a Router in this process, on the wall clock.
    model, tokenizer: what minillm.load takes (a name, a path, or a Transformer and its tokenizer, pickled to each
    process). -> a RoutedRun (busy_s: each replica's seconds in steps)."""
    from ..config import EngineConfig
    from .data_parallel import RoutedRun
    check_policy(policy)
    check_replicas(num_replicas)
    EngineConfig(**options)                                          # a bad option: a ValueError here, not in a worker
    run = RoutedRun([], Router(policy, num_replicas, cache_aware), sorted(workload, key=lambda r: r.arrival))
    workers = _Workers([(_engine_main, (model, tokenizer, options))] * num_replicas, timeout_s)
    try:
        def send(i, req):
            r = run.router.route(req.prompt_ids)
            run.replica_of[str(i)] = r
            workers.conns[r].send(("add", str(i), list(req.prompt_ids), req.max_tokens, req.arrival))

        def on_message(w, msg):
            run.router.done(w)
            run.outputs.append(msg[1])

        _serve(workers, run.workload, send, on_message, len(run.workload), timeout_s)
        run.busy_s = workers.stop()
    finally:
        workers.close()
    return run


def disagg_processes(model, tokenizer, workload: list, timeout_s: float = 120.0, prefill_options: Optional[dict] = None,
                     decode_options: Optional[dict] = None, **options) -> dict:
    """Disaggregation for real: a prefill process and a decode process, the KV handed over a pipe between them.
    -> {"outputs": RequestOutputs (ids: arrival order), "transfers": [{"request_id", "blocks", "bytes", "seconds"}],
    "busy_s": {"prefill", "decode"}, "workload": the sorted trace}."""
    from ..config import EngineConfig
    pre, dec = {**options, **(prefill_options or {})}, {**options, **(decode_options or {})}
    EngineConfig(**pre), EngineConfig(**dec)                         # a bad option: a ValueError here, not in a worker
    decode_end, prefill_end = context().Pipe(duplex=False)               # prefill -> decode: handovers
    ordered = sorted(workload, key=lambda r: r.arrival)
    workers = _Workers([(_engine_main, (model, tokenizer, pre, prefill_end)),
                        (_decode_main, (decode_end, model, tokenizer, dec))], timeout_s)
    outputs, transfers = [], []
    try:
        def send(i, req):
            workers.conns[0].send(("add", str(i), list(req.prompt_ids), req.max_tokens, req.arrival))

        def on_message(w, msg):
            if msg[0] == "done":
                outputs.append(msg[1])
            else:                                                  # ("transfer", id, blocks, bytes, seconds)
                transfers.append(dict(zip(("request_id", "blocks", "bytes", "seconds"), msg[1:])))

        _serve(workers, ordered, send, on_message, len(ordered), timeout_s)
        busy = workers.stop()
    finally:
        workers.close()
    return {"outputs": outputs, "transfers": transfers, "busy_s": {"prefill": busy[0], "decode": busy[1]},
            "workload": ordered}
