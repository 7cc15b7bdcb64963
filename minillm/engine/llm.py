"""LLM: the offline API a vLLM user knows. LLM(model, **options).generate(prompts, params).

Options are EngineConfig's names. The engine's seams (minillm.engine.parts.SEAMS: policy, block_manager, proposer,
verify) may also be given as objects, to run your own part inside the real engine.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Optional, Union

from ..config import EngineConfig
from ..core.outputs import RequestOutput
from ..core.sampling import SamplingParams
from ..formats.loader import load
from ..progress import progress
from .engine import LLMEngine
from .parts import SEAMS, prepare


class LLM:
    def __init__(self, model, *, tokenizer=None, **options):
        names = {f.name for f in fields(EngineConfig)}
        unknown = set(options) - names - set(SEAMS)
        if unknown:
            raise TypeError(f"unknown LLM option(s) {sorted(unknown)}; options are {sorted(names - {'tokenizer'})}, "
                            f"and the seams {list(SEAMS)}")
        seams = {k: options.pop(k) for k in SEAMS if k in options}
        self.config = EngineConfig(tokenizer=tokenizer if isinstance(tokenizer, str) else None, **options)
        self.model, self.tokenizer = load(model, tokenizer, self.config.dtype, self.config.seed)
        self.engine = LLMEngine(prepare(self.model, self.tokenizer, self.config, **seams))

    def generate(self, prompts: Union[str, list], params: Optional[Union[SamplingParams, list]] = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in the order of the prompts.
        prompts: a string, a list of strings, or a list of token-id lists. Every prompt is validated before any
        is queued. If a step raises (an interrupt, a failing model), this call's requests are aborted, their
        blocks freed, and the exception re-raised: the engine stays usable."""
        if isinstance(prompts, (str, bytes)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string, a list of strings or a list of token-id lists, "
                             f"got {type(prompts).__name__}")
        params = SamplingParams() if params is None else params
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        engine = self.engine
        requests = [engine.make_request(p, sp) for p, sp in zip(prompts, plist)]   # all validated before any runs
        ids = [engine.enqueue(r) for r in requests]
        wanted, done = set(ids), {}
        bar = progress(len(ids), desc="generate", enabled=use_tqdm)
        engine.scheduler.expect_arrivals = False       # every request is known: no batching window to wait out
        try:
            while wanted - done.keys():
                engine.step()
                for out in engine.pop_finished():
                    done[out.request_id] = out
                    bar.update(1)
        except BaseException:
            for rid in wanted - done.keys():
                if rid in engine.requests:
                    engine.abort(rid)
                    engine.requests.pop(rid)
            raise
        finally:
            engine.scheduler.expect_arrivals = True
            bar.close()
        return [done[i] for i in ids]
