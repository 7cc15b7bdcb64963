"""Beam search inside the one engine path: a request whose live beams are Sequences sharing KV blocks.

A beam group is ONE request (Request.beam). It starts as one sequence, the prompt; each engine step decodes
every live beam of the group in the same batch, and after verification the beam step (beam_step, called by
LLMEngine.step between the trace's before_update and the scheduler's update) does what HF's BeamSearchScorer
and vLLM's LLM.beam_search do, on log_softmax of the raw logits (float64):

    candidates = cum_logprob[beam] + log p(token | beam)   over every live beam and token   (W * V)
    the top 2W, best first: an end token (EOS/BOS, unless ignore_eos) ranked among the first W becomes a
    finished hypothesis; the others are kept as beams until W are kept

and then, for the blocks: a kept candidate whose parent keeps one child appends in place; each further child
FORKS its parent (BlockManager.fork: every block shared, ref counts up; the first write into a shared partial
block copies it, copy-on-write); a parent with no kept child is pruned (its blocks go back, unless a child still
shares them). The trace records both (StepRecord.blocks_shared, StepRecord.pruned), and the block map
(LLMEngine.block_snapshot) shows a block shared by beams as one block with several owners.

Scoring (HF's BeamHypotheses.add, vLLM's get_beam_search_score): a finished hypothesis scores
cum_logprob / length ** length_penalty, length = generated tokens without the end token (at least 1).
The group stops when max_tokens is reached (the live beams join the hypotheses, finish_reason "length"), or
early, when W hypotheses are finished and the worst of them is at least every live beam's best attainable
score: cum / max_tokens ** length_penalty if length_penalty > 0, else cum / length ** length_penalty (HF's
early_stopping="never" bound, the exact one: stopping early never changes the W returned). HF's default
heuristic (early_stopping=False, cum / current length) may stop before a live beam could still win; not used.

Beam search is deterministic: temperature, top-k/top-p and seeds do not apply (the beams' own SamplingParams
are greedy, so verification's argmax is cheap and then overridden here). Ties are broken by beam rank, then
token id, so the result does not depend on what else shares the batch.

Keeping the group whole (the simplest correct rule; vLLM v0 scheduled a beam group as one unit and swapped it
whole): when any beam is preempted (Scheduler.preempt), the whole group leaves and starts again from its prompt
(restart: recompute, whatever preemption_mode; the search is deterministic, so it finds the same beams again).
A request is refused up front unless beam_width times the blocks of prompt + max_tokens fit in the pool (so a
group alone never runs out) and beam_width fits the token budget of a step. Scheduler.extend of any beam
schedules all of the group's running beams or none (BeamGroup.extend). If part of a group runs all the same (a
beam recomputing after a failed step's rollback), the beams that ran are held: their newest token is computed
again next step, until all run together.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from ..config import _check_bool, _check_int, _check_real
from ..core.batch import Verdict
from ..core.hooks import VerdictStep
from ..core.outputs import CompletionOutput, RequestOutput
from ..core.sampling import SamplingParams
from ..core.sequence import RequestMetrics, Sequence, Status
from ..kernels import cdiv


# ---------------------------------------------------------------------------- what LLM.beam_search returns
@dataclass
class BeamSearchSequence:
    """One returned beam, vLLM's names: tokens include the prompt."""
    tokens: list
    cum_logprob: float
    score: float                   # cum_logprob / length ** length_penalty: what the beams are ranked by
    text: str
    finish_reason: Optional[str]   # "stop" (an end token), "length", "abort" or "error"
    stop_reason: object = None     # the end token id, if one ended it
    error: Optional[str] = None

    @property
    def token_ids(self) -> list:
        return self.tokens


@dataclass
class BeamSearchOutput:
    """The best beam_width sequences of one prompt, best first (vLLM's BeamSearchOutput)."""
    sequences: list
    request_id: str = ""
    prompt: Optional[str] = None
    prompt_token_ids: list = field(default_factory=list)


