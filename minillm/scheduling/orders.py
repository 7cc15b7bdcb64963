"""Scheduling orders (EngineConfig.scheduling_policy): WHICH waiting request is admitted next, which running one is
preempted, and in which order the running ones get a step's token budget.

A batching policy (minillm.core.policies: continuous, chunked, static, dynamic) decides how a step is built; it asks
its order who comes first. So "fcfs" with continuous batching is exactly the engine as it was, and every order
works with continuous and chunked batching (static and dynamic batches never preempt: with them, only fcfs, fair
and lpm; minillm.engine.parts.check_order refuses the rest). An order changes WHEN a request runs, never WHAT it
computes: each sequence keeps its own generator, so a request's tokens are the same under every order.

    fcfs      first come, first served (vLLM's default): the waiting queue in arrival order, a preempted
              sequence first; the newest running sequence is preempted when blocks run out.
    sjf       shortest job first by tokens left to compute (prompt + max_tokens at arrival: the oracle when output
              lengths are known, as with ignore_eos); preemptive, so it is shortest-remaining-first (SRPT), the
              bound on mean job completion time that MLFQ tries to reach without knowing lengths.
    priority  `priority=` per request (add_request's and generate's argument), lower first (vLLM's priority
              scheduling), ties by arrival; a waiting request preempts a lower-priority running one when it cannot
              otherwise fit.
    mlfq      FastServe's skip-join multi-level feedback queue (Wu et al. 2023): a request joins the highest
              queue whose quantum covers its prompt (skip-join), is demoted to the next queue each time it has
              been served its level's quantum of tokens (quantum * 2**level), and a higher queue preempts a lower
              one. It never reads max_tokens. Starvation prevention: a request that has not run for
              `starve_steps` steps is promoted to the top queue (FastServe's promotion after a wait).
    fair      the Virtual Token Counter (VTC, Sheng et al. OSDI 2024): one counter per client (`client=`) of the
              service it received (w_p per prompt token admitted, w_q per output token); the waiting request of the
              client with the smallest counter is admitted next, and a client that returns from idle has its
              counter lifted to the smallest among the active ones, so it cannot bank service while away.
    lpm       SGLang's cache-aware order: longest prefix match first, the match measured in a radix tree of the
              cached prefixes (minillm.scheduling.radix), so requests that reuse the cache run while it still holds
              their prefix; over 128 waiting it falls back to fcfs, as SGLang does. Needs prefix caching.

Order (the interface the batching policies and the scheduler call) and FCFS live in the core
(minillm.core.order); the others plug in from here.
"""
from __future__ import annotations

from typing import Optional

from ..core.order import FCFS, Order
from ..core.sequence import Sequence
from .radix import RadixTree


class ShortestJobFirst(Order):
    name = "sjf"
    preemptive = True

    def __init__(self, preemptive: bool = True):
        self.preemptive = preemptive

    def key(self, seq: Sequence) -> tuple:
        # tokens still to compute: the prompt (or what a recompute must redo) plus the outputs not yet made
        left = len(seq) - seq.num_computed + max(0, seq.params.max_tokens - len(seq.output_ids))
        return (left,) + self.tiebreak(seq)


class Priority(Order):
    name = "priority"
    preemptive = True
    uses_priority = True

    def key(self, seq: Sequence) -> tuple:
        return (seq.priority,) + self.tiebreak(seq)


class MLFQ(Order):
    """levels queues; level i's quantum is quantum * 2**i output tokens (the last level's is unbounded).
    prompt_weight: one prompt token's cost in decode steps, to pick the first queue (skip-join: the highest queue
    whose quantum covers the prompt's cost, as FastServe compares the first iteration's time with the quanta). The
    default, 1/16, is GPU-like (a prefill token is far cheaper than a decode step); on a CPU with a small batch it is
    nearer 1 / max_num_seqs (StepCost.token_s / StepCost.seconds(B, B)). starve_steps: steps without running after
    which a waiting request is promoted to the top queue."""
    name = "mlfq"
    preemptive = True

    def __init__(self, levels: int = 4, quantum: int = 8, prompt_weight: float = 1 / 16, starve_steps: int = 200):
        self.levels, self.quantum, self.prompt_weight, self.starve_steps = levels, quantum, prompt_weight, starve_steps
        self.state: dict[int, list] = {}      # seq id -> [level, output tokens when it entered it, last step run]
        self.steps = 0
        self.promotions = 0

    def quantum_of(self, level: int) -> float:
        return float("inf") if level == self.levels - 1 else self.quantum * 2 ** level

    def first_level(self, prompt_len: int) -> int:
        cost = prompt_len * self.prompt_weight
        return next((i for i in range(self.levels) if cost <= self.quantum_of(i)), self.levels - 1)

    def level(self, seq: Sequence) -> int:
        return self._state(seq)[0]

    def _state(self, seq: Sequence) -> list:
        st = self.state.get(seq.seq_id)
        if st is None:
            st = self.state[seq.seq_id] = [self.first_level(len(seq.prompt_ids)), len(seq.output_ids), self.steps]
        return st

    def key(self, seq: Sequence) -> tuple:
        return (self._state(seq)[0],) + self.tiebreak(seq)

    def refresh(self, sched):
        self.steps += 1
        live = {}
        for seq in sched.running:             # demotion: each quantum served moves it one queue down
            st = self._state(seq)
            while len(seq.output_ids) - st[1] >= self.quantum_of(st[0]):
                st[1] += self.quantum_of(st[0])
                st[0] += 1
            st[2] = self.steps
            live[seq.seq_id] = st
        for seq in list(sched.waiting) + list(sched.swapped):
            st = self._state(seq)
            if self.steps - st[2] >= self.starve_steps and st[0] > 0:   # waited too long: back to the top queue
                st[:] = [0, len(seq.output_ids), self.steps]
                self.promotions += 1
            live[seq.seq_id] = st
        self.state = live                     # finished sequences are forgotten


