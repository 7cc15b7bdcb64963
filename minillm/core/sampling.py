"""Sampling: SamplingParams (vLLM's names), the engine's batched sampler, and run.c's own sampler.

Each sequence samples with its own torch.Generator, seeded from its request, so a request's output
does not depend on what else shares its batch. Order of operations, as vLLM and HF apply them:
temperature, then top-k, then top-p (the smallest set of tokens whose probability reaches top_p).
temperature == 0 is greedy (argmax, first index on ties, like run.c's sample_argmax).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..config import _check_bool, _check_int, _check_list, _check_real, _is_int

_SAMPLING_EPS = 1e-5


@dataclass
class SamplingParams:
    n: int = 1
    best_of: Optional[int] = None   # sample best_of, return the n with the highest cumulative logprob (None: n)
    temperature: float = 1.0
    top_k: int = 0            # 0: off
    top_p: float = 1.0        # 1.0: off
    min_p: float = 0.0        # 0.0: off; keep tokens with p >= min_p * p_max
    repetition_penalty: float = 1.0   # 1.0: off; > 1 discourages tokens already in the prompt or output (CTRL)
    frequency_penalty: float = 0.0    # 0.0: off; minus this times the token's count in the output (OpenAI)
    presence_penalty: float = 0.0     # 0.0: off; minus this once a token has appeared in the output (OpenAI)
    seed: Optional[int] = None
    max_tokens: int = 16
    stop: Optional[list[str]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    # each fn(output_token_ids: list[int], logits (V,)) -> logits (V,), applied in order (vLLM v0's signature)
    logits_processors: Optional[list] = None
    logprobs: Optional[int] = None          # top-k log-probabilities per generated token (and the sampled one's)
    prompt_logprobs: Optional[int] = None   # the same for every prompt token after the first
    guided_regex: Optional[str] = None      # structured output (minillm.guided): at most one of these three
    guided_json: Optional[object] = None    # a JSON schema (dict or JSON text)
    guided_choice: Optional[list] = None    # one of these strings exactly

    def __post_init__(self):
        """Every field is type-checked here, so a bad value fails at the call, not mid-step in the engine
        (True is an int to Python, and top_k=True would otherwise reach torch.topk)."""
        S = "SamplingParams"
        self.n = _check_int(S, "n", self.n, 1)
        if self.best_of is not None:
            self.best_of = _check_int(S, "best_of", self.best_of, self.n, what=f"None or an integer >= n={self.n}")
        self.temperature = _check_real(S, "temperature", self.temperature, "a finite number >= 0")
        self.top_k = _check_int(S, "top_k", self.top_k, 0, what="an integer >= 0 (0 disables it)")
        self.top_p = _check_real(S, "top_p", self.top_p, "a number in (0, 1]", lambda p: 0 < p <= 1)
        self.min_p = _check_real(S, "min_p", self.min_p, "a number in [0, 1]", lambda p: 0 <= p <= 1)
        self.repetition_penalty = _check_real(S, "repetition_penalty", self.repetition_penalty,
                                              "a number > 0 (1.0 disables it)", lambda x: x > 0)
        for name in ("frequency_penalty", "presence_penalty"):
            setattr(self, name, _check_real(S, name, getattr(self, name), "a number in [-2, 2] (0.0 disables it)",
                                            lambda x: -2 <= x <= 2))
        if self.seed is not None:
            self.seed = _check_int(S, "seed", self.seed, 0, 2**62, what="None or an integer in [0, 2**62)")
        self.max_tokens = _check_int(S, "max_tokens", self.max_tokens, 1)
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        self.stop = _check_list(S, "stop", stop, lambda s: isinstance(s, str) and s != "",
                                "non-empty strings (a str, or a list or tuple of them)")
        ids = _check_list(S, "stop_token_ids", self.stop_token_ids, lambda t: _is_int(t) and t >= 0,
                          "a list or tuple of non-negative integers")
        self.stop_token_ids = [int(t) for t in ids]
        _check_bool(S, "ignore_eos", self.ignore_eos)
        self.logits_processors = _check_list(S, "logits_processors", self.logits_processors, callable,
                                             "a list or tuple of callables fn(output_token_ids, logits) -> logits")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                setattr(self, name, _check_int(S, name, getattr(self, name), 0, what="None or an integer >= 0"))
        guided = [g for g in ("guided_regex", "guided_json", "guided_choice") if getattr(self, g) is not None]
        if len(guided) > 1:
            raise ValueError(f"SamplingParams: {' and '.join(guided)} were both given; structured output takes "
                             "one constraint (guided_regex, guided_json or guided_choice)")
        if self.guided_regex is not None and not isinstance(self.guided_regex, str):
            raise ValueError(f"SamplingParams.guided_regex must be a str, got {self.guided_regex!r}")
        if self.guided_json is not None and not isinstance(self.guided_json, (dict, str, bool)):
            raise ValueError(f"SamplingParams.guided_json must be a JSON schema (a dict or JSON text), "
                             f"got {type(self.guided_json).__name__}")
        if self.guided_choice is not None:
            self.guided_choice = _check_list(S, "guided_choice", self.guided_choice,
                                             lambda c: isinstance(c, str) and c != "", "a list of non-empty strings")
            if not self.guided_choice:
                raise ValueError("SamplingParams.guided_choice must list at least one string, got []")

    @property
    def greedy(self) -> bool:
        """temperature below 1e-5 is greedy, as in vLLM: logits / 1e-40 would overflow to inf."""
        return self.temperature < _SAMPLING_EPS


def probs_from_logits(logits, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """The distribution actually sampled from, after temperature, top-k and top-p. logits: (V,) -> (V,).
    Speculative decoding reuses this: p and q are both taken after these transforms. Tokens tied with
    the k-th largest logit are all kept (as vLLM and HF do), so top-k may keep more than k on ties."""
    logits = logits.float() / temperature                              # (V,)
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)                              # (V,)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)          # (V,)
        before = torch.cumsum(sorted_p, 0) - sorted_p                  # mass strictly before each token
        sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)          # keep the prefix that reaches top_p
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        probs = probs / probs.sum()
    return probs


def apply_processors(processors: list, token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    """Run a request's logits processors in order: fn(generated token ids, logits (V,)) -> logits (V,)."""
    for fn in processors:
        out = fn(list(token_ids), logits)
        if not isinstance(out, torch.Tensor) or out.shape != logits.shape:
            raise ValueError(f"logits processor {getattr(fn, '__name__', fn)!r} must return a tensor of shape "
                             f"{tuple(logits.shape)}, got {type(out).__name__} {tuple(getattr(out, 'shape', ()))}")
        logits = out
    return logits


