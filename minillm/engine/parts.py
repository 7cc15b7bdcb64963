"""Parts prepared in one place, then handed to the engine, which never opens a file:

    model (loaded, in its dtype) -> quantize -> backend forward -> KV pool and block manager -> scheduling
    policy -> proposer (a draft model loaded, or Medusa heads) -> verification rule

Every seam of DESIGN.md can be replaced here by an object of the same interface (LLM(..., policy=...) passes
them on): the scheduling `policy` (minillm.core.policies), the `block_manager` (a factory called like BlockManager),
the `proposer` (minillm.core.proposer), the `verify` rule (minillm.core.verify). Logits processors are per request
(SamplingParams.logits_processors); a weight type is plugged into the model itself (any module with a
forward over the last dimension where an nn.Linear was).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch

from ..backends.capabilities import backend_model, check_backend, choose_backend, sparsity_kind
from ..config import EngineConfig
from ..core.block_manager import BlockManager
from ..core.hooks import NoAdapters, NoEviction, NoSwap
from ..core.policies import SchedulingPolicy
from ..core.proposer import Proposer
from ..core.verify import verify_sampled
from ..formats.hf import check_pool_fits
from ..kernels import cdiv
from ..llama.kv_cache import KVCache, SwapSpace
from ..scheduling import make_policy

SEAMS = ("policy", "block_manager", "proposer", "verify", "eviction")


@dataclass
class Parts:
    config: EngineConfig            # max_model_len filled in from the model
    model: Any                      # the torch Transformer (quantized if asked): shapes, vocabulary
    tokenizer: Any
    forward: Any                    # what the runner calls: the model, or its numba / CUDA twin
    kv: KVCache
    swap: Any                       # SwapSpace, or NoSwap (preemption recomputes)
    block_manager: Any
    policy: SchedulingPolicy
    proposer: Proposer
    verify: Callable
    quant_report: Optional[dict] = None
    backend_choice: str = ""        # which backend runs the forward, and why (backend="auto" says what it skipped)
    sparsity_report: Optional[dict] = None  # minillm.quantization.prune's: zeros per layer, bytes
    lora: Any = field(default_factory=NoAdapters)     # enable_lora: the model's adapter slots (lora.adapters.LoRASlots)
    eviction: Any = field(default_factory=NoEviction)  # kv_eviction: who leaves the cache (minillm.kv_eviction)


def check_combinations(config: EngineConfig, model=None):
    """Options that do not combine yet: refused, never silently ignored. -> (config with backend="auto" resolved,
    the speculative config or None, a sentence on the backend chosen)."""
    from ..spec_decode.config import SpeculativeConfig
    spec = SpeculativeConfig.from_dict(config.speculative) if config.speculative is not None else None
    backend, choice = choose_backend(config, spec.method if spec else None, model)
    config = replace(config, backend=backend)
    check_backend(config, spec.method if spec else None)
    check_order(config)
    check_eviction(config)
    if config.tensor_parallel_size > 1 or config.pipeline_parallel_size > 1:
        from ..parallel.sharded import check_engine_options
        check_engine_options(config, model.config if model is not None else None)
    if config.sparsity and config.quantization and sparsity_kind(config.sparsity) == "2:4":
        raise ValueError(f"sparsity pattern '2:4' is stored as its own weight type (values + 2-bit indices); it does "
                         f"not combine with quantization={config.quantization!r} (an unstructured or other N:M "
                         f"pattern does: its zeros are quantized as zeros)")
    if spec is None:
        return config, None, choice
    if config.batching != "continuous":
        raise ValueError(f"speculative decoding needs batching='continuous' (each sequence advances by its own "
                         f"number of tokens per step), got batching={config.batching!r}")
    if spec.method == "medusa" and config.quantization:
        raise ValueError("speculative method 'medusa' reads the target's float hidden states; it does not combine "
                         f"with quantization={config.quantization!r}")
    return config, spec, choice


def check_eviction(config: EngineConfig):
    """kv_eviction's cache (sinks + window + a chunk + two partial blocks) must fit in the model's context, whose
    RoPE positions the cache indices use (minillm.kv_eviction)."""
    from ..kv_eviction import CHUNK
    ev = config.kv_eviction
    if ev is not None and ev["sinks"] + ev["window"] + CHUNK + 2 * config.block_size > config.max_model_len:
        raise ValueError(f"EngineConfig.kv_eviction sinks={ev['sinks']} + window={ev['window']} (+ a chunk of {CHUNK} "
                         f"and 2 blocks of {config.block_size}) do not fit in max_model_len={config.max_model_len}: "
                         f"lower the window")


def check_order(config: EngineConfig):
    """scheduling_policy is an order inside a batching policy (minillm.scheduling.orders): a preemptive one needs a
    batch that can change every step, and lpm ranks by the prefix cache, so it needs one."""
    from ..scheduling.orders import ORDERS
    order = ORDERS[config.scheduling_policy]
    if config.batching != "continuous" and order.preemptive:
        raise ValueError(f"scheduling_policy={config.scheduling_policy!r} preempts running requests for waiting "
                         f"ones, which a {config.batching} batch never does (it runs to its end): use "
                         f"batching='continuous', or scheduling_policy 'fcfs', 'fair' or 'lpm'")
    if config.scheduling_policy == "lpm" and not config.enable_prefix_caching:
        raise ValueError("scheduling_policy='lpm' ranks waiting requests by their prefix in the cache: it needs "
                         "enable_prefix_caching=True")


def prepare(model, tokenizer, config: EngineConfig, *, policy: Optional[SchedulingPolicy] = None,
            block_manager: Optional[Callable] = None, proposer: Optional[Proposer] = None,
            verify: Optional[Callable] = None, eviction=None) -> Parts:
    """model: a Transformer from minillm.load (already in config.dtype); tokenizer: its tokenizer.
    eviction: an eviction policy object (minillm.kv_eviction) in place of the one config.kv_eviction names;
    the attention rule stays config.kv_eviction's."""
    from ..kv_eviction import make_eviction
    if eviction is not None and config.kv_eviction is None:
        raise ValueError("an eviction= policy object replaces the one kv_eviction names, and needs kv_eviction set "
                         "(its sinks and window decide attention's rule and the checks against max_model_len)")
    from ..quantization.quantize import quantize_model
    config, spec, choice = check_combinations(config.with_model(model.config), model)
    quant_report = sparsity_report = None
    if config.sparsity:                # pruned first, so that a quantizer sees (and keeps) the zeros
        from ..quantization.prune import prune_model
        model, sparsity_report = prune_model(model, config.sparsity, tokenizer)
    if config.quantization:            # a quantized copy: the caller's model is left as it was
        model, quant_report = quantize_model(model, config.quantization, config.quant_config, tokenizer)
    model.ensure_rope(config.max_model_len)
    lora = NoAdapters()
    if config.enable_lora:             # a copy sharing the weights, its linears with max_loras adapter slots
        model, lora = _lora_slots(model, config)
    kv_dtype = torch.int8 if config.kv_cache_dtype == "int8" else next(model.parameters()).dtype
    if config.backend != "cuda":       # the pool lives in this machine's memory
        check_pool_fits(KVCache.engine_bytes(model.config, config, kv_dtype), config)
    if config.tensor_parallel_size > 1 or config.pipeline_parallel_size > 1:
        from ..parallel.sharded import for_engine
        forward = for_engine(model, config, kv_dtype)          # the same engine on several ranks, each with a share
        kv = forward.kv
    else:
        forward = backend_model(model, config.backend)                # the torch model, or its numba / CUDA twin
        kv = KVCache.for_engine(model.config, config, kv_dtype, device=getattr(forward, "device", "cpu"))
    per_block = kv.nbytes // kv.num_blocks
    swap_blocks = config.swap_bytes // per_block
    if config.preemption_mode == "swap" and swap_blocks < 1:
        raise ValueError(f"preemption_mode='swap' needs swap_bytes for at least one block ({per_block:,} bytes), "
                         f"got swap_bytes={config.swap_bytes}")
    bm = (block_manager or BlockManager)(kv.num_blocks, config.block_size,
                                         enable_prefix_caching=config.enable_prefix_caching, swap_blocks=swap_blocks)
    if proposer is None:
        proposer = _proposer(spec, model, tokenizer, config, kv) if spec else Proposer()
    policy = policy or make_policy(config, kv.num_blocks * config.block_size)   # lpm's tree: the pool's tokens
    return Parts(config, model, tokenizer, forward, kv, SwapSpace(kv, swap_blocks) if swap_blocks else NoSwap(), bm,
                 policy, proposer, verify or verify_sampled, quant_report, choice, sparsity_report, lora,
                 eviction or make_eviction(config.kv_eviction))


