"""Verification: from a row's logits to the tokens it emits. Plain sampling is the case of no drafts (k = 0).

Notation, fixed once (DESIGN.md rule 10): p is the TARGET's next-token distribution, q the DRAFT's (the
proposer's), both after the request's temperature, top-k, top-p and min-p (minillm.core.sampling.probs_from_logits);
p is also after its logits processors and penalties (transform_logits), which see the drafts before a slot as
output, as they will be once accepted. A row with drafts x_1..x_k was scored in one forward at its newest
token and every draft, giving p_1..p_{k+1} (p_i is the target's distribution for the slot x_i was drafted into).

- k = 0: one token from p_1 (argmax when greedy), with the sequence's own generator.
- greedy: the longest run of drafts that equal the target's argmax, then the target's own token after them.
  A draft tree (Medusa) is walked from the root, each time into the child the target agrees with.
- sampled (Leviathan et al. 2023, Chen et al. 2023), a chain only, by `rule` (default verify_sampled):
  accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); on the first rejection emit one token from
  norm(max(0, p_i - q_i)) (or p_i if that residual is 0) and stop; if all k are accepted, a bonus token from
  p_{k+1}. Every emitted token is then distributed exactly as the target alone would sample it:
  P(emit y) = min(p(y), q(y)) + (1 - sum_x min(p, q)) * max(0, p(y) - q(y)) / sum_x max(0, p - q) = p(y).
  A proposer without a distribution (n-gram lookup) is the one-hot q = [x_i]: accept with p_i(x_i), and the
  residual is p_i with x_i removed.
The rule is a seam: `prepare(..., verify=my_rule)` (or LLM(..., verify=...)) plugs in another with the same
signature, rule(p (k + 1, V), q (k, V) or None, draft ids, generator) -> (n accepted, token emitted).

This file is the acceptance rule and nothing else. What acts on the verdicts afterwards runs as the engine's
post-processors (minillm.core.hooks.VerdictStep): logprobs (minillm.core.logprobs), structured output's
jump-forward (minillm.guided), beam search's choice of beams.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .batch import Draft, ScheduledBatch, Verdict
from .sampling import argmax, sample, sampling_probs, transform_logits
from .sequence import Sequence


def verify_greedy(target_next: list[int], draft: list[int]) -> int:
    """How many drafted tokens a greedy target accepts: the longest prefix with draft[i] == target_next[i]
    (target_next[i] = argmax p_{i+1}). The emitted tokens are draft[:n] + [target_next[n]]."""
    n = 0
    while n < len(draft) and draft[n] == target_next[n]:
        n += 1
    return n


def residual(p_i: torch.Tensor, q_i: Optional[torch.Tensor], x: int) -> torch.Tensor:
    """The distribution sampled after rejecting x: norm(max(0, p - q)), or p itself if that is all zero.
    q_i None is the one-hot q = [x]. p_i, q_i: (V,) -> (V,)."""
    if q_i is None:
        r = p_i.clone()
        r[x] = 0.0
    else:
        r = (p_i - q_i).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else p_i


def verify_sampled(p: torch.Tensor, q: Optional[torch.Tensor], draft: list[int], generator) -> tuple[int, int]:
    """Speculative sampling for one sequence. p (k + 1, V) target; q (k, V) draft, or None for a one-hot
    proposer; draft: the k drafted ids. One uniform draw per examined slot, then one draw for the emitted
    token, all from the sequence's own generator. -> (n accepted, the token emitted after them)."""
    for i, x in enumerate(draft):
        px = float(p[i, x])
        qx = 1.0 if q is None else float(q[i, x])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if qx <= 0.0 or u >= min(1.0, px / qx):        # rejected (a token q could not draw is never accepted)
            dist = residual(p[i], None if q is None else q[i], x)
            return i, int(torch.multinomial(dist, 1, generator=generator))
    return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=generator))


def greedy_path(draft: Draft, target_next: list[int]) -> list[int]:
    """target_next[j]: the target's argmax at the newest token (j = 0) and at draft node j - 1. Walk from the
    newest token into the child whose token the target predicted. -> accepted node indices, in order."""
    path, node = [], -1
    while True:
        children = [node + 1] if draft.is_chain else [c for c, p in enumerate(draft.parents) if p == node]
        nxt = next((c for c in children if c < len(draft) and draft.tokens[c] == target_next[node + 1]), None)
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


