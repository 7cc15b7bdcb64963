"""What generate() returns, with vLLM's names: RequestOutput.outputs[i].text / .token_ids, .metrics."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .sequence import RequestMetrics


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    finish_reason: Optional[str]   # "stop", "length", "abort", "error", or None while running
    stop_reason: object = None     # the stop string or token id, if one ended it
    error: Optional[str] = None    # finish_reason "error": what went wrong (the other requests went on)
    logprobs: Optional[list] = None             # logprobs=k: per token {token id: logprob}, the token's first
    cumulative_logprob: Optional[float] = None  # the sum of the tokens' logprobs (with logprobs or best_of)


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list
    outputs: list                  # [CompletionOutput] one per sample (n)
    finished: bool
    metrics: RequestMetrics        # of the first sample
    prompt_logprobs: Optional[list] = None   # prompt_logprobs=k: None, then per prompt token {token id: logprob}

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list:
        return self.outputs[0].token_ids
