"""echo, max_tokens=0 and prompt_logprobs on /v1/completions: a prompt scored, as evaluation harnesses ask.

lm-evaluation-harness's `local-completions` model scores a continuation by sending context + continuation as the
prompt with echo=True, logprobs=1 and max_tokens=1 (or 0), then summing the echoed prompt tokens' logprobs past
the context. vLLM's server answers it so; this module does the same on the engine's prompt_logprobs
(minillm.core.logprobs: the raw model distribution at every prompt position, the first token's null).
"""
from __future__ import annotations

from . import protocol as P
from .protocol import ServeError
from .stream import Delta


class Echo:
    """What a completion request asks of its prompt, as vLLM's server answers it: echo=True puts the prompt's
    text (and token ids, and with logprobs=k its tokens' logprobs, the first null) before the completion;
    max_tokens=0 with echo scores the prompt alone (one token is generated and dropped); prompt_logprobs=k
    (vLLM's field) adds each choice's prompt_logprobs."""

    def __init__(self, echo: bool = False, score_only: bool = False, k=None, prompt_logprobs=None):
        self.echo, self.score_only, self.k, self.prompt_logprobs = echo, score_only, k, prompt_logprobs
        asked = [x for x in (k if echo else None, prompt_logprobs) if x is not None]
        self.prompt_k = max(asked) if asked else None          # what the engine scores each prompt token with

    @classmethod
    def of(cls, req: P.CompletionRequest, max_logprobs: int) -> "Echo":
        if req.suffix:
            raise ServeError("suffix is not supported by this server (no fill-in-the-middle model)", param="suffix")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(req, name)
            if isinstance(k, int) and not isinstance(k, bool) and k > max_logprobs:
                raise ServeError(f"{name}={k} is above this server's limit of {max_logprobs} per token",
                                 param=name)
        if req.echo and req.stream:
            raise ServeError("echo=true cannot stream on this server: ask without stream", param="echo")
        zero = req.max_tokens == 0 and not isinstance(req.max_tokens, bool)
        if zero and not req.echo:
            raise ServeError("max_tokens=0 generates nothing: it needs echo=true (to score the prompt)",
                             param="max_tokens")
        return cls(req.echo, zero, req.logprobs, req.prompt_logprobs)

    def prompt_text(self, tokenizer, output) -> str:
        return output.prompt if output.prompt is not None else tokenizer.decode(output.prompt_token_ids)

    def apply(self, tokenizer, output, d: Delta) -> Delta:
        """The final Delta of a sample -> the one the client sees (the prompt first; alone when scoring)."""
        if not self.echo:
            return d
        text, ids = self.prompt_text(tokenizer, output), list(output.prompt_token_ids)
        lp = [P.top(e, self.k) for e in output.prompt_logprobs] if self.k is not None else []
        if self.score_only:
            return Delta(d.index, text, ids, "length", None, d.error, lp)
        return Delta(d.index, text + d.text, ids + d.token_ids, d.finish_reason, d.stop_reason, d.error,
                     lp + d.logprobs if self.k is not None else [])
