"""Scheduling policies: who runs each step. A policy decides; the Scheduler's mechanism carries it out.

A policy's schedule(sched) builds one ScheduledBatch with two calls of the scheduler:
    sched.admit(batch, seq, budget, chunk=False)  a waiting sequence joins (blocks for its prompt, prefix-cache
                                                  hits counted); -> tokens it computes this step, 0 if it does not fit
    sched.extend(batch, seq, budget)              a running sequence computes its next tokens (the rest of its
                                                  prompt, a chunk of it, or its newest token plus draft slots),
                                                  preempting the newest sequences if blocks run out; -> tokens, 0
                                                  if it was preempted itself
and reads sched.waiting (oldest first), sched.running, sched.swapped, sched.budget (tokens per step).

A batching policy decides how a step is built; its ORDER (minillm.core.order: FCFS; the others plug in from
minillm.scheduling.orders, EngineConfig.scheduling_policy: sjf, priority, mlfq, fair, lpm) decides who comes
first: order.admissible(sched) is the waiting queue in admission order, order.running(sched) the running
sequences best first, and order.preempt(sched) lets a preemptive order (priority, mlfq, sjf) make room for a
waiting request that outranks running ones. With FCFS (the default) each policy is exactly what it was before
orders existed.

Batching policies (EngineConfig.batching and enable_chunked_prefill):
- Continuous (Orca, Yu et al. 2022): waiting requests join at every step. A step is a prefill of newly admitted
  sequences or one decode token for every running one (vLLM's default before chunked prefill).
- Chunked (Sarathi-Serve, Agrawal et al. 2024; DeepSpeed-FastGen's SplitFuse): every step has a token budget:
  running decodes first, then the rest of prompts already begun, then new prompts, chunked to what is left,
  so a long prompt never stalls the decodes.
- Static (FasterTransformer): requests join only an empty batch; a finished sequence stays as padding (it keeps
  its blocks and costs a row of compute) until the whole batch has finished.
- Dynamic (Triton's dynamic batcher): static, but the batch forms once max_num_seqs requests wait or the oldest
  has waited batch_window_s (at once when no more arrivals are expected: LLM.generate knows all its requests).
"""
from __future__ import annotations

import math

from ..config import EngineConfig
from .batch import ScheduledBatch
from .order import FCFS, Order
from .sequence import Status

UNLIMITED = math.inf


class SchedulingPolicy:
    name = "policy"
    pads = False        # finished sequences ride along as padding rows until the batch ends (static batching)
    order: Order = FCFS()   # who comes first (a policy written without orders, e.g. a lab's, is FCFS)

    def __init__(self, order: Order | None = None):
        self.order = order or FCFS()

    def schedule(self, sched) -> ScheduledBatch:
        raise NotImplementedError


class Continuous(SchedulingPolicy):
    name = "continuous"

    def schedule(self, sched) -> ScheduledBatch:
        self.order.preempt(sched)                                       # preemptive orders make room first
        batch, budget = ScheduledBatch("prefill"), sched.budget
        for seq in self.order.admissible(sched):                        # fcfs: oldest first, none while swapped
            if batch and len(seq) > budget:                             # the first prompt always fits the budget
                break
            n = sched.admit(batch, seq, budget)
            if not n:
                break
            budget -= n
        if batch:
            return batch
        batch = ScheduledBatch("decode")
        for seq in self.order.running(sched):
            if seq.status is Status.RUNNING:
                sched.extend(batch, seq)
        return batch


class Chunked(SchedulingPolicy):
    name = "chunked"

    def schedule(self, sched) -> ScheduledBatch:
        self.order.preempt(sched)
        batch, budget = ScheduledBatch("mixed"), sched.budget
        for decoding in (True, False):              # decodes first: they never wait for a prompt
            for seq in self.order.running(sched):
                if seq.status is Status.RUNNING and (len(seq) - seq.num_computed == 1) == decoding and budget > 0:
                    budget -= sched.extend(batch, seq, budget)
        for seq in self.order.admissible(sched):
            n = sched.admit(batch, seq, budget, chunk=True) if budget > 0 else 0
            if not n:
                break
            budget -= n
        return batch


class Static(SchedulingPolicy):
    name = "static"
    pads = True

    def may_form(self, sched) -> bool:
        return True

    def schedule(self, sched) -> ScheduledBatch:
        if sched.running or sched.padding or sched.swapped:
            batch = ScheduledBatch("decode")
            for seq in list(sched.running):
                if seq.status is Status.RUNNING:
                    sched.extend(batch, seq)
            sched.add_padding(batch)
            if batch or sched.running or sched.swapped:
                return batch
            sched.release_padding()                 # every member was preempted: the batch is over
        batch = ScheduledBatch("prefill")
        if sched.waiting and self.may_form(sched):
            for seq in self.order.admissible(sched):   # the whole batch, at once
                if not sched.admit(batch, seq, UNLIMITED):
                    break
        return batch


class Dynamic(Static):
    name = "dynamic"

    def __init__(self, window_s: float, order: Order | None = None):
        super().__init__(order)
        self.window_s = window_s

    def may_form(self, sched) -> bool:
        if not sched.expect_arrivals or len(sched.waiting) >= sched.config.max_num_seqs:
            return True
        return sched.clock() - sched.waiting[0].metrics.arrival_time >= self.window_s


def batching_policy(config: EngineConfig, order: Order | None = None) -> SchedulingPolicy:
    """The batching policy config names, asking `order` who comes first (FCFS by default). The order
    config.scheduling_policy names is built by minillm.scheduling.make_policy, which calls this."""
    if order is None and config.scheduling_policy != "fcfs":
        raise ValueError(f"scheduling_policy={config.scheduling_policy!r} is a plug-in order: build the policy with "
                         f"minillm.scheduling.make_policy(config), or pass its order")
    order = order or FCFS()
    if config.batching == "static":
        return Static(order)
    if config.batching == "dynamic":
        return Dynamic(config.batch_window_s, order)
    return Chunked(order) if config.enable_chunked_prefill else Continuous(order)


def __getattr__(name: str):
    if name == "make_policy":
        raise ImportError("minillm.core.policies.make_policy moved to minillm.scheduling.make_policy (the orders it "
                          "builds by name are plug-ins); minillm.core.policies.batching_policy takes an order object")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
