"""LLM: the offline API a vLLM user knows. LLM(model, **options).generate(prompts, params)."""
from __future__ import annotations

from dataclasses import fields
from typing import Optional, Union

from .config import EngineConfig
from .engine import LLMEngine
from .loader import load
from .outputs import RequestOutput
from .progress import progress
from .sampling import SamplingParams


class LLM:
    def __init__(self, model, *, tokenizer=None, **options):
        names = {f.name for f in fields(EngineConfig)}
        unknown = set(options) - names
        if unknown:
            raise TypeError(f"unknown LLM option(s) {sorted(unknown)}; options are {sorted(names - {'tokenizer'})}")
        self.config = EngineConfig(tokenizer=tokenizer if isinstance(tokenizer, str) else None, **options)
        self.model, self.tokenizer = load(model, tokenizer, self.config.dtype, self.config.seed)
        self.engine = LLMEngine(self.model, self.tokenizer, self.config)

    def generate(self, prompts: Union[str, list], params: Optional[Union[SamplingParams, list]] = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in the order of the prompts.
        prompts: a string, a list of strings, or a list of token-id lists."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        # validate every prompt before queueing any, so one bad prompt leaves the engine untouched
        token_ids = [self.engine.validate(p) for p in prompts]
        for t, sp in zip(token_ids, plist):
            self.engine.check_fits(len(t), sp)
        ids = [self.engine.add_request(t, sp) for t, sp in zip(token_ids, plist)]
        for rid, p in zip(ids, prompts):
            self.engine.prompts[rid] = p if isinstance(p, str) else None
        wanted, done = set(ids), {}
        bar = progress(len(ids), desc="generate", enabled=use_tqdm)
        while wanted - done.keys():
            self.engine.step()
            for out in self.engine.pop_finished():
                done[out.request_id] = out
                bar.update(1)
        bar.close()
        return [done[i] for i in ids]
