"""A request as the engine holds it: the prompt (text and ids), its sampling parameters and its n samples."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .outputs import CompletionOutput, RequestOutput
from .sampling import SamplingParams


@dataclass
class Request:
    request_id: str
    prompt: Optional[str]          # the text, when the prompt was text
    prompt_ids: list               # BOS included
    params: SamplingParams
    arrival_time: float
    seqs: list                     # [Sequence] one per sample (n)

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def output(self) -> RequestOutput:
        outs = [CompletionOutput(s.index, s.text, list(s.output_ids), s.finish_reason, s.stop_reason, s.error)
                for s in self.seqs]
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_ids), outs, self.finished,
                             self.seqs[0].metrics)
