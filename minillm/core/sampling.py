"""Sampling: SamplingParams (vLLM's names), the engine's batched sampler, and run.c's own sampler.

Each sequence samples with its own torch.Generator, seeded from its request, so a request's output
does not depend on what else shares its batch. The order of operations is vLLM's (v0 Sampler and v1
TopKTopPSampler), on one row of the model's logits (V,):

    logits processors   the public hook: SamplingParams.logits_processors, each fn(output ids, logits) -> logits,
                        in order (vLLM v0's signature; structured output's masks come after the user's)
    penalties           repetition (CTRL, Keskar et al. 2019, as HF and vLLM: positive logits divided by it,
                        negative ones multiplied, for every token in the prompt or the output), then
                        frequency and presence (OpenAI: minus freq * count in the output, minus pres once seen)
    temperature         logits / T  (T < 1e-5 is greedy: argmax of the penalised logits, first index on ties,
                        like run.c's sample_argmax; the steps below cannot change the argmax)
    top-k, top-p, min-p keep the k largest, then the smallest top set reaching top_p, then tokens with
                        p >= min_p * p_max (Nguyen et al. 2024, "min-p sampling"), renormalised
transform_logits does the first two, probs_from_logits the rest: speculative decoding takes both p and q
through probs_from_logits. Log-probabilities (logprobs=k) are of the raw logits: minillm.core.logprobs.
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
    """Pass options by name. The first ten fields keep the positions they always had (a positional call still
    means the same); the decoding options added later follow them."""
    n: int = 1
    temperature: float = 1.0
    top_k: int = 0            # 0: off
    top_p: float = 1.0        # 1.0: off
    seed: Optional[int] = None
    max_tokens: int = 16
    stop: Optional[list[str]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    # THE public hook: each fn(output_token_ids: list[int], logits (V,)) -> logits (V,), applied in order to the
    # raw logits before penalties and temperature (vLLM v0's signature; transform_logits)
    logits_processors: Optional[list] = None
    best_of: Optional[int] = None   # sample best_of, return the n with the highest cumulative logprob (None: n)
    min_p: float = 0.0        # 0.0: off; keep tokens with p >= min_p * p_max
    repetition_penalty: float = 1.0   # 1.0: off; > 1 discourages tokens already in the prompt or output (CTRL)
    frequency_penalty: float = 0.0    # 0.0: off; minus this times the token's count in the output (OpenAI)
    presence_penalty: float = 0.0     # 0.0: off; minus this once a token has appeared in the output (OpenAI)
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
        if self.greedy and self.best_of is not None and self.best_of > 1:
            raise ValueError(f"SamplingParams: best_of={self.best_of} with greedy sampling (temperature="
                             f"{self.temperature}): every sample would be the same argmax, so there is nothing to "
                             "choose from (vLLM refuses it too); set temperature > 0, or leave best_of None")

    @property
    def greedy(self) -> bool:
        """temperature below 1e-5 is greedy, as in vLLM: logits / 1e-40 would overflow to inf."""
        return self.temperature < _SAMPLING_EPS

    @property
    def penalized(self) -> bool:
        """Does any penalty change the logits?"""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def num_samples(self) -> int:
        """How many samples run: best_of (None: n). The n with the highest cumulative logprob are returned."""
        return self.best_of if self.best_of is not None else self.n


def probs_from_logits(logits, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0):
    """The distribution actually sampled from, after temperature, top-k, top-p and min-p. logits: (V,) -> (V,),
    already through transform_logits (processors, penalties). Speculative decoding reuses this: p and q are
    both taken after these transforms. Tokens tied with the k-th largest logit are all kept (as vLLM and HF
    do), so top-k may keep more than k on ties. min-p comes last, as in vLLM's sampler: its threshold is
    relative to the largest probability, which top-k and top-p always keep, so it is the same ratio p / p_max
    whether measured before or after their renormalisation."""
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
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)   # the max itself always stays
        probs = probs / probs.sum()
    return probs


def apply_penalties(logits: torch.Tensor, prompt_ids, output_ids, repetition: float = 1.0,
                    frequency: float = 0.0, presence: float = 0.0) -> torch.Tensor:
    """vLLM's apply_penalties on one row, logits (V,) -> a new (V,):
    repetition (CTRL; HF's RepetitionPenaltyLogitsProcessor): a token seen in the prompt or the output has its
    logit divided by `repetition` if positive, multiplied if not, so > 1 always makes it less likely;
    then frequency and presence (OpenAI's definition): logit -= frequency * count, then -= presence if count > 0,
    counting the OUTPUT only, as vLLM and OpenAI do. Negative frequency / presence encourage repeats.
    In numpy on the seen tokens only: the same values as vLLM's dense torch masks (each in the logits' dtype),
    about 3x faster per row (a dozen small torch ops cost more than the arithmetic)."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32)).numpy().copy()   # (V,) the caller's row stays
    one = x.dtype.type
    counts = np.bincount(np.asarray(output_ids, dtype=np.int64), minlength=x.shape[-1])  # (V,) count in the output
    if repetition != 1.0:
        seen = counts > 0                                                    # (V,)
        seen[np.asarray(prompt_ids, dtype=np.int64)] = True
        idx = np.flatnonzero(seen)                                           # (S,)
        v = x[idx]
        x[idx] = np.where(v > 0, v / one(repetition), v * one(repetition))
    idx = np.flatnonzero(counts)                                             # (U,) tokens in the output
    if frequency != 0.0:
        x[idx] -= one(frequency) * counts[idx].astype(x.dtype)
    if presence != 0.0:
        x[idx] -= one(presence)
    return torch.from_numpy(x)


def apply_processors(processors: list, token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    """Run a request's logits processors in order: fn(generated token ids, logits (V,)) -> logits (V,)."""
    for fn in processors:
        out = fn(list(token_ids), logits)
        if not isinstance(out, torch.Tensor) or out.shape != logits.shape:
            raise ValueError(f"logits processor {getattr(fn, '__name__', fn)!r} must return a tensor of shape "
                             f"{tuple(logits.shape)}, got {type(out).__name__} {tuple(getattr(out, 'shape', ()))}")
        logits = out
    return logits


def transform_logits(params: SamplingParams, prompt_ids, output_ids, logits: torch.Tensor) -> torch.Tensor:
    """The steps before temperature: the request's logits processors (user's first, in order), then its
    penalties. output_ids: the tokens generated so far (in speculative verification, followed by the drafts
    before this slot, which count as output: the same logits an uninterrupted decode would see).
    logits (V,) -> (V,); the same tensor when there is nothing to do."""
    if params.logits_processors:
        logits = apply_processors(params.logits_processors, output_ids, logits)
    if params.penalized:
        logits = apply_penalties(logits, prompt_ids, output_ids, params.repetition_penalty,
                                 params.frequency_penalty, params.presence_penalty)
    return logits


def sampling_probs(logits, params: SamplingParams):
    """probs_from_logits with a request's temperature, top_k, top_p and min_p. logits (V,) -> (V,)."""
    return probs_from_logits(logits, params.temperature, params.top_k, params.top_p, params.min_p)


def sample(logits, params: SamplingParams, generator: Optional[torch.Generator]) -> int:
    """One token from one row of logits (V,), already through transform_logits."""
    if params.greedy:
        return argmax(logits)
    return int(torch.multinomial(sampling_probs(logits, params), 1, generator=generator))


def argmax(logits) -> int:
    """The first index of the largest value of logits (V,), as torch.argmax; through numpy for a CPU float tensor
    (2 us instead of 13: a 32-sequence greedy step calls it 32 times), or a numpy array (the numba backend's)."""
    if isinstance(logits, np.ndarray):
        return int(logits.argmax())
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64, torch.float16):
        return int(logits.detach().numpy().argmax())
    return int(torch.argmax(logits))


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
