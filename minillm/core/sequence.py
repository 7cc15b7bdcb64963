"""A Sequence: one sample of one request, with its tokens, its blocks and its clock readings."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import torch

from .sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"     # preempted, its K/V in the swap space
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    token_times: list = field(default_factory=list)
    finished_time: Optional[float] = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0      # prompt tokens whose K/V came from the prefix cache

    @property
    def time_to_first_token(self) -> Optional[float]:
        """TTFT in seconds: arrival to first token (queueing + prefill); None before the first token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def time_per_output_token(self) -> Optional[float]:
        """TPOT in seconds: the mean gap between output tokens after the first; None with fewer than two."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)


class Sequence:
    def __init__(self, seq_id: int, request_id: str, index: int, prompt_ids: list[int],
                 params: SamplingParams, seed: int, arrival_time: float):
        self.seq_id, self.request_id, self.index = seq_id, request_id, index
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.status = Status.WAITING
        self.block_table: list[int] = []
        self.swap_table: list[int] = []   # its blocks in the swap pool while swapped out
        self.num_computed = 0         # tokens whose K/V are in the cache
        self.evicted = 0              # kv_eviction: tokens whose blocks left the cache (cache index: position - this)
        self.kv_scores = None         # kv_eviction h2o: (n_cache,) attention probability each cached token received
        self.finish_reason: Optional[str] = None
        self.stop_reason = None       # the stop string or token id that ended it
        self.error: Optional[str] = None  # finish_reason "error": what went wrong with this request
        self.text = ""                # decoded output, maintained by the engine
        self.text_bytes = b""         # its bytes (llama2.c tokenizers), extended one token per step
        self.logprobs: list = []      # per output token {token id: raw logprob}, if scored (minillm.core.logprobs)
        self.cumulative_logprob = 0.0  # the sum of its output tokens' logprobs (best_of ranks by it)
        self.prompt_logprobs: Optional[list] = None   # [None, {..}, ..] on the sample that prefills, if asked
        self.generator = torch.Generator().manual_seed(seed)
        self.metrics = RequestMetrics(arrival_time)
        self.priority = 0             # scheduling_policy "priority": lower is served first (vLLM)
        self.client = None            # who sent it (scheduling_policy "fair" keeps one counter per client)
        self.lora = None              # its LoRA adapter (minillm.lora.adapters.LoRAAdapter), or None: the base model

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_at(self, i: int) -> int:
        """Token i without building prompt + output (decode rows need one token per step)."""
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def lora_slot(self) -> int:
        """The engine slot of its LoRA adapter (resident while the sequence runs), -1 for none."""
        return -1 if self.lora is None else self.lora.slot

    @property
    def cache_salt(self):
        """What its K/V depend on besides its tokens: the adapter's digest, so that the prefix cache never shares a
        block across adapters (every block hash chains from it); None for the base model."""
        return None if self.lora is None else self.lora.digest

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def save(self) -> tuple:
        """What a step may change, for restore() if it fails (LLMEngine._transaction): every field, copies of its
        tables, and the lengths of the lists a step only appends to (output ids, logprobs, clock readings)."""
        m, plp = self.metrics, self.prompt_logprobs
        return (dict(vars(self)), list(self.block_table), list(self.swap_table), len(self.output_ids),
                len(self.logprobs), None if plp is None else len(plp), dict(vars(m)), len(m.token_times))

    def restore(self, saved: tuple):
        fields, table, swap, n_out, n_logprobs, n_prompt, metrics, n_times = saved
        vars(self).update(fields, block_table=table, swap_table=swap)
        del self.output_ids[n_out:], self.logprobs[n_logprobs:], self.metrics.token_times[n_times:]
        if n_prompt is not None:
            del self.prompt_logprobs[n_prompt:]
        vars(self.metrics).update(metrics)

    def __repr__(self):
        return f"Sequence(id={self.seq_id}, {self.status.value}, len={len(self)}, blocks={self.block_table})"