class VirtualTokenCounter(Order):
    """w_p, w_q: the service a prompt token and an output token count for (the paper's default 1 and 2: an output
    token costs a step of its own, a prompt token is batched)."""
    name = "fair"

    def __init__(self, w_p: float = 1.0, w_q: float = 2.0):
        self.w_p, self.w_q = w_p, w_q
        self._counters: dict = {}             # client -> virtual tokens of service received
        self._served: dict = {}               # client -> output tokens received (for reports)
        self._seen: dict[int, list] = {}      # seq id -> [seq, outputs charged]; prompt charged on admission

    @property
    def counters(self) -> dict:
        """client -> virtual tokens of service received, up to date (tokens of the last step included)."""
        self.settle()
        return self._counters

    @property
    def served(self) -> dict:
        """client -> output tokens received."""
        self.settle()
        return self._served

    def key(self, seq: Sequence) -> tuple:
        return (self._counters.get(seq.client, 0.0),) + self.tiebreak(seq)

    def refresh(self, sched):
        self.settle()
        queued = list(sched.waiting) + list(sched.running) + list(sched.swapped)
        for seq in sorted((s for s in sched.waiting if s.seq_id not in self._seen), key=self.tiebreak):
            active = {s.client for s in queued if s.seq_id in self._seen}      # clients with work already known
            if seq.client not in active and active:  # back from idle (or new): no banked credit
                floor = min(self._counters.get(c, 0.0) for c in active)
                self._counters[seq.client] = max(self._counters.get(seq.client, 0.0), floor)
            self._seen[seq.seq_id] = [seq, None]
        for seq in queued:                     # (samples n > 1 join running without waiting)
            self._seen.setdefault(seq.seq_id, [seq, None])

    def settle(self):
        """Charge what the sequences seen so far were served: w_p per prompt token once admitted (the first sample
        only: the others share its prompt), w_q per output token."""
        for sid, entry in list(self._seen.items()):
            seq, charged = entry
            if charged is None and seq.metrics.first_scheduled_time is not None:
                self._charge(seq.client, self.w_p * len(seq.prompt_ids) if seq.index == 0 else 0.0)
                entry[1] = charged = 0
            if charged is not None and len(seq.output_ids) > charged:
                n = len(seq.output_ids) - charged
                self._charge(seq.client, self.w_q * n)
                self._served[seq.client] = self._served.get(seq.client, 0) + n
                entry[1] = len(seq.output_ids)
            if seq.is_finished:
                del self._seen[sid]

    def _charge(self, client, amount: float):
        self._counters[client] = self._counters.get(client, 0.0) + amount

    def admissible(self, sched) -> list:
        """Admission order: repeatedly the oldest request of the client with the smallest counter, its prompt
        charged provisionally (so one step's admissions already alternate between clients)."""
        counters = dict(self._counters)
        queues: dict = {}
        for seq in sorted(sched.waiting, key=self.tiebreak):
            queues.setdefault(seq.client, []).append(seq)
        best_swapped = min((self.key(s) for s in sched.swapped), default=None)
        out = []
        while queues:
            c = min(queues, key=lambda c: (counters.get(c, 0.0),) + self.tiebreak(queues[c][0]))
            seq = queues[c].pop(0)
            if best_swapped is not None and (counters.get(c, 0.0),) + self.tiebreak(seq) >= best_swapped:
                break
            out.append(seq)
            counters[c] = counters.get(c, 0.0) + self.w_p * len(seq.prompt_ids)
            if not queues[c]:
                del queues[c]
        return out


class LongestPrefix(Order):
    """capacity: the radix tree's size in tokens (the KV pool's, set by the engine's make_policy)."""
    name = "lpm"
    FALLBACK = 128            # SGLang: above this many waiting requests, matching each costs more than it saves

    def __init__(self, capacity: Optional[int] = None):
        self.tree = RadixTree(capacity)
        self._running: dict[int, Sequence] = {}   # seq id -> sequence seen running (inserted when it leaves)
        self._match: dict[int, int] = {}          # seq id -> matched tokens, this step

    def key(self, seq: Sequence) -> tuple:
        return (-self._match.get(seq.seq_id, 0),) + self.tiebreak(seq)

    def refresh(self, sched):
        running = {s.seq_id: s for s in sched.running}
        for sid, seq in self._running.items():
            if sid not in running:             # finished or preempted: what it computed stays cached
                self.tree.insert(seq.token_ids[:-1])
        self._running = {sid: s for sid, s in self._running.items() if sid in running}
        for sid, seq in running.items():       # its prompt is computed: cached from now on
            if sid not in self._running and seq.num_computed >= len(seq.prompt_ids):
                self.tree.insert(seq.prompt_ids)
                self._running[sid] = seq
        waiting = list(sched.waiting)
        self._match = {} if len(waiting) > self.FALLBACK else \
            {s.seq_id: self.tree.match(s.token_ids[:-1]) for s in waiting}


ORDERS = {"fcfs": FCFS, "sjf": ShortestJobFirst, "priority": Priority, "mlfq": MLFQ, "fair": VirtualTokenCounter,
          "lpm": LongestPrefix}


def make_order(name: str, **kwargs) -> Order:
    if name not in ORDERS:
        raise ValueError(f"scheduling_policy={name!r} is not one of {tuple(ORDERS)}")
    return ORDERS[name](**kwargs)
