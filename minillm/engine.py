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
from typing import Callable, Optional

from .block_manager import BlockManager
from .config import EngineConfig
from .kv_cache import KVCache
from .model import Transformer
from .model_runner import ModelRunner
from .outputs import CompletionOutput, RequestOutput
from .sampling import SamplingParams, sample_batch
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .tokenizer import BOS, EOS, Tokenizer
from .trace import StepRecord, Trace


class LLMEngine:
    def __init__(self, model: Transformer, tokenizer, config: EngineConfig, clock: Optional[Callable[[], float]] = None):
        config = config.with_model(model.config)
        if config.backend != "torch":
            raise ValueError(f"backend={config.backend!r} is not available yet; this build has backend='torch'")
        if config.quantization or config.kv_cache_dtype != "auto" or config.speculative:
            raise ValueError("quantization, kv_cache_dtype='int8' and speculative decoding are not available yet")
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.clock = clock or time.perf_counter
        mcfg, bs = model.config, config.block_size
        dtype = next(model.parameters()).dtype
        if config.kv_cache_bytes is None:  # room for max_num_seqs sequences at full length
            num_blocks = config.max_num_seqs * -(-config.max_model_len // bs)
            self.kv = KVCache(mcfg, num_blocks, bs, dtype)
        else:
            self.kv = KVCache.from_bytes(mcfg, config.kv_cache_bytes, bs, dtype)
        if self.kv.num_blocks * bs < config.max_model_len:
            raise ValueError(f"kv_cache_bytes={config.kv_cache_bytes} holds {self.kv.num_blocks * bs} tokens, "
                             f"fewer than one sequence of max_model_len={config.max_model_len}")
        self.block_manager = BlockManager(self.kv.num_blocks, bs)
        self.scheduler = Scheduler(config, self.block_manager, self.clock)
        self.runner = ModelRunner(model, self.kv)
        self.trace = Trace(config.trace)
        self.requests: dict[str, list[Sequence]] = {}
        self.prompts: dict[str, Optional[str]] = {}
        self._seq_ids = itertools.count()
        self._req_ids = itertools.count()
        self._step = 0
        is_llama2c = isinstance(tokenizer, Tokenizer)
        # llama2.c's data separates documents with BOS and run.c stops on it; EOS ends a text too
        self.stop_ids = {BOS, EOS} if is_llama2c else {tokenizer.eos_id}

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt, params: Optional[SamplingParams] = None, request_id: Optional[str] = None,
                    arrival_time: Optional[float] = None) -> str:
        """prompt: text or a list of token ids (BOS included). Validated before anything is queued."""
        params = params or SamplingParams()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        limit = self.config.max_model_len
        if len(ids) >= limit:
            raise ValueError(f"prompt has {len(ids)} tokens but max_model_len is {limit}: "
                             f"it must be shorter to leave room for at least one generated token")
        if not ids:
            raise ValueError("prompt is empty: pass text or at least one token id")
        V = self.model.config.vocab_size
        if any(not 0 <= t < V for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {V}), got {[t for t in ids if not 0 <= t < V][:5]}")
        request_id = str(next(self._req_ids)) if request_id is None else str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = self.clock() if arrival_time is None else arrival_time
        base_seed = params.seed if params.seed is not None else \
            (self.config.seed * 1_000_003 + zlib.crc32(request_id.encode())) & 0x7FFFFFFF  # stable across processes
        seqs = [Sequence(next(self._seq_ids), request_id, i, ids, params, base_seed + i, now) for i in range(params.n)]
        self.requests[request_id] = seqs
        self.prompts[request_id] = prompt if isinstance(prompt, str) else None
        for s in seqs:
            self.scheduler.add(s)
        return request_id

    def abort(self, request_id: str):
        for seq in self.requests.get(str(request_id), []):
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[RequestOutput]:
        """One model call. Returns the state of every request that ran in it."""
        start = self.clock()
        batch = self.scheduler.schedule()
        if not batch:
            return []
        n_tokens = batch.num_tokens
        logits = self.runner.run(batch)                                         # (B, V)
        ids = sample_batch(logits, [s.params for s in batch.seqs], [s.generator for s in batch.seqs])
        self.scheduler.update(batch, ids, self._check_finished)
        self._record(batch, n_tokens, start)
        return [self._output(rid) for rid in dict.fromkeys(s.request_id for s in batch.seqs)]

    def _check_finished(self, seq: Sequence) -> bool:
        p, tok = seq.params, seq.output_ids[-1]
        seq.text = self._decode(seq)
        if not p.ignore_eos and tok in self.stop_ids:
            seq.finish_reason, seq.stop_reason = "stop", tok
            return True
        if tok in p.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", tok
            return True
        for s in p.stop:
            at = seq.text.find(s)
            if at >= 0:
                seq.text = seq.text[:at]
                seq.finish_reason, seq.stop_reason = "stop", s
                return True
        if len(seq.output_ids) >= p.max_tokens or len(seq) >= self.config.max_model_len:
            seq.finish_reason = "length"
            return True
        return False

    def _decode(self, seq: Sequence) -> str:
        ids = seq.output_ids
        if ids and ids[-1] in self.stop_ids | set(seq.params.stop_token_ids) and not seq.params.ignore_eos:
            ids = ids[:-1]  # the stop token itself is not text
        return self.tokenizer.decode(ids, prev_token=seq.prompt_ids[-1]) if isinstance(self.tokenizer, Tokenizer) \
            else self.tokenizer.decode(ids)

    def _output(self, request_id: str) -> RequestOutput:
        seqs = self.requests[request_id]
        outs = [CompletionOutput(s.index, s.text, list(s.output_ids), s.finish_reason, s.stop_reason) for s in seqs]
        done = all(s.is_finished for s in seqs)
        return RequestOutput(request_id, self.prompts[request_id], list(seqs[0].prompt_ids), outs, done, seqs[0].metrics)

    def _record(self, batch, n_tokens: int, start: float):
        bm, bs = self.block_manager, self.kv.block_size
        per_block = self.kv.nbytes // self.kv.num_blocks
        filled = sum(len(s) - 1 for s in self.scheduler.running)  # K/V written for running sequences
        self.trace.record(StepRecord(
            step=self._step, kind=batch.kind, seq_ids=[s.seq_id for s in batch.seqs],
            num_prefill_tokens=n_tokens if batch.kind == "prefill" else 0,
            num_decode_tokens=n_tokens if batch.kind == "decode" else 0,
            blocks_used=bm.num_used, blocks_free=bm.num_free, kv_bytes_used=bm.num_used * per_block,
            kv_bytes_filled=filled * per_block // bs, start=start, seconds=self.clock() - start))
        self._step += 1

    def pop_finished(self) -> list[RequestOutput]:
        """Outputs of finished requests, removed from the engine's bookkeeping."""
        done = [rid for rid, seqs in self.requests.items() if all(s.is_finished for s in seqs)]
        outs = [self._output(rid) for rid in done]
        for rid in done:
            del self.requests[rid], self.prompts[rid]
        return outs