@dataclass
class Hypothesis:
    """A finished beam: by an end token (finish_reason "stop", the token kept in output_ids) or at max_tokens."""
    score: float
    cum_logprob: float
    output_ids: list
    finish_reason: str
    stop_reason: object = None


def beam_score(cum_logprob: float, length: int, length_penalty: float) -> float:
    """HF's length-normalised score; length counts generated tokens without the end token (at least 1)."""
    return cum_logprob / max(1, length) ** length_penalty


# ---------------------------------------------------------------------------- options, checked up front
@dataclass(frozen=True)
class BeamOptions:
    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    ignore_eos: bool = False

    @classmethod
    def check(cls, beam_width, max_tokens, length_penalty=1.0, ignore_eos=False, speculative=None) -> "BeamOptions":
        """The options, type-checked; speculative: the engine's (beams and speculation do not combine)."""
        S = "beam_search"
        if speculative is not None:
            raise ValueError("beam_search scores every beam one token a step: it does not combine with speculative "
                             f"decoding (this engine has speculative={speculative!r})")
        return cls(_check_int(S, "beam_width", beam_width, 1), _check_int(S, "max_tokens", max_tokens, 1),
                   _check_real(S, "length_penalty", length_penalty, "a finite number", lambda x: True),
                   _check_bool(S, "ignore_eos", ignore_eos))

    def params(self) -> SamplingParams:
        """The beams' own parameters: greedy (verification's token is overridden by the beam step), and no
        stop on an end token (the beam step turns an end token into a finished hypothesis itself)."""
        return SamplingParams(temperature=0.0, max_tokens=self.max_tokens, ignore_eos=True)

    def check_fits(self, prompt_len: int, *, num_blocks: int, block_size: int, max_model_len: int,
                   max_num_seqs: int, vocab_size: int, budget=float("inf")):
        """The whole group must fit at once (its beams run together): beam_width sequences of prompt + max_tokens
        tokens, in the worst case where no block is shared; one token each within a step's token budget.
        -> ValueError naming the value and the limit."""
        W = self.beam_width
        if W > max_num_seqs:
            raise ValueError(f"beam_search: beam_width={W} beams run together but max_num_seqs={max_num_seqs}: "
                             f"lower beam_width or raise max_num_seqs")
        if W > budget:
            raise ValueError(f"beam_search: beam_width={W} beams decode in the same step but a step computes at most "
                             f"max_num_batched_tokens={budget} tokens: lower beam_width or raise it")
        if 2 * W > vocab_size:
            raise ValueError(f"beam_search: beam_width={W} ranks 2 * beam_width candidates per step, more than the "
                             f"vocabulary's {vocab_size} tokens")
        per_beam = cdiv(min(prompt_len + self.max_tokens, max_model_len), block_size)
        if W * per_beam > num_blocks:
            raise ValueError(f"beam_search: beam_width={W} beams of up to {per_beam} KV blocks each ({prompt_len} "
                             f"prompt tokens + max_tokens={self.max_tokens}, block_size={block_size}) need "
                             f"{W * per_beam} blocks, but the whole pool has {num_blocks}: lower beam_width or "
                             f"max_tokens, or raise kv_cache_bytes")