def sample(logits, params: SamplingParams, generator: Optional[torch.Generator]) -> int:
    """One token from one row of logits (V,)."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = probs_from_logits(logits, params.temperature, params.top_k, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_batch(logits, params: list[SamplingParams], generators: list) -> list[int]:
    """logits: (B, V) -> B token ids, each row with its own params and generator."""
    return [sample(logits[b], params[b], generators[b]) for b in range(logits.shape[0])]


# ---------------------------------------------------------------------------- run.c's sampler
class RunCSampler:
    """llama2.c run.c's sampler: xorshift64* coins bit for bit, float32 softmax summed in run.c's order,
    its top-p (numpy's exp may differ from glibc's expf by an ulp, so rare near-ties can differ).
    `python -m minillm run` uses it so that -t/-p/-s behave exactly as run.c's flags do."""

    def __init__(self, temperature: float, topp: float, seed: int):
        self.temperature, self.topp = np.float32(temperature), np.float32(topp)
        self.state = np.uint64(seed)

    def random_u32(self) -> int:
        with np.errstate(over="ignore"):
            s = self.state
            s ^= s >> np.uint64(12)
            s ^= s << np.uint64(25)
            s ^= s >> np.uint64(27)
            self.state = s
            return int((s * np.uint64(0x2545F4914F6CDD1D)) >> np.uint64(32))

    def random_f32(self) -> np.float32:
        return np.float32(self.random_u32() >> 8) / np.float32(16777216.0)

    def __call__(self, logits) -> int:
        x = np.asarray(logits, dtype=np.float32)
        if self.temperature == 0:
            return int(np.argmax(x))
        x = x / self.temperature
        e = np.exp(x - x.max())
        p = (e / np.cumsum(e, dtype=np.float32)[-1]).astype(np.float32)  # run.c sums in order
        coin = self.random_f32()
        if self.topp <= 0 or self.topp >= 1:
            cdf = np.cumsum(p, dtype=np.float32)
            i = int(np.searchsorted(cdf, coin, side="right"))
            return min(i, len(p) - 1)
        cutoff = (np.float32(1.0) - self.topp) / np.float32(len(p) - 1)
        idx = np.nonzero(p >= cutoff)[0]
        idx = idx[np.argsort(-p[idx], kind="stable")]
        cum = np.cumsum(p[idx], dtype=np.float32)
        over = np.nonzero(cum > self.topp)[0]
        last = int(over[0]) if len(over) else len(idx) - 1
        r = coin * cum[last]
        j = int(np.searchsorted(cum[: last + 1], r, side="right"))
        return int(idx[min(j, last)])
