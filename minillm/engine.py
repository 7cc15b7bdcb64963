"""LLMEngine: add_request / step / abort, the one path through the engine (DESIGN.md).

    step():  batch = scheduler.schedule()          # who runs; blocks allocated
             logits = runner.run(batch)            # model over the paged KV pool
             ids = sample_batch(logits, ...)       # per-sequence params and generators
             scheduler.update(batch, ids, ...)     # append, finish, free blocks
             trace.record(...)
"""
from __future__ import annotations

import itertools
import time
import zlib

import torch
from typing import Callable, Optional

from .block_manager import BlockManager
from .config import EngineConfig
from .kv_cache import KVCache, SwapSpace
from .model import Transformer
from .model_runner import ModelRunner, backend_model
from .outputs import CompletionOutput, RequestOutput
from .quant import SCHEMES, quantize_model
from .proposers import DraftProposer, MedusaProposer, NgramProposer, load_draft
from .sampling import SamplingParams, probs_from_logits, sample_batch
from .scheduler import Scheduler
from .sequence import Sequence
from .speculative import SpeculativeConfig, verify_greedy, verify_sampled
from .tokenizer import BOS, EOS, Tokenizer
from .trace import BlockSnapshot, StepRecord, Trace


DEFAULT_KV_CAP = 256 * 2**20  # bytes for the KV pool when kv_cache_bytes is not given


def _refuse_unbuilt(config: EngineConfig):
    """Options that do not combine: refuse them rather than silently ignore them."""
    if config.speculative is not None:
        spec = SpeculativeConfig.from_dict(config.speculative)
        if config.backend != "torch":
            raise ValueError(f"speculative decoding runs on backend='torch' (verification scores several tokens "
                             f"per sequence in one call); backend={config.backend!r} returns one row per sequence")
        if config.batching != "continuous":
            raise ValueError(f"speculative decoding needs batching='continuous' (each sequence advances by its own "
                             f"number of tokens per step), got batching={config.batching!r}")
        if config.enable_chunked_prefill:
            raise ValueError("speculative decoding does not combine with enable_chunked_prefill=True here: verification "
                             "rows run in decode-only steps, and chunked steps mix prompts with decodes")
        if spec.method == "medusa" and config.quantization:
            raise ValueError("speculative method 'medusa' reads the target's float hidden states; it does not combine "
                             f"with quantization={config.quantization!r}")
    if config.quantization not in (None,) + SCHEMES:
        raise ValueError(f"quantization={config.quantization!r} is not available in this build yet "
                         f"(built: {', '.join(SCHEMES)})")
    if config.kv_cache_dtype == "int8" and config.backend != "torch":
        raise ValueError(f"kv_cache_dtype='int8' runs on backend='torch'; backend={config.backend!r} reads a float pool")
    if config.quantization and config.backend != "torch":
        raise ValueError(f"quantization={config.quantization!r} runs on backend='torch' (its batch-1 GEMV is the "
                         f"numba kernel); backend={config.backend!r} has no quantized weights yet")



