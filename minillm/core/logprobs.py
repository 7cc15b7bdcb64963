"""Log-probabilities: logprobs=k per generated token, prompt_logprobs=k per prompt token, cumulative_logprob,
and best_of's choice of samples.

Format (vLLM's): one dict {token id: logprob} per position, holding the token actually there (the sampled one, or
the prompt's) first, then the k most likely tokens (so k or k + 1 entries; logprobs=0 gives the token's alone).
A request's prompt_logprobs list starts with None (nothing predicts the first prompt token), then one dict per
prompt token.

Which distribution: the RAW model logits, log_softmax before logits processors, penalties, temperature, top-k,
top-p and min-p. That is vLLM v1's default (logprobs_mode="raw_logprobs"; vLLM v0 returned the processed ones):
it is the model's own probability of the text, the same whatever the sampling settings, finite for every token
(top-k would make the rest -inf), and comparable across requests, so best_of ranks samples by how likely the
model finds them, and a test can check it against log_softmax of a plain forward of the same tokens.

Where: the engine's post-processor Logprobs (a VerdictStep, run after verification) scores each emitted token
from the logits the step already holds (a draft the target accepted is scored at its own slot); the prompt's
entries come from the extra rows the runner computes for such a request (prompt_rows). After the scheduler's
update it keeps them for the tokens that update really appended (record: a stop may end a step's tokens early).
A request with prompt_logprobs takes no prefix-cache hits (as vLLM v1): a cached block's positions are never
computed, so they would have no logits.
"""
from __future__ import annotations

from typing import Optional

import torch

from .batch import Row, ScheduledBatch, Verdict
from .hooks import VerdictStep
from .sampling import SamplingParams


def scored(params: SamplingParams) -> bool:
    """Does this request need its tokens' logprobs? (asked for, or to pick best_of's samples)"""
    return params.logprobs is not None or params.num_samples > params.n


def check_logprobs(params: SamplingParams, vocab_size: int):
    """logprobs / prompt_logprobs may ask for at most the whole vocabulary (the engine knows V; SamplingParams
    does not)."""
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(params, name)
        if k is not None and k > vocab_size:
            raise ValueError(f"SamplingParams.{name}={k} asks for more tokens than the model's vocabulary has "
                             f"(V={vocab_size}): use at most {vocab_size}")


def entries(logits: torch.Tensor, tokens: list, k: Optional[int]) -> list[dict]:
    """logits (N, V) raw, tokens (N,) the token at each position -> N dicts {token: logprob}, the token's first,
    then the top k (k None or 0: the token's alone)."""
    wide = torch.promote_types(logits.dtype, torch.float32)           # float64 stays float64
    lp = torch.log_softmax(logits.to(wide), dim=-1)                     # (N, V)
    chosen = lp[torch.arange(len(tokens)), torch.as_tensor(tokens, dtype=torch.long)].tolist()   # (N,)
    out = [{t: x} for t, x in zip(tokens, chosen)]
    if k:
        top = torch.topk(lp, min(k, lp.shape[-1]), dim=-1)              # (N, k)
        for d, ids, vals in zip(out, top.indices.tolist(), top.values.tolist()):
            for t, x in zip(ids, vals):
                d.setdefault(t, x)
    return out


# ---------------------------------------------------------------------------- prompt logprobs
def prompt_rows(row: Row) -> list[int]:
    """The row's own token indices whose logits prompt_logprobs still needs: position p scores prompt token p + 1,
    so positions up to len(prompt) - 2, past those already recorded (a recompute after preemption, or a chunk
    a failed step repeats, asks only for what is missing). [] for other requests."""
    seq = row.seq
    if seq.prompt_logprobs is None or not row.writes:
        return []
    first = max(row.start, len(seq.prompt_logprobs) - 1)               # entry p + 1 comes from position p
    last = min(row.end, len(seq.prompt_ids) - 1)
    return list(range(first - row.start, last - row.start))


def prompt_entries(row: Row, first: int, logits: torch.Tensor) -> tuple[int, list[dict]]:
    """logits (n, V) at prompt positions first .. first + n - 1 -> (first, the dicts for tokens first + 1 ..)."""
    seq = row.seq
    tokens = seq.prompt_ids[first + 1:first + 1 + logits.shape[0]]
    return first, entries(torch.as_tensor(logits), tokens, seq.params.prompt_logprobs)


# ---------------------------------------------------------------------------- the engine's post-processor
class Logprobs(VerdictStep):
    """logprobs=k, prompt_logprobs=k and best_of's scores: computed from the step's logits after verification,
    kept after the update for what it appended."""

    def wants(self, request) -> bool:
        return scored(request.params) or request.params.prompt_logprobs is not None

    def on_verdicts(self, batch: ScheduledBatch, out, verdicts: list):
        rows = [(r.seq, logits, v) for r, logits, v in zip(batch.rows, out.logits, verdicts) if r.completes]
        rows += [(child, out.logits[i][:1], v) for (i, child), v in zip(batch.forks, verdicts[len(batch.rows):])]
        for seq, logits, v in rows:
            if v.error is None and scored(seq.params):
                score(seq, logits, v)
        for row, v, at in zip(batch.rows, verdicts, getattr(out, "prompt_logits", None) or ()):
            if at is not None and v.error is None:       # prompt_logprobs: (first position, logits (n, V))
                v.prompt_logprobs = prompt_entries(row, *at)

    def on_update(self, batch: ScheduledBatch, verdicts: list):
        record(batch, verdicts)


def score(seq, logits: torch.Tensor, v: Verdict):
    """Token i was predicted at slot 0, then at each accepted node + 1. logits (1 + k, V) raw."""
    try:
        slots = [0] + [a + 1 for a in v.path]
        v.logprobs = entries(logits[slots], v.tokens, seq.params.logprobs)
    except Exception as e:                               # this request's problem: it ends with an error
        v.error = f"{type(e).__name__}: {e}"


def record(batch: ScheduledBatch, verdicts: list):
    """Keep what verification scored, for what the scheduler's update appended (verdicts: one per row, then one
    per fork, as Scheduler.update takes them)."""
    pairs = [(r.seq, v) for r, v in zip(batch.rows, verdicts) if r.writes]
    pairs += [(child, v) for (_, child), v in zip(batch.forks, verdicts[len(batch.rows):])]
    for seq, v in pairs:
        if v.error is not None:
            continue
        if v.logprobs:
            fresh = v.logprobs[:len(seq.output_ids) - len(seq.logprobs)]
            start = len(seq.logprobs)
            seq.logprobs += fresh
            seq.cumulative_logprob += sum(d[seq.output_ids[start + i]] for i, d in enumerate(fresh))
        if v.prompt_logprobs and seq.prompt_logprobs is not None:
            first, dicts = v.prompt_logprobs
            have = len(seq.prompt_logprobs)                              # entries for tokens 0 .. have - 1
            if first + 1 <= have:
                seq.prompt_logprobs += dicts[have - first - 1:]


def best(seqs: list, n: int) -> list:
    """best_of: the n samples with the highest cumulative logprob (vLLM v0's choice for sampling, no length
    penalty), in that order; ties keep the lower index first."""
    return sorted(seqs, key=lambda s: -s.cumulative_logprob)[:n]
