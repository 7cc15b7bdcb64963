"""What compiling one guided request may cost, checked as early as each limit can be known, so that a hostile
pattern is refused in milliseconds or within its time, never after a long build (the server compiles off its event
loop too: minillm.serve.async_engine).

    1. length, from the pattern's tree alone: its shortest match has n bytes, so it takes at least
       ceil(n / the vocabulary's longest token) tokens; more than the request's max_tokens leave is refused before
       any automaton is built (a string schema with minLength 500 and max_tokens 10 took 20 s to refuse before);
    2. states: the DFA may not pass the states whose token-mask table (S x V int32 + bool) fits MAX_INDEX_BYTES,
       checked as the subset construction adds them (minillm.guided.fsm);
    3. time: `seconds` of wall clock, checked between the rounds of every stage (subset construction,
       minimisation, the token walk). A refusal names the limit, what passed it and what to try.
With `workers` (the server's: minillm.guided.workers) the DFA is built in a child process, which the budget's
deadline (CLOCK_MONOTONIC is one clock for every process) holds too; without, in the calling thread.
"""
from __future__ import annotations

import math
import time
from typing import Optional

from .regex import RegexError, min_bytes

MAX_DFA_STATES = 4096            # at most, whatever the vocabulary
MAX_INDEX_BYTES = 384 * 2**20    # the (S, V) mask tables of one constraint: next (int32) and allowed (bool)


def max_states(vocab_size: int) -> int:
    """The most DFA states a constraint may have over a vocabulary of vocab_size tokens: 4096 for the shipped
    models' 4096 tokens, 530 for Qwen's 151,936."""
    return max(1, min(MAX_DFA_STATES, MAX_INDEX_BYTES // (5 * vocab_size)))


class CompileBudget:
    """seconds: the wall-clock time the compile may take (None: no limit); tokens: the most tokens the output may
    have (None: not checked here); name: the request's option, for messages."""

    def __init__(self, seconds: Optional[float] = None, tokens: Optional[int] = None, name: str = "guided_regex",
                 max_tokens: Optional[int] = None, workers=None):
        self.seconds, self.tokens, self.name = seconds, tokens, name
        self.max_tokens = tokens if max_tokens is None else max_tokens      # what the user asked (for messages)
        self.deadline = math.inf if seconds is None else time.monotonic() + seconds
        self.workers = workers

    def __getstate__(self):                      # what a worker process gets: the limits, not the pool
        return {**self.__dict__, "workers": None}

    def build(self, fn, *args):
        """fn(*args, self): in a worker process if the budget has workers (waiting at most the time left plus
        their grace before killing it), else here."""
        if self.workers is None:
            return fn(*args, self)
        from .workers import GRACE_S
        left = None if self.seconds is None else max(0.0, self.deadline - time.monotonic()) + GRACE_S
        try:
            return self.workers.run(fn, (*args, self), left)
        except TimeoutError as e:
            raise RegexError(f"{self.name}: compiling it took longer than its budget of {self.seconds:g} s "
                             f"(EngineConfig.guided_compile_timeout_s): {e}") from None

    def check_time(self, stage: str):
        """Raise once the budget's time has passed (called between rounds: a round is milliseconds)."""
        if time.monotonic() > self.deadline:
            raise RegexError(f"{self.name}: compiling it took longer than its budget of {self.seconds:g} s "
                             f"(EngineConfig.guided_compile_timeout_s) while {stage}: simplify the pattern (shorter "
                             "counted repeats {n,m}, minLength / maxLength, fewer optional properties)")

    def check_length(self, ast, longest_token: int):
        """Refuse, before any state is built, a pattern whose shortest match cannot fit in self.tokens tokens."""
        if self.tokens is None:
            return
        n = min_bytes(ast)
        if n == math.inf:                        # matches nothing: the build says so at once (fsm._trim)
            return
        need = math.ceil(n / max(1, longest_token))
        if need > self.tokens:
            raise ValueError(f"{self.name}: the shortest complete match has {n} bytes, so at least {need} tokens "
                             f"(this vocabulary's longest token has {longest_token} bytes), but max_tokens="
                             f"{self.max_tokens} (and max_model_len) leave {self.tokens}: raise max_tokens")


NO_BUDGET = CompileBudget()
