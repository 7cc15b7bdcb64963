"""LLMEngine: add_request / step / abort, the one path through the engine (DESIGN.md).

    step():  batch    = scheduler.schedule()             # who runs, prompt chunks, preemptions; blocks
             drafts   = proposer.propose(batch)          # k tokens per decode row (k = 0: plain decoding)
             out      = runner.run(batch, drafts)        # one forward; logits at each newest token and draft
             verdicts = verify(batch, drafts, out)       # k = 0: sampling; k > 0: the exact acceptance rule
             post.*(batch, out, verdicts)                # post-processors: logprobs, jump-forward, beam search
             scheduler.update(batch, verdicts)           # append, stop checks, finish, free, roll back
             trace.after_update(...)                     # what the step did, as plain data

Optional features are objects the parts were built with (minillm.core.hooks: KV eviction, LoRA slots, the
post-processors), never branches here. A step is a transaction: if anything in it raises (the model call
interrupted, a proposer failing, Ctrl-C half-way through the update), every sequence is left where it was, so the
next step computes what an uninterrupted run would: what the update changed is put back (Scheduler.save),
generators are restored, blocks the step was still to fill are recomputed, and nothing unwritten can enter the
prefix cache (blocks are named only once computed).
A request's own mistake inside a step (its logits processor raising) finishes it with finish_reason "error";
the others go on.
"""
from __future__ import annotations

import itertools
import time
import zlib
from contextlib import contextmanager
from typing import Callable, Optional

from ..core.batch import ScheduledBatch
from ..core.detokenizer import Detokenizer
from ..core.logprobs import Logprobs, check_logprobs
from ..core.model_runner import ModelRunner
from ..core.outputs import RequestOutput
from ..core.request import Request, check_scheduling, prompt_ids
from ..core.sampling import SamplingParams
from ..core.scheduler import Scheduler
from ..core.sequence import Sequence
from ..core.trace import BlockSnapshot, Trace, block_snapshot
from ..core.verify import verify
from ..decoding.beam import BeamGroup, BeamOptions, BeamStep
from ..guided import JumpForward
from ..guided import attach as attach_guide
from ..kernels import cdiv
from ..threads import auto_threads
from .parts import Parts, prepare


