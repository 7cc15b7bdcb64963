"""The per-request masking processor, and jump-forward. The one engine path runs it as a logits processor
(minillm.core.sampling.transform_logits), after the user's processors and before penalties, temperature, top-k /
top-p / min-p (vLLM v0 appends its guided-decoding processor to the request's list the same way), so the mask
composes with all of them: a masked logit is -inf, and stays -inf through every later step.

The processor derives its DFA state from the output token ids it is given (cached by the ids, so each step costs
one transition), never from hidden per-sequence state: speculative verification calls it on the drafts' path
(minillm.core.verify's at(j)), n > 1 samples share it, and a preempted sequence recomputed from scratch finds its
state again. Its mask is length-aware: with L = budget - len(ids) tokens left (budget = min(max_tokens,
max_model_len - prompt length)), a token is allowed only if an accepting state stays reachable in L - 1 more, so
the output never runs out of tokens mid-pattern; EOS (and the request's stop_token_ids) only where the state
accepts; in an accepting state with no way on, EOS alone.

Jump-forward (SGLang: Zheng et al. 2024, "SGLang: Efficient Execution of Structured Language Model Programs"):
after the step's sampled tokens, where the DFA allows a single next byte, those forced bytes are appended at
once as the tokenizer's own tokens (and EOS too when the pattern is then complete with no way on), without
sampling. The engine's scheduler then computes them as one multi-token row in the next step (like a prompt
chunk): one forward instead of one per token. Off for requests that ask for logprobs or best_of (forced tokens
have no logits of their own), and where LLMEngine.jump_forward is False.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from .budget import NO_BUDGET, CompileBudget
from .token_index import UNREACHABLE, TokenIndex, compile_choice, compile_json, compile_regex

CACHE_ENTRIES = 64      # ids -> state entries kept per request (the newest; an older prefix is re-walked)


class GuidedProcessor:
    """fn(output token ids, logits (V,)) -> logits (V,) with every token the constraint forbids at -inf."""

    def __init__(self, index: TokenIndex, budget: int, after_bos: bool, jump_forward: bool = True,
                 stop_token_ids=(), name: str = "guided"):
        """budget: the most tokens the output may have; after_bos: the prompt ends in BOS (see TokenIndex)."""
        self.index, self.budget, self.jump_forward, self.name = index, budget, jump_forward, name
        self.start = index.start_after_bos if after_bos else index.start
        self.stop_ids = [t for t in stop_token_ids if t != index.vocab.eos and 0 <= t < index.vocab.size]
        self._states: dict[tuple, int] = {(): self.start}
        self.forced = 0                 # tokens appended by jump-forward (each would have been one decode step)
        self.jumps = 0                  # times it jumped
        self.calls, self.seconds = 0, 0.0   # masks applied, and the time spent in them (bench guided)

    def state(self, ids) -> int:
        """The DFA state after the output ids (-1: they left the pattern, e.g. a draft the mask would refuse)."""
        key = tuple(ids)
        s = self._states.get(key)
        if s is None:
            prev = self._states.get(key[:-1]) if key else None
            s = self.index.walk(self.start, key) if prev is None else self.index.next_state(prev, key[-1])
            if len(self._states) >= CACHE_ENTRIES:
                for k in list(self._states)[1:CACHE_ENTRIES // 2]:   # drop the oldest half, keep ()
                    del self._states[k]
            self._states[key] = s
        return s

    def __call__(self, ids, logits: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        s = self.state(ids)
        if s < 0:                       # only after a draft token the mask forbids: that slot is never used
            bias = torch.full((logits.shape[-1],), float("-inf"))
            bias[self.index.vocab.eos] = 0.0
        else:
            bias = self.index.bias(s, self.budget - len(ids))
            if self.stop_ids:           # a stop token ends the output: only where the pattern is complete
                bias = bias.clone()
                bias[self.stop_ids] = 0.0 if self.index.accepting[s] else float("-inf")
        out = logits + bias             # (V,): -inf where the constraint forbids
        self.calls += 1
        self.seconds += time.perf_counter() - t0
        return out

    def jump(self, ids) -> list[int]:
        """The tokens forced after ids (jump-forward), each one checked against the tokens left."""
        index = self.index
        if not self.jump_forward or not ids or ids[-1] == index.vocab.eos or ids[-1] in self.stop_ids:
            return []
        s, left, out = self.state(ids), self.budget - len(ids), []
        if s < 0:
            return []
        for t in index.forced_tokens(s):
            nxt = index.next_state(s, t)
            if nxt < 0 or left < 1 or 1 + index.dist[nxt] > left or t in self.stop_ids:
                break
            out.append(t)
            s, left = nxt, left - 1
        if index.accepting[s] and index.max_need[s] == 0 and left >= 1:   # complete, no way on: EOS alone is legal
            out.append(index.vocab.eos)
        self.forced += len(out)
        self.jumps += bool(out)
        return out


def guided_index(params, tokenizer, budget: CompileBudget = NO_BUDGET) -> tuple[TokenIndex, str] | None:
    """The compiled constraint a SamplingParams asks for, and its name; None without guided_*."""
    if params.guided_regex is not None:
        return compile_regex(params.guided_regex, tokenizer, budget=budget), "guided_regex"
    if params.guided_json is not None:
        return compile_json(params.guided_json, tokenizer, budget), "guided_json"
    if params.guided_choice is not None:
        return compile_choice(params.guided_choice, tokenizer, budget), "guided_choice"
    return None


def attach(params, tokenizer, prompt_ids: list, max_model_len: int, jump_forward: bool = True,
           timeout_s: float | None = None, workers=None):
    """SamplingParams with guided_* -> a copy whose logits_processors end with this request's GuidedProcessor
    (the caller's object is left alone: LLM.generate shares one among prompts). Anything wrong is a ValueError
    here, before the request is queued: an unsupported construct or keyword, a pattern no token sequence can
    complete, one whose shortest match needs more tokens than max_tokens allows (checked on the pattern's tree
    before its DFA is built, then exactly), a conflicting option, a compile past timeout_s seconds or past the
    states whose masks fit in memory (minillm.guided.budget); workers: where the DFA is built (None: here)."""
    if params.guided_regex is None and params.guided_json is None and params.guided_choice is None:
        return params
    name = next(n for n in ("guided_regex", "guided_json", "guided_choice") if getattr(params, n) is not None)
    if params.ignore_eos:
        raise ValueError(f"{name} with ignore_eos=True: a constrained output ends with EOS once its pattern is "
                         "complete; leave ignore_eos False")
    if params.stop:
        raise ValueError(f"{name} with stop strings {params.stop!r}: a stop string could end the output before "
                         "the pattern completes, and the output would not match; drop stop")
    budget = min(params.max_tokens, max_model_len - len(prompt_ids))
    index, name = guided_index(params, tokenizer, CompileBudget(timeout_s, budget, name, params.max_tokens, workers))
    after_bos = prompt_ids[-1] == tokenizer.bos_id
    need = index.min_tokens(after_bos)
    if need >= UNREACHABLE:
        raise ValueError(f"{name}: no sequence of this tokenizer's tokens can complete a match (a character no token "
                         "can produce, such as NUL: byte tokens <0x00> print nothing)")
    if need > budget:
        raise ValueError(f"{name}: the shortest complete match takes {need} tokens but max_tokens={params.max_tokens}"
                         f" (and max_model_len) leave {budget}: raise max_tokens")
    scored = params.logprobs is not None or (params.best_of or params.n) > params.n   # forced tokens have no logits
    stops = list(params.stop_token_ids) + sorted(getattr(tokenizer, "stop_ids", ()))   # Qwen's <|im_end|>, Llama 3's
    proc = GuidedProcessor(index, budget, after_bos, jump_forward and not scored, stops, name)  # <|eot_id|> too
    return dataclasses.replace(params, logits_processors=list(params.logits_processors or []) + [proc])


def processor_of(params) -> GuidedProcessor | None:
    """The request's GuidedProcessor, if it has one."""
    return next((f for f in params.logits_processors or [] if isinstance(f, GuidedProcessor)), None)


def jump_forward(seq, tokens: list) -> list[int]:
    """The tokens the request's constraint forces after its output and this step's tokens (the engine appends
    them with the step's: JumpForward)."""
    proc = processor_of(seq.params)
    return proc.jump(seq.output_ids + tokens) if proc is not None and proc.jump_forward and tokens else []


class JumpForward:
    """The engine's post-processor for guided_* requests (minillm.core.hooks.VerdictStep's methods; guided/ sits
    below core, so it does not import the class): after verification, each row that emitted tokens also emits the
    tokens its pattern forces next, without computing them."""

    def wants(self, request) -> bool:
        return processor_of(request.params) is not None

    def on_verdicts(self, batch, out, verdicts: list):
        seqs = [r.seq for r in batch.rows] + [child for _, child in batch.forks]
        for seq, v in zip(seqs, verdicts):
            if v.error is None and v.tokens and seq.params.logits_processors:
                try:
                    v.tokens += jump_forward(seq, v.tokens)
                except Exception as e:               # this request's problem: it ends with an error
                    v.error = f"{type(e).__name__}: {e}"

    def before_update(self, batch, out, verdicts: list):
        pass

    def on_update(self, batch, verdicts: list):
        pass

    def save(self, batch):
        pass                                             # it edits verdicts only: nothing to put back

    def restore(self, saved):
        pass
