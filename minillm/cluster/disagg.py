"""Prefill/decode disaggregation (DistServe, Zhong et al. 2024; Splitwise, Patel et al. 2024): one engine runs
prompts, another runs decodes, and each sequence's KV cache is handed from the first to the second.

Why: in one engine a long prompt's prefill step stalls every running decode for its whole duration (the decodes'
time per output token spikes), and the two phases want different things (prefill is compute-bound and likes few big
batches; decode is memory-bound and likes many rows). Split, each engine does one kind of step: the decode engine's
steps are never interrupted by a prompt. The price: a KV handover per request (bytes = blocks x block bytes, over
the link between the two), two engines that cannot lend each other capacity (a prefill engine with no prompts
idles while the decode engine is saturated), and the first token's K/V in flight between them.

    pair = DisaggregatedEngine(prefill_engine, decode_engine)    # same model, block size and KV dtype (checked)
    pair.add_request(prompt, params)                               # validated against both pools
    while pair.has_unfinished_requests(): pair.step()             # prefill step, handovers, decode step
    pair.pop_finished(); pair.handovers                            # RequestOutputs; bytes, blocks, seconds each

A request is prefilled by the prefill engine until it has its first token; then (unless that token finished it)
export_sequence takes its blocks out (minillm.cluster.kv_transfer) and the decode engine imports them into its own
pool. A handover the decode pool (or its max_num_seqs) has no room for yet waits in `pair.inbox`, in order, holding
its K/V (as a transfer buffer in host memory would) and nothing else; a request that could never fit the decode pool
is refused when it is added. Output equals one engine's: the decode engine computes the same positions from the same
K/V, and the sequence's sampling generator travels with it. One sample per request (n = best_of = 1), no
speculative decoding or kv_eviction in either engine (refused by name).

On a GPU a decode step costs about the same for 1 row or 32 (memory-bound), so pooling every decode on one engine is
nearly free; on a CPU a step's cost grows with its rows, and pooling them doubles the decode engine's steps: the
trade-off `python -m minillm bench cluster` measures, a workload each way.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

from ..core.sampling import SamplingParams
from ..engine.engine import LLMEngine
from .kv_transfer import KVHandover, check_compatible, export_sequence, import_sequence


@dataclass
class HandoverRecord:
    """One request's handover, as plain data (the notebook's timeline reads these)."""
    request_id: str
    blocks: int
    bytes: int
    sent_at: float           # the prefill engine's clock when it let go of the sequence
    ready_at: float          # when the K/V could be at the decode engine (sent_at + the link's time)
    received_at: float       # the decode engine's clock when it took the sequence in (later if it had no room)
    copy_s: float            # wall seconds copying the blocks out and in (in-process)


def check_single_engine(engine: LLMEngine, role: str):
    """Options a handover does not carry are refused by name (the draft model's own KV, evicted positions)."""
    cfg = engine.config
    if cfg.speculative is not None:
        raise ValueError(f"the {role} engine has speculative={cfg.speculative!r}: a handover moves the target's KV "
                         f"only (not a draft model's); disaggregate without speculative decoding")
    if cfg.kv_eviction is not None:
        raise ValueError(f"the {role} engine has kv_eviction={cfg.kv_eviction!r}: a handover moves every computed "
                         f"position's blocks, so eviction is not supported with disaggregation")


def take_ready(engine: LLMEngine) -> list[KVHandover]:
    """Export every sequence of the prefill engine whose prompt is done and first token sampled (chunked prefill:
    only after its last chunk) -> their handovers, oldest first."""
    ready = [s for s in engine.scheduler.running if s.output_ids and s.num_computed >= len(s.prompt_ids)]
    return [export_sequence(engine, s) for s in ready]


class Inbox:
    """The decode side: handovers on their way or waiting for room, taken in first come, first served."""

    def __init__(self, decode: LLMEngine):
        self.decode = decode
        self.pending: deque[tuple[float, KVHandover]] = deque()      # (ready_at, handover) not yet taken in
        self.records: list[HandoverRecord] = []

    def put(self, h: KVHandover, ready_at: float):
        self.pending.append((ready_at, h))

    def receive(self) -> int:
        """Take in pending handovers whose K/V has arrived, oldest first, while the decode pool has room (one that
        does not fit holds back the rest: first come, first served). -> how many were taken in."""
        now, taken = self.decode.clock(), 0
        while self.pending and self.pending[0][0] <= now:
            ready_at, h = self.pending[0]
            if import_sequence(self.decode, h) is None:
                break
            self.pending.popleft()
            self.records.append(HandoverRecord(h.request_id, h.num_blocks, h.nbytes, h.sent_at, ready_at, now,
                                               h.copy_s))
            taken += 1
        return taken

    def holds(self, request_id: str) -> bool:
        return any(h.request_id == request_id for _, h in self.pending)

    def drop(self, request_id: str) -> bool:
        """Abort a handover still waiting: its K/V buffer is dropped. -> whether there was one."""
        kept = deque((t, h) for t, h in self.pending if h.request_id != request_id)
        dropped, self.pending = len(kept) < len(self.pending), kept
        return dropped

    def __len__(self) -> int:
        return len(self.pending)


class DisaggregatedEngine:
    """A prefill engine and a decode engine with LLMEngine's request API (add_request, step, pop_finished)."""

    def __init__(self, prefill: LLMEngine, decode: LLMEngine, link=None):
        """link: seconds(bytes) -> transfer time, for the handover's ready_at (None: instantaneous)."""
        check_compatible(prefill, decode)
        check_single_engine(prefill, "prefill")
        check_single_engine(decode, "decode")
        self.prefill, self.decode, self.link = prefill, decode, link
        self.inbox = Inbox(decode)
        self._finished_early: list = []                              # requests the first token finished

    @property
    def handovers(self) -> list[HandoverRecord]:
        return self.inbox.records

    # ------------------------------------------------------------------ requests
    def make_request(self, prompt, params: Optional[SamplingParams] = None, request_id: Optional[str] = None,
                     arrival_time: Optional[float] = None):
        """Validated against both engines, nothing queued: the prompt and parameters by the prefill engine, the
        request's whole length by the decode engine's context and pool, one sample per request."""
        request = self.prefill.make_request(prompt, params, request_id, arrival_time)
        p, rid = request.params, request.request_id
        if p.num_samples > 1:
            raise ValueError(f"disaggregation hands one sequence per request to the decode engine: n={p.n}, "
                             f"best_of={p.best_of} would need its samples forked there (send n separate requests)")
        if rid in self.decode.requests or self.inbox.holds(rid):
            raise ValueError(f"request_id {rid!r} is already in use (in the decode engine)")
        self.decode.validate(request.prompt_ids)
        self.decode.check_fits(len(request.prompt_ids), p)
        return request

    def add_request(self, prompt, params: Optional[SamplingParams] = None, request_id: Optional[str] = None,
                    arrival_time: Optional[float] = None) -> str:
        return self.prefill.enqueue(self.make_request(prompt, params, request_id, arrival_time))

    def abort(self, request_id: str):
        rid = str(request_id)
        if rid in self.prefill.requests:
            self.prefill.abort(rid)
        elif rid in self.decode.requests:
            self.decode.abort(rid)
        elif not self.inbox.drop(rid):
            raise ValueError(f"abort: no request with id {request_id!r}")

    def has_unfinished_requests(self) -> bool:
        return self.prefill.has_unfinished_requests() or self.decode.has_unfinished_requests() or bool(self.inbox)

    # ------------------------------------------------------------------ the two halves
    def prefill_step(self) -> list[KVHandover]:
        """One prefill engine step; -> the handovers of the sequences that got their first token in it."""
        self.prefill.step()
        self._finished_early += self.prefill.pop_finished()          # e.g. max_tokens=1, or a stop token at once
        return take_ready(self.prefill)

    def send(self, h: KVHandover, ready_at: Optional[float] = None):
        """A handover is on its way to the decode engine; it can be taken in from ready_at on (default: sent_at
        plus the link's time for its bytes)."""
        if ready_at is None:
            ready_at = h.sent_at + (self.link(h.nbytes) if self.link else 0.0)
        self.inbox.put(h, ready_at)

    def decode_step(self):
        self.inbox.receive()
        if self.decode.has_unfinished_requests():
            self.decode.step()

    def step(self):
        """In one process, one after the other: a prefill step, its handovers sent, a decode step."""
        if self.prefill.has_unfinished_requests():
            for h in self.prefill_step():
                self.send(h)
        self.decode_step()

    def pop_finished(self) -> list:
        done, self._finished_early = self._finished_early + self.decode.pop_finished(), []
        return done

    def generate(self, prompts: list, params: Optional[SamplingParams] = None) -> list:
        """LLM.generate's loop over the pair (every prompt validated before any is queued) -> RequestOutputs in
        prompt order."""
        requests = [self.make_request(p, params) for p in prompts]
        ids = [self.prefill.enqueue(r) for r in requests]
        done = {}
        while self.has_unfinished_requests():
            self.step()
            done.update((o.request_id, o) for o in self.pop_finished())
        return [done[i] for i in ids]
