"""What speculative decoding holds in memory, in bytes, read from a built engine's parts (notebook 08).

    target weights, target KV pool   what plain decoding already holds (the baseline)
    draft weights, draft KV pool     method "draft": a second model, with its own paged pool (DraftProposer.kv)
    lookahead slots                  each decode step, every speculating sequence takes `slots` extra KV slots of the
                                     target's pool for its drafts (vLLM's lookahead slots): gamma for a chain
                                     (draft, n-gram), one per tree node below the root for Medusa
    Medusa heads                     method "medusa": K heads of (C x C) weights and a bias, on the target's
                                     hidden state (its classifier is shared, so it costs nothing extra)

Everything here counts tensors the engine allocated (or, for the slots, the pool bytes a step reserves); it
times nothing, so the numbers are the same on every machine.
"""
from __future__ import annotations


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def module_bytes(module) -> int:
    """Parameters and buffers of a torch module (a numba twin is measured through the torch model it wraps);
    RoPE tables are not weights and are left out."""
    module = getattr(module, "model", module)
    skip = {id(getattr(module, n, None)) for n in ("rope_cos", "rope_sin")}
    return _tensor_bytes(t for t in list(module.parameters()) + list(module.buffers()) if id(t) not in skip)


def spec_memory(engine) -> dict:
    """engine: an LLMEngine (LLM(...).engine) built with `speculative=`, or without (then only the baseline).
    -> {"method", "gamma", "slots_per_seq" (lookahead slots one sequence reserves per step), "max_num_seqs",
    "target_kv_bytes_per_token", "parts": {name: bytes}} where parts holds the target's weights and KV pool and
    what this method adds: the draft's weights and KV pool, the lookahead slots of one sequence and of
    max_num_seqs sequences, the Medusa heads."""
    cfg = engine.config
    kv = engine.kv
    per_token = kv.nbytes // (kv.num_blocks * kv.block_size)                  # K and V of every layer, one token
    parts = {"target weights": module_bytes(engine.model), "target KV pool": kv.nbytes}
    from ..spec_decode.config import SpeculativeConfig
    prop = engine.proposer
    spec = SpeculativeConfig.from_dict(cfg.speculative) if cfg.speculative is not None else None
    method, gamma, slots = (spec.method, spec.gamma, 0) if spec else (None, 0, 0)
    if method == "draft":
        parts["draft weights"] = module_bytes(prop.runner.model)
        parts["draft KV pool"] = prop.kv.nbytes
        slots = prop.gamma
    elif method == "ngram":
        slots = prop.gamma
    elif method == "medusa":
        slots = len([c for c in prop.choices if len(c) <= prop.gamma])      # the tree's nodes below the root
    if slots:
        parts["lookahead slots, 1 sequence"] = slots * per_token
        parts[f"lookahead slots, {cfg.max_num_seqs} sequences"] = slots * per_token * cfg.max_num_seqs
    if method == "medusa":
        parts["Medusa heads"] = module_bytes(prop.heads)
    return {"method": method, "gamma": gamma, "slots_per_seq": slots, "max_num_seqs": cfg.max_num_seqs,
            "target_kv_bytes_per_token": per_token, "parts": parts}