# ---------------------------------------------------------------------------- one request's beams
class BeamGroup:
    """The live beams of one request (the same list object as request.seqs), their cumulative logprobs, and the
    finished hypotheses (the best beam_width, best first)."""

    def __init__(self, request, options: BeamOptions, stops, seq_ids):
        self.request, self.options = request, options
        self.W = options.beam_width
        self.max_tokens = min(options.max_tokens, stops.max_model_len - len(request.prompt_ids))
        self.end_ids = set() if options.ignore_eos else set(getattr(stops, "stop_ids", ()))
        self.stops, self.seq_ids = stops, seq_ids          # text of hypotheses; the engine's sequence id counter
        self.live: list = request.seqs                     # mutated in place: request.seqs stays the live beams
        self.cum = {s.seq_id: 0.0 for s in self.live}      # seq_id -> cumulative logprob of its generated tokens
        self.hyps: list = []                               # [Hypothesis] finished, best first, at most W
        self.done = False                                  # True once the W results are final

    # ------------------------------------------------------------------ scheduling: the whole group or none
    def extend(self, sched, batch, budget) -> int:
        """Scheduler.extend of any beam: rows for every running beam of the group in this step, or none if the
        budget cannot give each one token (then the group waits, whole). Decodes first, so a beam recomputing
        its prompt (rare: a failed step's rollback) takes what is left. -> tokens scheduled."""
        rid = self.request.request_id
        if any(r.seq.request_id == rid for r in batch.rows):
            return 0                                       # a sibling's call scheduled the group already
        beams = sorted((s for s in self.live if s.status is Status.RUNNING), key=lambda s: len(s) - s.num_computed)
        if len(beams) > budget:
            return 0
        total = 0
        for i, s in enumerate(beams):
            total += sched.extend_one(batch, s, budget - total - (len(beams) - 1 - i))
            if s.status is not Status.RUNNING:             # preempted: the group restarted, its rows are gone
                return 0
        return total

    # ------------------------------------------------------------------ the beam step
    def step(self, sched, batch, out, verdicts: list, rows: list) -> list:
        """rows: indices of this group's rows in the batch. Picks the next beams, appends, forks and prunes.
        -> seq ids of the beams pruned this step."""
        ran = {batch.rows[i].seq.seq_id: i for i in rows if batch.rows[i].completes}
        if not ran:
            return []                                      # a prompt chunk: nothing to choose yet
        errors = [verdicts[i].error for i in ran.values() if verdicts[i].error is not None]
        if errors:
            self.fail(sched, errors[0])
            return []
        if set(ran) != {s.seq_id for s in self.live}:      # part of the group ran: hold it until all run
            for i in ran.values():
                verdicts[i] = Verdict(accepted=-1)         # its newest token counts as not computed: redone
            return []
        try:
            kept, finished = self.select([out.logits[ran[s.seq_id]][0] for s in self.live])
        except Exception as e:                             # this request's problem (its logits), not the engine's
            self.fail(sched, f"{type(e).__name__}: {e}")
            return []
        length = len(self.live[0].output_ids) + 1          # generated tokens once this step's are appended
        for b, t, score in finished:
            parent = self.live[b]
            self.add(Hypothesis(beam_score(score, length - 1, self.options.length_penalty), score,
                                parent.output_ids + [t], "stop", t))
        if not kept:                                       # every top candidate ended: nothing left to extend
            self.finish_all(sched, "stop")
            return []
        if length >= self.max_tokens or self.beats_live(max(s for _, _, s in kept), length):
            if length >= self.max_tokens:
                for b, t, score in kept:
                    self.add(Hypothesis(beam_score(score, length, self.options.length_penalty), score,
                                        self.live[b].output_ids + [t], "length"))
            self.finish_all(sched, "length" if length >= self.max_tokens else "stop")
            return []
        return self.branch(sched, batch, verdicts, ran, kept)

    def select(self, logits: list) -> tuple[list, list]:
        """logits: per live beam (V,), in beam rank order. -> (kept [(beam, token, cum)] W of them, best first;
        finished [(beam, end token, cum)]), HF's rule over the top 2W candidates."""
        cand = []
        for b, (seq, row) in enumerate(zip(self.live, logits)):
            logp = torch.log_softmax(row.double(), -1)                       # (V,) float64, one row at a time
            kth = torch.topk(logp, min(2 * self.W, logp.shape[0])).values[-1]  # this beam's best 2W are enough,
            ids = torch.nonzero(logp >= kth).flatten()                         # with all tied with the last
            cum = self.cum[seq.seq_id]
            cand += [(cum + v, b, t) for v, t in zip(logp[ids].tolist(), ids.tolist())]
        cand.sort(key=lambda c: (-c[0], c[1], c[2]))                         # ties: beam rank, then token id
        kept, finished = [], []
        for rank, (score, b, t) in enumerate(cand[:2 * self.W]):
            if t in self.end_ids:
                if rank < self.W:                                            # HF: an end token ranked past W
                    finished.append((b, t, score))                           # is not a hypothesis
            else:
                kept.append((b, t, score))
                if len(kept) == self.W:
                    break
        return kept, finished

    def add(self, h: Hypothesis):
        """Keep the best W hypotheses, best first (a stable order: equal scores keep their arrival order)."""
        self.hyps = heapq.nlargest(self.W, self.hyps + [h], key=lambda x: x.score)

    def beats_live(self, best_cum: float, length: int) -> bool:
        """W hypotheses finished, and the worst is at least the best score any live beam could still reach."""
        if len(self.hyps) < self.W:
            return False
        lp = self.options.length_penalty
        bound = best_cum / (self.max_tokens if lp > 0 else length) ** lp
        return self.hyps[-1].score >= bound

    def branch(self, sched, batch, verdicts: list, ran: dict, kept: list) -> list:
        """Each kept candidate: the parent's first child appends in place, the others fork the parent (they
        join the scheduler's forks, applied by Scheduler.update before any parent appends); childless parents
        are pruned now (their rows are skipped by the update)."""
        new_live, cum, pruned = [], {}, []
        used = set()
        for rank, (b, t, score) in enumerate(kept):
            parent, i = self.live[b], ran[self.live[b].seq_id]
            if b not in used:
                used.add(b)
                verdicts[i] = Verdict(tokens=[t])
                child = parent
            else:
                child = self.fork(parent)
                sched.pending_forks.setdefault(parent.seq_id, []).append(child)
                batch.forks.append((i, child))
                verdicts.append(Verdict(tokens=[t]))
            child.index = rank
            new_live.append(child)
            cum[child.seq_id] = score
        for b, seq in enumerate(self.live):
            if b not in used:
                sched.finish(seq, "pruned")
                pruned.append(seq.seq_id)
        self.live[:] = new_live
        self.cum = cum
        return pruned

    def fork(self, parent: Sequence) -> Sequence:
        """A new beam: the parent's tokens, text and clock readings; its blocks come in the update (fork)."""
        child = Sequence(next(self.seq_ids), parent.request_id, parent.index, parent.prompt_ids, parent.params, 0,
                         parent.metrics.arrival_time)
        child.output_ids = list(parent.output_ids)
        child.text, child.text_bytes = parent.text, parent.text_bytes
        child.metrics = replace(parent.metrics, token_times=list(parent.metrics.token_times))
        _same_request(parent, child)
        return child

    # ------------------------------------------------------------------ ends and restarts
    def finish_all(self, sched, reason: str, error: Optional[str] = None):
        """The group is over (its W results are in self.hyps, or it failed): every live beam gives its blocks back.
        Rows of this step are skipped by the update (their sequences are finished)."""
        for s in self.live:
            if not s.is_finished:
                sched.finish(s, reason, error)
        self.done = error is None
        sched.groups.pop(self.request.request_id, None)

    def fail(self, sched, error: str):
        self.finish_all(sched, "error", error)

    def restart(self, sched, seq: Sequence) -> list:
        """seq, one of the beams, is preempted: the whole group leaves and starts again from its prompt, queued
        first. -> the sequences that left running (none if seq already left with an earlier restart)."""
        if seq.is_finished:
            return []
        gone = [s for s in self.live if s.status is Status.RUNNING]
        for s in self.live:
            if s.status is Status.RUNNING:
                sched.running.remove(s)
            elif s.status is Status.SWAPPED:
                sched.swapped.remove(s)
                sched.block_manager.free_swap(s)
            elif s in sched.waiting:
                sched.waiting.remove(s)
            sched.block_manager.free_seq(s)
            s.status, s.finish_reason = Status.FINISHED, "preempted"   # discarded: in no output
        first = self.live[0].metrics
        fresh = Sequence(next(self.seq_ids), self.request.request_id, 0, self.request.prompt_ids, self.live[0].params,
                         0, first.arrival_time)
        fresh.metrics = RequestMetrics(first.arrival_time, first.first_scheduled_time,
                                       num_preemptions=first.num_preemptions + 1)
        _same_request(self.live[0], fresh)
        self.live[:] = [fresh]
        self.cum, self.hyps = {fresh.seq_id: 0.0}, []
        sched.waiting.appendleft(fresh)
        return gone

    # ------------------------------------------------------------------ outputs
    def text(self, output_ids: list) -> str:
        """The text of generated ids, as the detokenizer builds it one token at a time (end tokens are not text)."""
        tok, prompt = self.stops.tokenizer, self.request.prompt_ids
        if getattr(self.stops, "llama2c", False):
            return tok.decode(output_ids, prev_token=prompt[-1])
        prefix = tok.decode(prompt[-1:])
        return tok.decode(prompt[-1:] + list(output_ids))[len(prefix):]

    def results(self) -> list[BeamSearchSequence]:
        """The W best hypotheses once done; else the live beams as they stand (running, aborted or failed)."""
        prompt, lp = list(self.request.prompt_ids), self.options.length_penalty
        if self.done:
            return [BeamSearchSequence(prompt + h.output_ids, h.cum_logprob, h.score, self.text(h.output_ids),
                                       h.finish_reason, h.stop_reason) for h in self.hyps]
        return [BeamSearchSequence(prompt + s.output_ids, self.cum.get(s.seq_id, 0.0),
                                   beam_score(self.cum.get(s.seq_id, 0.0), len(s.output_ids), lp), s.text,
                                   s.finish_reason, None, s.error) for s in self.live]

    def output(self) -> RequestOutput:
        """The engine's view (LLMEngine.step, pop_finished): one CompletionOutput per beam, best first."""
        req, n = self.request, len(self.request.prompt_ids)
        outs = [CompletionOutput(i, r.text, r.tokens[n:], r.finish_reason, r.stop_reason, r.error,
                                 cumulative_logprob=r.cum_logprob) for i, r in enumerate(self.results())]
        return RequestOutput(req.request_id, req.prompt, list(req.prompt_ids), outs, req.finished,
                             self.live[0].metrics)       # the best live beam's (at the end: the last step's best)

    def result(self) -> BeamSearchOutput:
        req = self.request
        return BeamSearchOutput(self.results(), req.request_id, req.prompt, list(req.prompt_ids))