class LLMEngine:
    def __init__(self, parts: Parts, clock: Optional[Callable[[], float]] = None):
        self.parts, self.config = parts, parts.config
        self.model, self.tokenizer = parts.model, parts.tokenizer
        self.kv, self.block_manager = parts.kv, parts.block_manager
        self.proposer, self.verify_rule, self.quant_report = parts.proposer, parts.verify, parts.quant_report
        self.backend, self.backend_choice = self.config.backend, parts.backend_choice  # e.g. "numba", and why
        self.clock = clock or time.perf_counter
        auto_threads()     # unless a thread count was chosen: the cores free now (a busy core makes a pool spin-wait)
        self.eviction = parts.eviction            # who leaves the KV cache (NoEviction: nobody; minillm.core.hooks)
        stops = Detokenizer(self.tokenizer, self.eviction.context_limit(self.config.max_model_len))
        self.scheduler = Scheduler(self.config, self.block_manager, self.clock, stops, parts.policy,
                                   slots=self.proposer.num_slots, eviction=self.eviction, lora=parts.lora)
        self.runner = ModelRunner(parts.forward, self.kv, parts.swap, hidden=self.proposer.needs_hidden,
                                  eviction=self.eviction, lora=parts.lora)
        self.steps = [Logprobs(), JumpForward(), BeamStep(self.scheduler)]  # post-processors, in this order
        self.post: list = []    # those a request so far has needed (use_steps): a plain greedy batch runs none
        self.trace = Trace(self.config.trace, block_bytes=self.kv.nbytes // self.kv.num_blocks,
                           block_size=self.kv.block_size)
        self.requests: dict[str, Request] = {}
        self._seq_ids, self._req_ids = itertools.count(), itertools.count()
        self.jump_forward = True      # structured output appends the tokens its pattern forces (minillm.guided)

    @classmethod
    def from_model(cls, model, tokenizer, config, clock: Optional[Callable[[], float]] = None, **seams) -> "LLMEngine":
        """Prepare the parts (minillm.engine.parts.prepare: quantize, backend, KV pool, proposer ...) and build
        an engine."""
        return cls(prepare(model, tokenizer, config, **seams), clock)

    # ------------------------------------------------------------------ requests
    def make_request(self, prompt, params: Optional[SamplingParams] = None, request_id: Optional[str] = None,
                     arrival_time: Optional[float] = None, priority: int = 0, client=None, lora=None,
                     compile_workers=None) -> Request:
        """Validate a prompt (text, or token ids with BOS) and its parameters; queues nothing (see enqueue).
        priority: lower is served first (scheduling_policy "priority"); client: who sent it (str or int; "fair");
        lora: a LoRA adapter's name, directory or LoRAAdapter (needs enable_lora=True), parsed on first use;
        compile_workers: the processes a guided_* pattern compiles in (the server's: minillm.guided.workers)."""
        params = SamplingParams() if params is None else params
        adapter = self.lora_adapter(lora)
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        self.config.check_samples(params)          # n, best_of: before one Sequence (and its generator) is built
        ids = self.validate(prompt)
        self.check_fits(len(ids), params)
        check_scheduling(priority, client, self.scheduler.order)
        check_logprobs(params, self.model.config.vocab_size)
        params = attach_guide(params, self.tokenizer, ids, self.config.max_model_len, self.jump_forward,  # guided_*
                              self.config.guided_compile_timeout_s, compile_workers)
        if request_id is None:
            request_id = str(next(self._req_ids))
            while request_id in self.requests:  # never collide with an id the caller chose
                request_id = str(next(self._req_ids))
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = self.clock() if arrival_time is None else arrival_time
        base_seed = params.seed if params.seed is not None else \
            (self.config.seed * 1_000_003 + zlib.crc32(request_id.encode())) & 0x7FFFFFFF  # stable across processes
        seqs = [Sequence(next(self._seq_ids), request_id, i, ids, params, base_seed + i, now)
                for i in range(params.num_samples)]                  # best_of samples run; n are returned
        if params.prompt_logprobs is not None:
            seqs[0].prompt_logprobs = [None]                         # the sample that prefills scores the prompt
        for s in seqs:
            s.priority, s.client, s.lora = int(priority), client, adapter
        return Request(request_id, prompt if isinstance(prompt, str) else None, ids, params, now, seqs)

    def enqueue(self, request: Request) -> str:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.scheduler.add(request.seqs)
        request.join(self.scheduler.groups)       # a beam request's group runs and leaves whole
        self.use_steps(request)
        return request.request_id

    def use_steps(self, request: Request):
        """The post-processors `request` needs (VerdictStep.wants: logprobs, a guided pattern, beams) join the
        step, in self.steps' order, and stay: a post-processor is a plug-in switched on by the first request that
        uses it."""
        self.post = [s for s in self.steps if s in self.post or s.wants(request)]

    def make_beam_request(self, prompt, beam_width: int, max_tokens: int, *, length_penalty: float = 1.0,
                          ignore_eos: bool = False, request_id: Optional[str] = None,
                          arrival_time: Optional[float] = None) -> Request:
        """A beam search request (minillm.decoding.beam): one request whose live beams are sequences sharing KV blocks.
        Validated, the whole group's blocks included, before anything is queued (see enqueue)."""
        options = BeamOptions.check(beam_width, max_tokens, length_penalty, ignore_eos, self.config.speculative)
        request = self.make_request(prompt, options.params(), request_id, arrival_time)
        options.check_fits(len(request.prompt_ids), num_blocks=self.block_manager.num_blocks,
                           block_size=self.block_manager.block_size, max_model_len=self.config.max_model_len,
                           max_num_seqs=self.config.max_num_seqs, vocab_size=self.model.config.vocab_size,
                           budget=self.scheduler.budget)
        request.beam = BeamGroup(request, options, self.scheduler.stops, self._seq_ids)
        return request

    def add_request(self, prompt, params: Optional[SamplingParams] = None, request_id: Optional[str] = None,
                    arrival_time: Optional[float] = None, priority: int = 0, client=None, lora=None) -> str:
        """prompt: text or a list of token ids (BOS included). Validated before anything is queued."""
        return self.enqueue(self.make_request(prompt, params, request_id, arrival_time, priority, client, lora))

    def lora_adapter(self, lora):
        """lora= of a request -> None or its LoRAAdapter (minillm.lora.adapters), read on first use by the parts' loader
        (a shipped name or a PEFT directory). ValueError for an unknown or unfit adapter, or without enable_lora."""
        return self.parts.lora.get(lora)

    def validate(self, prompt) -> list[int]:
        """Prompt -> token ids, or a ValueError naming what is wrong (minillm.core.request.prompt_ids)."""
        return prompt_ids(prompt, self.tokenizer, self.model.config.vocab_size, self.config.max_model_len)

    def check_fits(self, prompt_len: int, params: SamplingParams):
        """A request that could never run is refused up front: one sample that outgrows the whole pool would wait
        forever (n > 1 samples need not fit at once: preemption runs them in turn). So is one the speculative
        method cannot serve (Medusa verifies a tree greedily)."""
        if self.proposer.needs_hidden and not params.greedy:
            raise ValueError("speculative method 'medusa' verifies its candidate tree greedily: "
                             f"it needs temperature=0, got temperature={params.temperature} "
                             "(use method 'draft' or 'ngram' to sample)")
        bs = self.block_manager.block_size
        need = cdiv(min(prompt_len + params.max_tokens, self.config.max_model_len), bs)   # blocks, worst case
        if need > self.block_manager.num_blocks:
            raise ValueError(f"request needs up to {need} KV blocks ({prompt_len} prompt tokens + max_tokens="
                             f"{params.max_tokens}, block_size={bs}) but the whole pool has "
                             f"{self.block_manager.num_blocks}: lower max_tokens, or raise kv_cache_bytes")

    def abort(self, request_id: str):
        if str(request_id) not in self.requests:
            raise ValueError(f"abort: no request with id {request_id!r} (known: {sorted(self.requests)[:10]})")
        for seq in self.requests[str(request_id)].seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                self.proposer.rollback(seq, 0)
        self.scheduler.groups.pop(str(request_id), None)      # a beam group: no more beam steps

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------------ the loop
    def step(self, expect_arrivals: bool = True) -> list[RequestOutput]:
        """One model call (advance). Returns the state of every request that ran in it."""
        return [self.requests[rid].output() for rid in self.advance(expect_arrivals)]

    def advance(self, expect_arrivals: bool = True) -> list[str]:
        """One model call. -> the ids of the requests that ran in it (step() makes their outputs; a loop that reads
        only finished requests, as LLM.generate's, skips that). expect_arrivals=False: every request is known
        (LLM.generate), so a batching window waits for no more."""
        start, batch = self.clock(), self.scheduler.schedule(expect_arrivals)
        with self._transaction(batch):
            self.runner.move_blocks(batch)                                # swaps and copy-on-write, before any write
            if not batch:
                return []
            drafts, draft_s = self._timed(self.proposer.propose, batch)   # k tokens per decode row, or None
            out, run_s = self._timed(self.runner.run, batch, drafts)      # logits at every newest token and draft
            verdicts = verify(batch, drafts, out, self.verify_rule)       # what each row emits, drafts kept
            for post in self.post:
                post.on_verdicts(batch, out, verdicts)                    # logprobs, jump-forward: verdicts only
            self.runner.commit(batch, drafts, verdicts)                   # a kept tree path into consecutive slots
            self.proposer.observe(batch, drafts, verdicts, out)
            pending = self.trace.before_update(batch, self.scheduler)    # the KV pool as the model call left it
            for post in self.post:
                post.before_update(batch, out, verdicts)                  # beam search: choose, fork, prune
            self.scheduler.update(batch, verdicts)                        # append, stop, finish, free, roll back
            for post in self.post:
                post.on_update(batch, verdicts)                           # logprobs of the tokens appended
            self.trace.after_update(batch, drafts, verdicts, pending, start, draft_s, run_s, self.clock())
        self.proposer.gc(*self.scheduler.live_ids())      # after the commit: drafting state of those that left
        return list(dict.fromkeys(s.request_id for s in batch.seqs))

    def _timed(self, fn, *args):
        t0 = self.clock()
        return fn(*args), self.clock() - t0

    @contextmanager
    def _transaction(self, batch: ScheduledBatch):
        """Undo what a step did if anything in it raises, KeyboardInterrupt too (the scheduler's queues, blocks,
        sequences, post-processors, trace, generators); the exception names its `request_ids`: a server ends those."""
        seqs = [r.seq for r in batch.rows if r.writes] + [c for _, c in batch.forks]
        undo = [(self.scheduler.restore, self.scheduler.save(batch)), (self.trace.restore, self.trace.save()),
                (self.eviction.restore, self.eviction.save(seqs))] + [(p.restore, p.save(batch)) for p in self.post]
        undo += [(s.generator.set_state, s.generator.get_state()) for s in seqs if not s.params.greedy]
        try:
            yield
        except BaseException as e:
            e.request_ids = list(dict.fromkeys(s.request_id for s in seqs))
            try:                                                            # in this order: H2O's attention sums
                for restore, state in undo + [(self.scheduler.rollback, batch)]:   # after the sequences
                    restore(state)
                for s in seqs:
                    self.proposer.rollback(s, s.num_computed)
            except Exception as undo_error:                                 # a part that broke itself (a lab's)
                e.add_note(f"undoing the step failed too, the engine is not as before it: {undo_error!r}")
            raise

    def pop_finished(self) -> list[RequestOutput]:
        """Outputs of finished requests, removed from the engine's bookkeeping."""
        done = [rid for rid, r in self.requests.items() if r.finished]
        return [self.requests.pop(rid).output() for rid in done]

    def block_snapshot(self) -> BlockSnapshot:
        """Who holds which physical block right now, as plain data for minillm.viz's block map."""
        return block_snapshot(self.scheduler)

    @property
    def spec_stats(self) -> dict:
        """Speculative decoding's counters (drafted, accepted, emitted, alpha terms, seconds), kept with trace=False."""
        return self.trace.spec_stats
