"""Disaggregated serving replayed on the simulated clock: the prefill engine and the decode engine as two replicas
(each its own clock, minillm.cluster.replica), the KV handover as an event that lands at the decode engine a link's
time after the prefill engine let go of the sequence.

    run = replay_disagg(model, tokenizer, workload, step_cost, Link(20e-6, 10e9), **options)
    run.outputs, run.handovers         # RequestOutputs (ids: arrival order); HandoverRecords
    timelines(run)                     # per request: arrival, prefill start, first token, handover, decode, finish

The colocated baseline it is compared with is data parallelism (minillm.cluster.data_parallel): the same engines,
each running prefill and decode, behind a router.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from .disagg import DisaggregatedEngine, take_ready
from .replica import SimReplica, trace_params
from .sim import Timeline, simulate


@dataclass(frozen=True)
class Link:
    """Transfer time of a handover: latency + bytes / bandwidth (bytes_per_s <= 0: instantaneous)."""
    latency_s: float = 0.0
    bytes_per_s: float = 0.0
    name: str = "given"

    def __call__(self, nbytes: int) -> float:
        return self.latency_s + (nbytes / self.bytes_per_s if self.bytes_per_s > 0 else 0.0)

    def describe(self) -> str:
        return f"{self.latency_s * 1e6:.0f} us + {self.bytes_per_s / 1e9:.2f} GB/s ({self.name})"


@dataclass
class DisaggRun:
    outputs: list
    workload: list
    handovers: list = field(default_factory=list)       # HandoverRecord per request that reached the decode engine
    busy_s: dict = field(default_factory=dict)          # "prefill", "decode": modelled seconds in model calls
    engines: dict = field(default_factory=dict)         # "prefill", "decode": the LLMEngines (their traces)


def replay_disagg(model, tokenizer, workload: list, step_cost: Callable, link: Optional[Link] = None,
                  prefill_options: Optional[dict] = None, decode_options: Optional[dict] = None,
                  link_block_bytes: Optional[int] = None, **options) -> DisaggRun:
    """Serve `workload` with one prefill and one decode engine (EngineConfig options: `options` for both, updated
    by prefill_options / decode_options) on the simulated clock. link_block_bytes: the bytes of one KV block that
    the link is charged for (default: the engines' own; a stand-in model computing the tokens of a bigger one that
    step_cost prices passes the bigger one's, so the transfer is priced for the model the clock is)."""
    link = link or Link()
    prefill = SimReplica.build(model, tokenizer, step_cost, "prefill", **{**options, **(prefill_options or {})})
    decode = SimReplica.build(model, tokenizer, step_cost, "decode", **{**options, **(decode_options or {})})
    pair = DisaggregatedEngine(prefill.engine, decode.engine, link)
    decode.prepare = pair.inbox.receive                  # before each decode step: take in what has arrived
    run = DisaggRun([], sorted(workload, key=lambda r: r.arrival))
    timeline = Timeline()

    def arrive(i, req):
        def deliver(t):
            prefill.wake(t)
            pair.add_request(req.prompt_ids, trace_params(req.max_tokens), str(i), t)
        return deliver

    def land(h):
        def deliver(t):
            decode.wake(t)
            pair.send(h, t)
            pair.inbox.receive()
        return deliver

    for i, req in enumerate(run.workload):
        timeline.push(req.arrival, arrive(i, req))

    def after_step(replica, finished):
        run.outputs.extend(finished)
        if replica is prefill:
            for h in take_ready(prefill.engine):
                nbytes = h.nbytes if link_block_bytes is None else h.num_blocks * link_block_bytes
                timeline.push(h.sent_at + link(nbytes), land(h))

    simulate([prefill, decode], timeline, after_step, busy=lambda r: r.busy or (r is decode and bool(pair.inbox)))
    run.handovers = list(pair.handovers)
    run.busy_s = {"prefill": prefill.busy_s, "decode": decode.busy_s}
    run.engines = {"prefill": prefill.engine, "decode": decode.engine}
    return run


def timelines(outputs: list, handovers: list) -> list[dict]:
    """Per request, plain data for a timeline drawing (seconds on the simulated clock): arrival, first_scheduled
    (its prefill began), first_token, handover sent / ready / received (None when colocated, or when the first
    token finished it), token_times, finished; sorted by arrival."""
    by_id = {h.request_id: h for h in handovers}
    rows = []
    for o in outputs:
        m, h = o.metrics, by_id.get(o.request_id)
        rows.append({"request_id": o.request_id, "prompt_tokens": len(o.prompt_token_ids),
                     "output_tokens": len(o.token_ids), "arrival": m.arrival_time,
                     "first_scheduled": m.first_scheduled_time, "first_token": m.first_token_time,
                     "handover_sent": h.sent_at if h else None, "handover_ready": h.ready_at if h else None,
                     "handover_received": h.received_at if h else None, "handover_bytes": h.bytes if h else 0,
                     "token_times": list(m.token_times), "finished": m.finished_time})
    return sorted(rows, key=lambda r: (r["arrival"], int(r["request_id"]) if r["request_id"].isdigit() else 0))
