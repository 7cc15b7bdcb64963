"""Every collective of a rank goes through one Comm: it counts the payload bytes handed to it, per op and per step.

The payload of an op is the bytes of the tensor this rank hands in: the whole tensor for broadcast and all_reduce,
this rank's shard for all_gather, the message for send and recv. What crosses the wire is a multiple of that
fixed by the algorithm (minillm.parallel.accounting.wire_bytes: a ring all-reduce sends 2 (p - 1) / p of it per
rank), so counting payloads here, and algorithms there, lets a test check both: counted == formula exactly, and
formula x algorithm ~ the bytes the OS counted on the loopback interface.

The ops are torch.distributed's (a gloo ProcessGroup, one per RankGroup: minillm.parallel.group); each waits with
the group's timeout, and on rank 0 a failure is handed to `on_error`, which names the rank that failed.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Optional

import torch

from .timeline import Timeline

OPS = ("broadcast", "all_reduce", "all_gather", "send", "recv")


class Comm:
    def __init__(self, pg, rank: int, world: int, on_error: Optional[Callable] = None):
        self.pg, self.rank, self.world = pg, rank, world
        self.on_error = on_error                    # rank 0: exception, op -> the exception to raise (names a rank)
        self.totals = dict.fromkeys(OPS, 0)         # payload bytes handed to each op since the group started
        self.calls = dict.fromkeys(OPS, 0)
        self.steps = deque(maxlen=4096)             # per step (begin_step): {op: payload bytes}
        self.timeline = Timeline(rank)

    # ------------------------------------------------------------------ accounting
    def begin_step(self):
        """Start counting a new step (a forward, with the block copies before it)."""
        self.steps.append(dict.fromkeys(OPS, 0))

    def reset(self):
        self.totals, self.calls = dict.fromkeys(OPS, 0), dict.fromkeys(OPS, 0)
        self.steps.clear()

    def _count(self, op: str, t: torch.Tensor):
        n = t.numel() * t.element_size()
        self.totals[op] += n
        self.calls[op] += 1
        if self.steps:
            self.steps[-1][op] += n

    def _wait(self, op: str, work):
        try:
            with self.timeline.span(op):
                work.wait()
        except RuntimeError as e:                   # gloo: a peer closed its sockets, or the timeout passed
            raise (self.on_error(e, op) if self.on_error else e) from e

    # ------------------------------------------------------------------ the ops
    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """t from rank src to every rank, in place."""
        self._count("broadcast", t)
        self._wait("broadcast", self.pg.broadcast(t, src))
        return t

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """t = the sum of every rank's t, in place (gloo: a ring, Patarasuk & Yuan 2009)."""
        self._count("all_reduce", t)
        self._wait("all_reduce", self.pg.allreduce([t]))
        return t

    def all_gather(self, t: torch.Tensor) -> list:
        """Every rank's t, in rank order (each rank hands in its shard)."""
        self._count("all_gather", t)
        out = [torch.empty_like(t) for _ in range(self.world)]
        self._wait("all_gather", self.pg.allgather([out], [t]))
        return out

    def isend(self, t: torch.Tensor, dst: int, tag: int = 0) -> "Pending":
        self._count("send", t)
        return Pending(self, "send", self.pg.send([t], dst, tag))

    def irecv(self, t: torch.Tensor, src: int, tag: int = 0) -> "Pending":
        """Post a receive into t; .wait() it."""
        self._count("recv", t)
        return Pending(self, "recv", self.pg.recv([t], src, tag))

    def recv(self, t: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        self.irecv(t, src, tag).wait()
        return t


class Pending:
    """A send or receive in flight (gloo moves the bytes on its own thread); wait() with the group's timeout."""

    def __init__(self, comm: Comm, op: str, work):
        self.comm, self.op, self.work = comm, op, work

    def wait(self):
        self.comm._wait(self.op, self.work)
