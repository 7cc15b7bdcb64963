"""What happened, step by step, as plain data. The engine records; minillm.viz draws; tests read."""
from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass
class Trace:
    enabled: bool = True
    steps: list = field(default_factory=list)

    def record(self, rec: StepRecord):
        if self.enabled:
            self.steps.append(rec)

    def spec_events(self, request_id, index: int = 0) -> list[dict]:
        """One sequence's speculative steps in order: [{"drafted", "accepted", "emitted"}] (viz.spec_text_html)."""
        return [{k: e[k] for k in ("drafted", "accepted", "emitted")} for st in self.steps for e in st.spec
                if e["request_id"] == str(request_id) and e["index"] == index]


@dataclass
class BlockSnapshot:
    """The KV pool at one moment: each physical block's owners (sequence ids; several = shared),
    how many of its slots hold tokens, and whether it is a prefix-cache block."""
    num_blocks: int
    block_size: int
    owners: list
    filled: list
    cached: list