def verify_row(seq: Sequence, logits: torch.Tensor, draft: Optional[Draft], rule: Callable = verify_sampled) -> Verdict:
    """One row: logits (1 + k, V) at the newest token and at each draft. -> what to emit."""
    params = seq.params

    def at(j: int) -> torch.Tensor:              # row j's logits, after the request's processors and penalties
        if not (params.logits_processors or params.penalized):
            return logits[j]
        path = [] if j == 0 else [draft.tokens[a] for a in draft.ancestors(j - 1)]
        return transform_logits(params, seq.prompt_ids, seq.output_ids + path, logits[j])

    return _decide(seq, logits, draft, rule, at)


def _decide(seq: Sequence, logits: torch.Tensor, draft: Optional[Draft], rule: Callable, at: Callable) -> Verdict:
    params, k = seq.params, len(draft) if draft else 0
    if k == 0:
        return Verdict(tokens=[sample(at(0), params, seq.generator)])
    if params.greedy:
        nxt = [argmax(at(j)) for j in range(k + 1)]
        path = greedy_path(draft, nxt)
        last = path[-1] + 1 if path else 0
        if draft.is_chain:
            drafted = list(draft.tokens)
            terms = [float(draft.tokens[i] == nxt[i]) for i in range(min(len(path) + 1, k))]
        else:                                    # the accepted path, then the best-ranked child turned down
            refused = next((c for c, p in enumerate(draft.parents) if p == last - 1), None)
            drafted = [draft.tokens[a] for a in path] + ([draft.tokens[refused]] if refused is not None else [])
            terms = [1.0] * len(path) + [0.0] * (refused is not None)
        return Verdict([draft.tokens[a] for a in path] + [nxt[last]], len(path), path, drafted, terms)
    if not draft.is_chain:
        raise ValueError(f"a draft tree is verified greedily: it needs temperature=0, got {params.temperature}")
    p = torch.stack([sampling_probs(at(j), params) for j in range(k + 1)])   # (k + 1, V)
    n, tok = rule(p, draft.q, list(draft.tokens), seq.generator)
    m = min(n + 1, k)                                                        # slots examined
    q = draft.q
    terms = torch.minimum(p[:m], q[:m].to(p.dtype)).sum(-1) if q is not None else p[torch.arange(m), draft.tokens[:m]]
    return Verdict(list(draft.tokens[:n]) + [tok], n, list(range(n)), list(draft.tokens), terms.tolist())


def verify(batch: ScheduledBatch, drafts: list, out, rule: Callable = verify_sampled) -> list[Verdict]:
    """One Verdict per row (empty for a partial prompt chunk or padding), then one per fork: a sample forked off a
    finished prefill draws its first token from its parent's logits with its own generator. An exception from one
    request's parameters (its logits processor, say) becomes that request's error; the others go on."""
    verdicts = [_verdict(row, draft, logits, rule) for row, draft, logits in zip(batch.rows, drafts, out.raw)]
    for i, child in batch.forks:
        verdicts.append(_guarded(lambda: verify_row(child, out.logits[i][:1], None)))
    return verdicts


def _verdict(row, draft: Optional[Draft], logits, rule: Callable) -> Verdict:
    if not row.completes:
        return Verdict()                         # a partial prompt chunk, or padding: nothing to emit
    p = row.seq.params
    if not draft and p.greedy and not (p.logits_processors or p.penalized):
        return Verdict(tokens=[argmax(logits[0])])   # the common row: k = 0, greedy, logits as the model gave them
    return _guarded(lambda: verify_row(row.seq, torch.as_tensor(logits), draft, rule))


def _guarded(fn) -> Verdict:
    try:
        return fn()
    except Exception as e:
        return Verdict(error=error_text(e))


def error_text(e: Exception) -> str:
    """A request's own mistake as its finish message (finish_reason "error")."""
    return f"{type(e).__name__}: {e}"