def _same_request(src: Sequence, dst: Sequence):
    """What a scheduling order reads per request (priority, client) and its LoRA adapter, carried to a new beam."""
    for name in ("priority", "client", "lora"):
        if hasattr(src, name):
            setattr(dst, name, getattr(src, name))


# ---------------------------------------------------------------------------- the engine's hook
class BeamStep(VerdictStep):
    """The engine's post-processor: after verification, before the scheduler's update, every beam group that ran
    chooses its next beams (scheduler.groups: request_id -> BeamGroup); those pruned are left in batch.pruned."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def wants(self, request) -> bool:
        return request.beam is not None

    def before_update(self, batch, out, verdicts: list):
        if self.scheduler.groups:
            batch.pruned = beam_step(self.scheduler, batch, out, verdicts)

    def save(self, batch) -> list:
        """Each group's beams, scores and hypotheses, for a failed step (Scheduler.save keeps the beams' own state)."""
        return [(g, list(g.live), dict(g.cum), list(g.hyps), g.done) for g in self.scheduler.groups.values()]

    def restore(self, saved: list):
        for g, live, g.cum, g.hyps, g.done in saved:
            g.live[:] = live                             # in place: request.seqs stays the live beams


def beam_step(sched, batch, out, verdicts: list) -> list:
    """After verification, before the update: every beam group that ran picks its next beams (BeamGroup.step).
    verdicts is edited in place (forks append theirs). -> seq ids of the beams pruned this step."""
    rows: dict = {}
    for i, r in enumerate(batch.rows):
        if r.writes and r.seq.request_id in sched.groups and not r.seq.is_finished:
            rows.setdefault(r.seq.request_id, []).append(i)
    pruned = []
    for rid, idx in rows.items():
        pruned += sched.groups[rid].step(sched, batch, out, verdicts, idx)
    return pruned