def _lora_slots(model, config: EngineConfig):
    """enable_lora: the model with LoRA slots in its linears, and the LoRASlots that fill them with adapters read
    by minillm.formats.peft (a shipped name or a PEFT directory) on first use."""
    from functools import partial

    from ..formats.peft import load_adapter
    from ..lora.adapters import LoRASlots, attach_lora
    model = attach_lora(model, config.max_loras, config.max_lora_rank)
    loader = partial(load_adapter, model_config=model.config, max_rank=config.max_lora_rank)
    return model, LoRASlots(model, config.max_loras, config.max_lora_rank, loader)


def _proposer(spec, model, tokenizer, config: EngineConfig, kv: KVCache) -> Proposer:
    """Loads what the method needs (the draft model, the Medusa heads) and builds the proposer."""
    from ..spec_decode.config import make_proposer
    if spec.method == "draft":
        from ..formats.loader import load
        from ..llama.tokenizer import same_tokenizer
        from ..llama.transformer import Transformer
        if isinstance(spec.model, Transformer):
            draft, draft_tok = spec.model, tokenizer
        else:
            draft, draft_tok = load(spec.model or "shakespeare-draft", None, config.dtype, config.seed)
        if not same_tokenizer(draft_tok, tokenizer) or draft.config.vocab_size != model.config.vocab_size:
            raise ValueError(f"the draft model {spec.model or 'shakespeare-draft'!r} uses a different tokenizer "
                             f"from the target's (vocab {draft.config.vocab_size} vs {model.config.vocab_size}, "
                             f"or different tokens): speculative decoding verifies token ids, so both must share "
                             f"one tokenizer")
        if draft.config.max_seq_len < config.max_model_len:
            raise ValueError(f"the draft model's context max_seq_len={draft.config.max_seq_len} is shorter than "
                             f"max_model_len={config.max_model_len}")
        dtype = next(model.parameters()).dtype
        draft = (draft.to(dtype) if next(draft.parameters()).dtype != dtype else draft).eval()
        draft.ensure_rope(config.max_model_len)
        # the draft's pool holds every running token plus each sequence's drafts (its bytes are small)
        blocks = kv.num_blocks + config.max_num_seqs * (cdiv(spec.gamma, config.block_size) + 1)
        kv_dtype = kv.k.dtype if not kv.quantized else torch.float32
        draft_backend = spec.draft_backend
        if draft_backend == "auto":    # the draft is a plain float model: numba runs it when it is float32
            draft_backend = "numba" if dtype == torch.float32 else "torch"
        return make_proposer(spec, model, tokenizer, config, draft=(backend_model(draft, draft_backend),
                                                                   draft.config, blocks, kv_dtype))
    heads = None
    if spec.method == "medusa":
        from ..formats.loader import MODELS_DIR
        from ..spec_decode.medusa_heads import load_medusa
        from ..spec_decode.medusa_tree import DEFAULT_CHOICES, build_tree
        heads = load_medusa(spec.heads or os.path.join(MODELS_DIR, "shakespeare-medusa.bin"), model)
        choices = [tuple(c) for c in (spec.tree or DEFAULT_CHOICES)]
        build_tree(0, torch.zeros(heads.weight.shape[0], model.config.vocab_size), choices)  # validates the tree now
    return make_proposer(spec, model, tokenizer, config, heads=heads)