class LLMEngine:
    def __init__(self, model: Transformer, tokenizer, config: EngineConfig, clock: Optional[Callable[[], float]] = None):
        config = config.with_model(model.config)
        _refuse_unbuilt(config)
        self.quant_report = None
        if config.quantization:            # a quantized copy: the caller's model is left as it was
            model, self.quant_report = quantize_model(model, config.quantization, config.quant_config, tokenizer)
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.clock = clock or time.perf_counter
        mcfg, bs = model.config, config.block_size
        dtype = next(model.parameters()).dtype
        kv_dtype = torch.int8 if config.kv_cache_dtype == "int8" else dtype
        per_token = KVCache.bytes_per_token(mcfg, kv_dtype)                # scales included for int8
        kv_bytes = config.kv_cache_bytes
        if kv_bytes is None:  # room for max_num_seqs full-length sequences, capped: preemption handles the rest
            kv_bytes = min(config.max_num_seqs * -(-config.max_model_len // bs) * bs * per_token, DEFAULT_KV_CAP)
        need = -(-config.max_model_len // bs) * bs * per_token
        if kv_bytes < need:
            raise ValueError(f"the KV cache gets {kv_bytes:,} bytes but one sequence of max_model_len="
                             f"{config.max_model_len} needs {need:,} ({per_token:,} bytes per token): raise "
                             f"kv_cache_bytes or lower max_model_len")
        runner_model = backend_model(model, config.backend)            # the torch model, or its numba/cuda twin
        self.kv = KVCache.from_bytes(mcfg, kv_bytes, bs, kv_dtype, device=getattr(runner_model, "device", "cpu"))
        swap_blocks = config.swap_bytes // (self.kv.nbytes // self.kv.num_blocks)
        if config.preemption_mode == "swap" and swap_blocks < 1:
            raise ValueError(f"preemption_mode='swap' needs swap_bytes for at least one block "
                             f"({self.kv.nbytes // self.kv.num_blocks:,} bytes), got swap_bytes={config.swap_bytes}")
        self.swap = SwapSpace(self.kv, swap_blocks) if swap_blocks else None
        self.block_manager = BlockManager(self.kv.num_blocks, bs, enable_prefix_caching=config.enable_prefix_caching,
                                          swap_blocks=swap_blocks)
        self.scheduler = Scheduler(config, self.block_manager, self.clock)
        self.spec = SpeculativeConfig.from_dict(config.speculative) if config.speculative is not None else None
        self.proposer = self._build_proposer(model, tokenizer) if self.spec else None
        self.runner = ModelRunner(runner_model, self.kv, keep_hidden=self.spec is not None and self.spec.method == "medusa")
        self.spec_stats = {"steps": 0, "rows": 0, "drafted": 0, "accepted": 0, "emitted": 0, "examined": 0, "alpha_sum": 0.0,
                           "draft_seconds": 0.0, "verify_seconds": 0.0}
        if self.spec:
            self.scheduler.lookahead = self._lookahead
        self.trace = Trace(config.trace)
        self.requests: dict[str, list[Sequence]] = {}
        self.pending_forks: dict[int, list[Sequence]] = {}  # parent seq_id -> siblings waiting for its prefill
        self.prompts: dict[str, Optional[str]] = {}
        self._seq_ids = itertools.count()
        self._req_ids = itertools.count()
        self._step = 0
        is_llama2c = isinstance(tokenizer, Tokenizer)
        # llama2.c's data separates documents with BOS and run.c stops on it; EOS ends a text too
        self.stop_ids = {BOS, EOS} if is_llama2c else set(tokenizer.stop_ids)

    def _build_proposer(self, model, tokenizer):
        spec, cfg = self.spec, self.config
        if spec.method == "ngram":
            return NgramProposer(spec.gamma, spec.ngram_max, spec.ngram_min)
        if spec.method == "draft":
            draft = load_draft(spec.model, model, tokenizer, cfg.dtype, cfg.seed)
            if draft.config.max_seq_len < cfg.max_model_len:
                raise ValueError(f"the draft model's context max_seq_len={draft.config.max_seq_len} is shorter than "
                                 f"max_model_len={cfg.max_model_len}")
            # the draft's pool holds every running token plus each sequence's drafts (its bytes are small)
            blocks = self.kv.num_blocks + cfg.max_num_seqs * (-(-spec.gamma // cfg.block_size) + 1)
            return DraftProposer(draft, blocks, cfg.block_size, self.kv.k.dtype if not self.kv.quantized else torch.float32,
                                 backend=spec.draft_backend)
        return MedusaProposer.for_target(model, spec, cfg.max_model_len)

    def _draft_len(self, seq: Sequence) -> int:
        """Tokens to draft for seq this step: gamma, fewer near max_tokens (no draft past the last token the
        request wants) or max_model_len (the k drafts are written at positions len(seq) .. len(seq) + k - 1)."""
        return max(0, min(self.spec.gamma, seq.params.max_tokens - len(seq.output_ids),
                          self.config.max_model_len - len(seq)))

    def _lookahead(self, seq: Sequence) -> int:
        """Slots past the sequence's next one that its verification writes (the scheduler reserves them)."""
        k = self._draft_len(seq)
        return self.proposer.num_slots(seq, k) if self.spec.method == "medusa" else k

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt, params: Optional[SamplingParams] = None, request_id: Optional[str] = None,
                    arrival_time: Optional[float] = None) -> str:
        """prompt: text or a list of token ids (BOS included). Validated before anything is queued."""
        params = params or SamplingParams()
        ids = self.validate(prompt)
        if request_id is None:
            request_id = str(next(self._req_ids))
            while request_id in self.requests:  # never collide with an id the caller chose
                request_id = str(next(self._req_ids))
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        self.check_fits(len(ids), params)
        now = self.clock() if arrival_time is None else arrival_time
        base_seed = params.seed if params.seed is not None else \
            (self.config.seed * 1_000_003 + zlib.crc32(request_id.encode())) & 0x7FFFFFFF  # stable across processes
        seqs = [Sequence(next(self._seq_ids), request_id, i, ids, params, base_seed + i, now) for i in range(params.n)]
        self.requests[request_id] = seqs
        self.prompts[request_id] = prompt if isinstance(prompt, str) else None
        # n > 1: only the first sample is prefilled; the others fork its blocks after the prefill and
        # share them until they write (copy-on-write), as vLLM's parallel sampling does
        self.scheduler.add(seqs[0])
        if len(seqs) > 1:
            self.pending_forks[seqs[0].seq_id] = seqs[1:]
        return request_id

    def blocks_needed(self, prompt_len: int, params: SamplingParams) -> int:
        """Most blocks a request can hold at once: the prompt's full blocks are shared by its n samples,
        and each sample owns the rest of its sequence (capped at max_model_len)."""
        bs = self.config.block_size
        total = min(prompt_len + params.max_tokens, self.config.max_model_len)
        shared = prompt_len // bs if params.n > 1 else 0
        return shared + params.n * (-(-total // bs) - shared)

    def check_fits(self, prompt_len: int, params: SamplingParams):
        """A request that could never fit in the pool is refused up front: it would wait forever. So is one the
        speculative method cannot serve (Medusa samples nothing: greedy only)."""
        if self.spec is not None and self.spec.method == "medusa" and not params.greedy:
            raise ValueError(f"speculative method 'medusa' verifies its candidate tree greedily: it needs temperature=0, "
                             f"got temperature={params.temperature} (use method 'draft' or 'ngram' to sample)")
        need = self.blocks_needed(prompt_len, params)
        if need > self.block_manager.num_blocks:
            raise ValueError(f"request needs up to {need} KV blocks ({prompt_len} prompt tokens + max_tokens="
                             f"{params.max_tokens}, n={params.n}, block_size={self.config.block_size}) but the whole "
                             f"pool has {self.block_manager.num_blocks}: lower n or max_tokens, or raise kv_cache_bytes")

    def validate(self, prompt) -> list[int]:
        """Prompt -> token ids, or a ValueError naming what is wrong. Queues nothing."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        limit = self.config.max_model_len
        if not ids:
            raise ValueError("prompt is empty: pass text or at least one token id")
        if len(ids) >= limit:
            raise ValueError(f"prompt has {len(ids)} tokens but max_model_len is {limit}: "
                             f"it must be shorter to leave room for at least one generated token")
        V = self.model.config.vocab_size
        bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < V)]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {V}), got {bad[:5]}")
        return ids

    def abort(self, request_id: str):
        if str(request_id) not in self.requests:
            raise ValueError(f"abort: no request with id {request_id!r} (known: {sorted(self.requests)[:10]})")
        for seq in self.requests[str(request_id)]:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
                if self.proposer is not None:
                    self.proposer.drop(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[RequestOutput]:
        """One model call. Returns the state of every request that ran in it."""
        start = self.clock()
        batch = self.scheduler.schedule()
        if self.swap is not None:  # swaps first: a block freed by a swap-out may be reused in this very step
            self.swap.swap_in(self.kv, batch.swap_in)
            self.swap.swap_out(self.kv, batch.swap_out)
        if not batch:
            return []
        if self.spec is not None and batch.kind == "decode":
            return self._spec_step(batch, start)
        n_prefill, n_decode = batch.num_prefill_tokens, batch.num_decode_tokens
        phases = ["prefill" if st < len(s) - 1 else "decode" for s, st in zip(batch.seqs, batch.starts)]
        padding_ids = [s.seq_id for s in batch.padding]
        self.kv.copy_blocks(batch.copies)                                       # copy-on-write, before any write
        logits = self.runner.run(batch)                                         # (B, V)
        done = [e == len(s) for s, e in zip(batch.seqs, batch.ends)]           # False: a partial prompt chunk
        if self.runner.keep_hidden:                                             # Medusa drafts from these
            self.proposer.observe(batch.seqs, self.runner.hidden, done)
        ids = sample_batch(logits, [s.params for s in batch.seqs], [s.generator for s in batch.seqs])
        ids = [t if d else None for t, d in zip(ids, done)]
        memory = self._memory(batch) if self.trace.enabled else None            # as the model call left it
        self._fork_samples(batch, logits, ids)
        self.scheduler.update(batch, ids, self._check_finished)
        phases += ["fork"] * (len(batch.seqs) - len(phases))  # siblings that joined after the prefill
        self._record(batch, n_prefill, n_decode, phases, padding_ids, start, memory)
        return [self._output(rid) for rid in dict.fromkeys(s.request_id for s in batch.seqs)]

    def _spec_step(self, batch, start: float) -> list[RequestOutput]:
        """A decode step with speculation: each sequence drafts k tokens, one target forward scores the
        k + 1 positions (its last token and the drafts), verification keeps a prefix and emits one more
        token; the rest is rolled back (the scheduler frees blocks only rejected drafts used)."""
        seqs, clock = batch.seqs, self.clock
        self.kv.copy_blocks(batch.copies)
        ks = [self._draft_len(s) if batch.lookahead.get(s.seq_id, 0) else 0 for s in seqs]  # 0: no room this step
        t0 = clock()
        proposals = self.proposer.propose(seqs, ks)         # [(drafted ids, q (k, V) or None)]; Medusa: trees
        t1 = clock()
        medusa = self.spec.method == "medusa"
        if medusa:
            trees = proposals
            logits = self.runner.score(seqs, [t.tokens for t in trees], [t.depths for t in trees], [t.mask for t in trees])
        else:
            logits = self.runner.score(seqs, [[s.token_ids[-1]] + d for s, (d, _) in zip(seqs, proposals)])  # (B, T, V)
        t2 = clock()
        emitted, events, st = [], [], self.spec_stats
        for b, s in enumerate(seqs):
            if medusa:
                draft, n, toks, terms = self.proposer.verify(s, trees[b], logits[b], self.runner.hidden[b], self.kv)
            else:
                draft, q = proposals[b]
                n, toks, terms = self._verify(s, draft, q, logits[b])
            batch.ends[b] = len(s) + n                      # positions len - 1 .. len - 1 + n now hold verified tokens
            self.proposer.rollback(s, len(s) + n)
            emitted.append(toks)
            events.append((s, draft, n, len(s.output_ids)))
            st["rows"] += 1
            st["drafted"] += len(draft)
            st["examined"] += len(terms)
            st["alpha_sum"] += sum(terms)
        st["steps"] += 1
        st["draft_seconds"] += t1 - t0
        st["verify_seconds"] += t2 - t1
        memory = self._memory(batch) if self.trace.enabled else None
        self.scheduler.update(batch, emitted, self._check_finished)
        self.proposer.gc({s.seq_id for s in self.scheduler.running}, {s.seq_id for s in self.scheduler.swapped})
        spec = []
        for s, draft, n, before in events:
            out = s.output_ids[before:]                     # cut where the sequence stopped
            st["emitted"] += len(out)
            st["accepted"] += min(n, len(out))
            spec.append({"seq_id": s.seq_id, "request_id": s.request_id, "index": s.index, "drafted": list(draft),
                         "accepted": min(n, len(out)), "emitted": list(out)})
        n_out = sum(len(e["emitted"]) for e in spec)
        self._record(batch, 0, n_out, ["decode"] * len(seqs), [], start, memory, spec=spec,
                     draft_seconds=t1 - t0, verify_seconds=t2 - t1)
        return [self._output(rid) for rid in dict.fromkeys(s.request_id for s in seqs)]

    @staticmethod
    def _verify(seq: Sequence, draft: list, q, logits) -> tuple:
        """One sequence's verification. logits (k + 1, V) from the target at its last token and the drafts.
        -> (n accepted, tokens to emit, alpha terms: sum_x min(p, q) for each examined draft slot)."""
        k, params = len(draft), seq.params
        if params.greedy:
            nxt = logits[:k + 1].argmax(-1).tolist()
            n = verify_greedy(nxt, draft)
            return n, draft[:n] + [nxt[n]], [float(draft[i] == nxt[i]) for i in range(min(n + 1, k))]
        p = torch.stack([probs_from_logits(logits[i], params.temperature, params.top_k, params.top_p)
                         for i in range(k + 1)])                                   # (k + 1, V)
        n, tok = verify_sampled(p, q, draft, seq.generator)
        m = min(n + 1, k)                                                          # slots examined
        terms = torch.minimum(p[:m], q[:m]).sum(-1) if q is not None else p[torch.arange(m), draft[:m]]
        return n, draft[:n] + [tok], terms.tolist()

    def _fork_samples(self, batch, logits, ids):
        """After a parent's prefill, its n - 1 siblings share its blocks and sample their own first token
        from the same logits with their own generators. They join the batch's update below."""
        for b, parent in enumerate(list(batch.seqs)):
            if ids[b] is None:  # the parent's prompt is not complete yet
                continue
            for child in self.pending_forks.pop(parent.seq_id, []):
                if child.is_finished:  # aborted while waiting
                    continue
                self.block_manager.fork(parent, child)
                if self.proposer is not None:
                    self.proposer.fork(parent, child)
                child.metrics.first_scheduled_time = parent.metrics.first_scheduled_time
                self.scheduler.add_running(child)
                batch.add(child, parent.num_computed, len(child))
                ids.append(sample_batch(logits[b:b + 1], [child.params], [child.generator])[0])

    def _check_finished(self, seq: Sequence) -> bool:
        p, tok = seq.params, seq.output_ids[-1]
        if (not p.ignore_eos and tok in self.stop_ids) or tok in p.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", tok  # the stop token is not text
            return True
        before = len(seq.text)
        seq.text = self._append_text(seq)
        for s in p.stop:  # a stop string can only end in the newest text: search from just before it
            at = seq.text.find(s, max(0, before - len(s) + 1))
            if at >= 0:
                seq.text = seq.text[:at]
                seq.finish_reason, seq.stop_reason = "stop", s
                return True
        if len(seq.output_ids) >= p.max_tokens or len(seq) >= self.config.max_model_len:
            seq.finish_reason = "length"
            return True
        return False

    def _append_text(self, seq: Sequence) -> str:
        """Text of the generated ids, extended by the newest token. llama2.c tokenizers: append the token's
        bytes (run.c's piece rules, BOS/EOS skipped) and decode the whole buffer, so a character split
        across byte tokens comes out whole. HF tokenizers: decode with the last prompt token as context,
        so one that strips a leading space at the start of a text (SentencePiece) keeps it, as vLLM does."""
        if isinstance(self.tokenizer, Tokenizer):
            ids = seq.output_ids
            prev = ids[-2] if len(ids) > 1 else seq.prompt_ids[-1]
            seq.text_bytes += self.tokenizer.decode_bytes(ids[-1:], prev_token=prev)
            return seq.text_bytes.decode("utf-8", errors="replace")
        prefix = self.tokenizer.decode(seq.prompt_ids[-1:])
        return self.tokenizer.decode(seq.prompt_ids[-1:] + seq.output_ids)[len(prefix):]

    def _output(self, request_id: str) -> RequestOutput:
        seqs = self.requests[request_id]
        outs = [CompletionOutput(s.index, s.text, list(s.output_ids), s.finish_reason, s.stop_reason) for s in seqs]
        done = all(s.is_finished for s in seqs)
        return RequestOutput(request_id, self.prompts[request_id], list(seqs[0].prompt_ids), outs, done, seqs[0].metrics)

    def _memory(self, batch) -> tuple[int, int, int]:
        """(blocks used, blocks free, slots holding tokens) right after the model call: before finished
        sequences give their blocks back, so a step's record shows the memory that step really used."""
        bm, bs = self.block_manager, self.kv.block_size
        written = {s.seq_id: e for s, e in zip(batch.seqs, batch.ends)}
        fill = {}  # tokens written in each physical block (a shared block counts once)
        for s in self.scheduler.running + self.scheduler.padding:
            n = written.get(s.seq_id, s.num_computed)
            for i, b in enumerate(s.block_table):
                fill[b] = max(fill.get(b, 0), min(bs, max(0, n - i * bs)))
        return bm.num_used, bm.num_free, sum(fill.values())

    def _record(self, batch, n_prefill: int, n_decode: int, phases, padding_ids, start: float, memory, **extra):
        if not self.trace.enabled:  # trace=False: no per-step bookkeeping on the hot path
            self._step += 1
            return
        used, free, filled = memory
        per_block = self.kv.nbytes // self.kv.num_blocks
        self.trace.record(StepRecord(
            step=self._step, kind=batch.kind, seq_ids=[s.seq_id for s in batch.seqs], phases=phases,
            padding_ids=padding_ids, num_prefill_tokens=n_prefill, num_decode_tokens=n_decode,
            num_padding=len(batch.padding), blocks_used=used, blocks_free=free, kv_bytes_used=used * per_block,
            kv_bytes_filled=filled * per_block // self.kv.block_size, start=start, seconds=self.clock() - start, **extra))
        self._step += 1

    def pop_finished(self) -> list[RequestOutput]:
        """Outputs of finished requests, removed from the engine's bookkeeping."""
        done = [rid for rid, seqs in self.requests.items() if all(s.is_finished for s in seqs)]
        outs = [self._output(rid) for rid in done]
        for rid in done:
            del self.requests[rid], self.prompts[rid]
        return outs

    def block_snapshot(self) -> "BlockSnapshot":
        """Who holds which physical block right now, as plain data for minillm.viz's block map."""
        bm, bs = self.block_manager, self.kv.block_size
        owners = [[] for _ in range(bm.num_blocks)]
        filled = [0] * bm.num_blocks
        for s in self.scheduler.running + self.scheduler.padding:
            for i, b in enumerate(s.block_table):
                owners[b].append(s.seq_id)
                filled[b] = max(filled[b], min(bs, max(0, s.num_computed - i * bs)))
        cached = [b in bm.evictable or (bm.block_hash[b] is not None) for b in range(bm.num_blocks)]
        return BlockSnapshot(bm.num_blocks, bs, owners, filled, cached)
