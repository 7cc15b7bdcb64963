"""A request as the engine holds it: the prompt (text and ids), its sampling parameters and its n samples."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .logprobs import best, scored
from .outputs import CompletionOutput, RequestOutput
from .sampling import SamplingParams


@dataclass
class Request:
    request_id: str
    prompt: Optional[str]          # the text, when the prompt was text
    prompt_ids: list               # BOS included
    params: SamplingParams
    arrival_time: float
    seqs: list                     # [Sequence] one per sample (best_of, else n); beam search: the live beams
    beam: Optional[object] = None  # beam search: its BeamGroup (minillm.decoding.beam), which also makes its output

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def join(self, groups: dict):
        """As it is queued: a beam request's group joins the scheduler's groups (it runs and leaves whole)."""
        if self.beam is not None:
            groups[self.request_id] = self.beam

    def output(self) -> RequestOutput:
        """best_of > n: the n samples with the highest cumulative logprob, best first (each keeps its index)."""
        if self.beam is not None:
            return self.beam.output()
        p = self.params
        seqs = best(self.seqs, p.n) if p.num_samples > p.n else self.seqs
        outs = [CompletionOutput(s.index, s.text, list(s.output_ids), s.finish_reason, s.stop_reason, s.error,
                                 list(s.logprobs) if p.logprobs is not None else None,
                                 s.cumulative_logprob if scored(p) else None)
                for s in seqs]
        prompt_lp = self.seqs[0].prompt_logprobs
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_ids), outs, self.finished,
                             self.seqs[0].metrics, list(prompt_lp) if prompt_lp is not None else None)


def check_scheduling(priority, client, order):
    """priority: an int, read only by an order that uses it (vLLM refuses a priority without priority
    scheduling too: silently ignored, it would mislead); client: None, a str or an int naming who sent it."""
    if isinstance(priority, bool) or not hasattr(priority, "__index__"):
        raise ValueError(f"priority must be an integer (lower is served first), got {priority!r}")
    if priority != 0 and not getattr(order, "uses_priority", False):
        raise ValueError(f"priority={priority} needs scheduling_policy='priority' (this engine's order is "
                         f"{getattr(order, 'name', type(order).__name__)!r}, which would ignore it)")
    if client is not None and (isinstance(client, bool) or not isinstance(client, (str, int))):
        raise ValueError(f"client must be None, a str or an int naming who sent the request, got {client!r}")


def prompt_ids(prompt, tokenizer, vocab_size: int, max_model_len: int) -> list[int]:
    """A prompt (text, a list of token ids with BOS, a 1-D array or tensor) -> its token ids, or a ValueError
    naming what is wrong and the limit. Queues nothing."""
    if isinstance(prompt, (bytes, bytearray)):
        raise ValueError("prompt is bytes: pass text (str, e.g. prompt.decode('utf-8')) or a list of token ids")
    if isinstance(prompt, str):
        size, longest = len(prompt.encode("utf-8", "surrogateescape")), getattr(tokenizer, "max_token_length", 0)
        if longest and size >= max_model_len * longest:              # refused before tokenizing megabytes
            raise ValueError(f"prompt has {size} bytes (>= {size // longest} tokens); max_model_len is {max_model_len}")
        ids = tokenizer.encode(prompt)
    elif hasattr(prompt, "tolist") and getattr(prompt, "ndim", 0) == 1:   # a numpy array or torch tensor
        ids = prompt.tolist()
    elif hasattr(prompt, "__len__") and not isinstance(prompt, dict):
        ids = list(prompt)
    else:
        raise ValueError(f"prompt must be text or a list of token ids, got {type(prompt).__name__}")
    V, limit = vocab_size, max_model_len
    bad = [t for t in ids if isinstance(t, bool) or not hasattr(t, "__index__") or not 0 <= int(t) < V]
    if bad:
        raise ValueError(f"prompt token ids must be integers in [0, {V}), got {bad[:5]}")
    ids = [int(t) for t in ids]
    if not ids:
        raise ValueError("prompt is empty: pass text or at least one token id")
    if len(ids) >= limit:
        raise ValueError(f"prompt has {len(ids)} tokens but max_model_len is {limit}: "
                         f"it must be shorter to leave room for at least one generated token")
    return ids
