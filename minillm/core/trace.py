"""What happened, step by step, as plain data. The engine records; minillm.viz draws; tests read.

The trace keeps the newest MAX_STEPS steps (about 1 KiB each; older ones are dropped and counted in
`dropped`), so a long-running engine does not grow without bound. Counters of speculative decoding
(`spec_stats`) are kept even with trace=False: benchmarks read them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .block_manager import BlockManager

MAX_STEPS = 20_000


@dataclass
class StepRecord:
    step: int
    kind: str                 # "prefill", "decode" or "mixed" (chunked prefill)
    seq_ids: list             # which sequences ran
    num_prefill_tokens: int
    num_decode_tokens: int
    blocks_used: int
    blocks_free: int
    kv_bytes_used: int        # bytes of the blocks in use
    kv_bytes_filled: int      # bytes actually holding tokens (the rest of the used blocks is waste)
    start: float
    seconds: float
    num_padding: int = 0      # finished sequences computed as padding rows (static batching)
    phases: list = field(default_factory=list)       # per seq_id: "prefill", "decode" or "fork"
    padding_ids: list = field(default_factory=list)  # the padding rows' sequences
    # speculative decode steps: per sequence {"seq_id", "request_id", "index", "drafted": [ids], "accepted": n,
    # "emitted": [ids]} (emitted = drafted[:n] + the target's own token, cut where the sequence stopped)
    spec: list = field(default_factory=list)
    draft_seconds: float = 0.0   # proposing (the draft model's k forwards, a lookup, Medusa heads)
    verify_seconds: float = 0.0  # the target's one forward over the k + 1 positions
    blocks_shared: int = 0       # blocks in several sequences' tables at the model call (n > 1 samples, beams)
    pruned: list = field(default_factory=list)   # beam search: beams pruned this step (their blocks given back)


@dataclass
class Pending:
    """What Trace.before_update read before the scheduler's update, for after_update."""
    before: list                  # per row: its sequence's output length
    used: int = 0                 # blocks in use, as the model call left them
    free: int = 0
    filled: int = 0               # slots holding tokens (a shared block counted once)
    shared: int = 0               # blocks in several tables


def new_spec_stats() -> dict:
    return {"steps": 0, "rows": 0, "drafted": 0, "accepted": 0, "emitted": 0, "examined": 0, "alpha_sum": 0.0,
            "draft_seconds": 0.0, "verify_seconds": 0.0}


