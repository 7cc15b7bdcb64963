"""Streaming: what is new in a request since the last look, as deltas of text and token ids.

A sequence's text is not always an extension of what it was one step earlier, so a stream cannot just send
the difference: a character split across byte tokens decodes to U+FFFD until its last byte arrives, and a stop
string is cut out of the text once it is complete, after its first characters may already be there. So a
stream holds back, until the sequence finishes, trailing U+FFFD characters and the longest end of the text that
could still grow into a stop string (vLLM's detokenizer holds back stop-string prefixes the same way). What it
has sent is then always a prefix of the final text: concatenating the deltas gives exactly the text that
LLM.generate returns.

`stream(engine, prompt, params)` is streaming from the engine directly, in one thread: add_request, then step
and yield what each step added (notebook 00). The server (minillm.serve.async_engine) uses the same DeltaTracker.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

REPLACEMENT = "\ufffd"


@dataclass
class Delta:
    """What one sample (choice `index`) added since the last delta."""
    index: int
    text: str
    token_ids: list
    finish_reason: Optional[str] = None     # set on the sample's last delta: "stop", "length", "abort", "error"
    stop_reason: object = None
    error: Optional[str] = None
    logprobs: list = field(default_factory=list)   # per new token {token id: logprob}, with logprobs=k


def stable_length(text: str, stops: list, finished: bool) -> int:
    """How much of `text` can be sent now without ever being taken back (see the module doc)."""
    if finished:
        return len(text)
    n = len(text)
    while n > 0 and len(text) - n < 3 and text[n - 1] == REPLACEMENT:    # a character still arriving byte by byte
        n -= 1
    held = 0
    for s in stops:                  # the longest end of text[:n] that begins a stop string
        for k in range(min(len(s) - 1, n), held, -1):
            if text.endswith(s[:k], 0, n):
                held = k
                break
    return n - held


class DeltaTracker:
    """What has been sent of each sample of one request."""

    def __init__(self, stops: list):
        self.stops = list(stops)
        self.sent_text: dict[int, int] = {}      # sample index -> characters sent
        self.sent_tokens: dict[int, int] = {}    # sample index -> token ids sent
        self.done: set = set()

    def deltas(self, out) -> list[Delta]:
        """out: the request's RequestOutput now -> a Delta for each sample with something new."""
        found = []
        for c in out.outputs:
            if c.index in self.done:
                continue
            finished = c.finish_reason is not None
            t0, n0 = self.sent_text.get(c.index, 0), self.sent_tokens.get(c.index, 0)
            t1 = max(t0, stable_length(c.text, self.stops, finished))
            if t1 == t0 and len(c.token_ids) == n0 and not finished:
                continue
            self.sent_text[c.index], self.sent_tokens[c.index] = t1, len(c.token_ids)
            lp = list(c.logprobs[n0:]) if c.logprobs is not None else []
            found.append(Delta(c.index, c.text[t0:t1], list(c.token_ids[n0:]), c.finish_reason, c.stop_reason,
                               c.error, lp))
            if finished:
                self.done.add(c.index)
        return found


def stream(engine, prompt, params=None, request_id: Optional[str] = None) -> Iterator[Delta]:
    """Run one request on `engine` (an LLMEngine; llm.engine) and yield its deltas as the engine makes them.
    Other requests already in the engine run alongside. Stopping the iteration early aborts the request and
    frees its blocks."""
    from ..core.sampling import SamplingParams
    params = params or SamplingParams()
    rid = engine.add_request(prompt, params, request_id)
    tracker, finished = DeltaTracker(params.stop), False
    try:
        while not finished:
            for out in engine.step():
                if out.request_id == rid:
                    finished = out.finished
                    yield from tracker.deltas(out)
    finally:                                        # this request only: others in the engine go on
        if rid in engine.requests:
            if not engine.requests[rid].finished:
                engine.abort(rid)
            engine.requests.pop(rid)
