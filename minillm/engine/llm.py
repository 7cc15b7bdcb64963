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
from ..decoding.beam import BeamSearchOutput
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
                 use_tqdm: bool = False, priority: Union[int, list] = 0, client=None, lora=None) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in the order of the prompts.
        prompts: a string, a list of strings, or a list of token-id lists. Every prompt is validated before any
        is queued. If a step raises (an interrupt, a failing model), this call's requests are aborted, their
        blocks freed, and the exception re-raised: the engine stays usable.
        priority, client: one value for every prompt, or one per prompt (scheduling_policy "priority", "fair").
        lora: None (the base model), a LoRA adapter (a shipped name, a PEFT directory, a LoRAAdapter) for every
        prompt, or a list of one per prompt (None among them); needs LLM(..., enable_lora=True)."""
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
        prio, clients = _per_prompt("priority", priority, len(prompts)), _per_prompt("client", client, len(prompts))
        loras = _per_prompt("lora", lora, len(prompts))
        requests = [engine.make_request(p, sp, priority=pr, client=c, lora=lo)      # all validated before any runs
                    for p, sp, pr, c, lo in zip(prompts, plist, prio, clients, loras)]
        done = self._run(requests, "generate", use_tqdm)
        return [done[r.request_id] for r in requests]

    def _run(self, requests: list, desc: str, use_tqdm: bool) -> dict:
        """Queue validated requests and step the engine until all have finished. -> request_id: RequestOutput.
        If a step raises (an interrupt, a failing model), these requests are aborted, their blocks freed, and the
        exception re-raised: the engine stays usable."""
        engine = self.engine
        ids = [engine.enqueue(r) for r in requests]
        wanted, done = set(ids), {}
        bar = progress(len(ids), desc=desc, enabled=use_tqdm)
        try:
            while wanted - done.keys():
                engine.advance(expect_arrivals=False)  # every request is known: no batching window to wait out
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
            bar.close()
        return done

    def beam_search(self, prompts: Union[str, list], beam_width: int, max_tokens: int, *, length_penalty: float = 1.0,
                    ignore_eos: bool = False, use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """Beam search (minillm.decoding.beam; vLLM's LLM.beam_search): per prompt, the beam_width best sequences, best
        first by cum_logprob / length ** length_penalty (.sequences[i].tokens include the prompt, as vLLM's).
        Deterministic: temperature, top-k/top-p and seeds do not apply. It runs in the one engine loop, beside
        any other request, its beams sharing KV blocks (copy-on-write). Every prompt, and each group's worst case
        of beam_width * blocks, is validated before any is queued."""
        if isinstance(prompts, (str, bytes)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string, a list of strings or a list of token-id lists, "
                             f"got {type(prompts).__name__}")
        engine = self.engine
        requests = [engine.make_beam_request(p, beam_width, max_tokens, length_penalty=length_penalty,
                                             ignore_eos=ignore_eos) for p in prompts]   # all validated first
        self._run(requests, "beam_search", use_tqdm)    # as generate: aborted and freed if a step raises
        return [r.beam.result() for r in requests]


def _per_prompt(name: str, value, n: int) -> list:
    """generate's priority= and client=: one value for every prompt, or a list or tuple of one per prompt."""
    if not isinstance(value, (list, tuple)):
        return [value] * n
    if len(value) != n:
        raise ValueError(f"{n} prompts but {len(value)} values of {name}= (give one, or one per prompt)")
    return list(value)