@dataclass
class Trace:
    enabled: bool = True
    steps: list = field(default_factory=list)
    max_steps: int = MAX_STEPS
    dropped: int = 0                                   # oldest steps dropped to stay within max_steps
    spec_stats: dict = field(default_factory=new_spec_stats)
    count: int = 0                                     # steps recorded so far (the next step's number)
    block_bytes: int = 0                               # bytes of one KV block (all layers, K and V)
    block_size: int = 1                                # tokens per block

    def record(self, rec: StepRecord):
        if self.enabled:
            self.steps.append(rec)
            if len(self.steps) > self.max_steps:       # drop the oldest tenth at once: amortised O(1) a step
                cut = max(1, self.max_steps // 10)
                self.steps = self.steps[cut:]          # a new list: a failed step's restore keeps the old one
                self.dropped += cut

    def save(self) -> tuple:
        """What recording a step changes, for restore() if the step fails after all (LLMEngine._transaction)."""
        return self.steps, len(self.steps), self.dropped, self.count, dict(self.spec_stats)

    def restore(self, saved: tuple):
        self.steps, n, self.dropped, self.count, spec = saved
        del self.steps[n:]
        self.spec_stats.update(spec)

    def spec_events(self, request_id, index: int = 0) -> list[dict]:
        """One sequence's speculative steps in order: [{"drafted", "accepted", "emitted"}] (viz.spec_text_html)."""
        return [{k: e[k] for k in ("drafted", "accepted", "emitted")} for st in self.steps for e in st.spec
                if e["request_id"] == str(request_id) and e["index"] == index]

    # ------------------------------------------------------------------ the engine's bookkeeping
    def before_update(self, batch, scheduler) -> "Pending":
        """What the update is about to change: the KV memory as the model call left it (before finished sequences
        give their blocks back) and each sequence's output length. Without shared blocks (the block manager counts
        them as it goes) a sequence's tokens fill its blocks front to back: its filled slots are its cached tokens,
        read from the sequences alone; with shared blocks, the blocks are walked (a shared block counts once)."""
        pending = Pending([len(r.seq.output_ids) for r in batch.rows])
        if not self.enabled:
            return pending
        bm, bs = scheduler.block_manager, scheduler.block_manager.block_size
        written = {r.seq.seq_id: r.end + r.lookahead for r in batch.rows if r.writes}
        holders = scheduler.running + scheduler.padding
        pending.used, pending.free = bm.num_blocks - bm.num_free, bm.num_free
        if type(bm) is BlockManager and bm.num_shared == 0:   # a subclass may keep ref_count its own way
            pending.filled = sum(min(bs * len(s.block_table), max(0, written.get(s.seq_id, s.num_computed) - s.evicted))
                                 for s in holders)
            return pending
        fill, owners = {}, {}  # tokens written in each physical block (a shared block counts once); its owners
        for s in holders:
            n = written.get(s.seq_id, s.num_computed) - s.evicted   # kv_eviction: tokens in the cache
            for i, b in enumerate(s.block_table):
                fill[b] = max(fill.get(b, 0), min(bs, max(0, n - i * bs)))
                owners[b] = owners.get(b, 0) + 1
        pending.filled, pending.shared = sum(fill.values()), sum(1 for c in owners.values() if c > 1)
        return pending

    def after_update(self, batch, drafts, verdicts, pending: "Pending", start: float, draft_seconds: float,
                     run_seconds: float, end: float):
        """The step's record: it began at `start`, proposing took draft_seconds, the model call run_seconds."""
        block_bytes, block_size, spec = self.block_bytes, self.block_size, []
        if any(r.lookahead for r in batch.rows):            # a speculative step: its counters, kept with trace=False
            spec = [(row, d, v, before) for row, d, v, before in zip(batch.rows, drafts, verdicts, pending.before)
                    if row.lookahead and v.error is None]
            self._count_spec(spec, draft_seconds, run_seconds)
        if self.enabled:
            rows = [r for r in batch.rows if r.writes]
            phases = ["prefill" if r.prefill else "decode" for r in rows] + ["fork"] * len(batch.forks)
            decoded = sum(len(r.seq.output_ids) - b if r.lookahead else 1
                          for r, b in zip(batch.rows, pending.before) if r.writes and not r.prefill)
            self.record(StepRecord(
                step=self.count, kind=batch.kind,
                seq_ids=[r.seq.seq_id for r in rows] + [c.seq_id for _, c in batch.forks],
                phases=phases, padding_ids=[s.seq_id for s in batch.padding],
                num_prefill_tokens=batch.num_prefill_tokens,
                num_decode_tokens=decoded, num_padding=len(batch.padding), blocks_used=pending.used,
                blocks_free=pending.free, kv_bytes_used=pending.used * block_bytes,
                kv_bytes_filled=pending.filled * block_bytes // block_size, start=start, seconds=end - start,
                spec=[self._spec_entry(r, v, b) for r, _, v, b in spec],
                draft_seconds=draft_seconds, verify_seconds=run_seconds,
                blocks_shared=pending.shared, pruned=list(batch.pruned)))
        self.count += 1

    @staticmethod
    def _spec_entry(row, v, before) -> dict:
        out = row.seq.output_ids[before:]                  # cut where the sequence stopped
        return {"seq_id": row.seq.seq_id, "request_id": row.seq.request_id, "index": row.seq.index,
                "drafted": list(v.drafted), "accepted": min(v.accepted, len(out)), "emitted": list(out)}

    def _count_spec(self, spec: list, draft_seconds: float, verify_seconds: float):
        st = self.spec_stats
        st["steps"] += 1
        st["draft_seconds"] += draft_seconds
        st["verify_seconds"] += verify_seconds
        for row, _, v, before in spec:
            emitted = len(row.seq.output_ids) - before
            st["rows"] += 1
            st["drafted"] += len(v.drafted)
            st["examined"] += len(v.terms)
            st["alpha_sum"] += sum(v.terms)
            st["emitted"] += emitted
            st["accepted"] += min(v.accepted, emitted)


@dataclass
class BlockSnapshot:
    """The KV pool at one moment: each physical block's owners (sequence ids; several = shared),
    how many of its slots hold tokens, and whether it is a prefix-cache block."""
    num_blocks: int
    block_size: int
    owners: list
    filled: list
    cached: list


def block_snapshot(scheduler) -> BlockSnapshot:
    """Who holds which physical block right now, as plain data for minillm.viz's block map."""
    bm = scheduler.block_manager
    bs = bm.block_size
    owners = [[] for _ in range(bm.num_blocks)]
    filled = [0] * bm.num_blocks
    for s in scheduler.running + scheduler.padding:
        for i, b in enumerate(s.block_table):
            owners[b].append(s.seq_id)
            filled[b] = max(filled[b], min(bs, max(0, s.num_computed - s.evicted - i * bs)))
    cached = [bool(getattr(bm, "is_cached", lambda b: False)(b)) for b in range(bm.num_blocks)]
    return BlockSnapshot(bm.num_blocks, bs, owners, filled, cached)
