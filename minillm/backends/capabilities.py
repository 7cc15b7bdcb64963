"""Backends behind one interface, and the one table of what each can run.

`backend="auto"` (the default) picks the fastest backend whose row covers every option asked for: "cuda" on a GPU,
then "numba" on a CPU (one compiled call per step, at llama2.c's speed), then "torch" (every feature), and says which
it chose and why (choose_backend).

A backend is the module whose forward the runner calls, with Transformer.forward's serving signature:
    forward(tokens (B, T), positions (B, T), kv, attn, rows=(N,), return_hidden=False) -> logits (N, V)[, (N, C)]
- "torch": the Transformer itself (every feature; built first for every new one).
- "numba": the whole forward in one compiled call on minillm.kernels' CPU twins (minillm.backends.numba_model), with a
  fixed summation order, so a sequence's logits do not depend on its batch, bit for bit.
- "cuda": the forward as minillm.kernels' CUDA launches on torch CUDA tensors (minillm.backends.cuda_model); in numba's
  simulator on the CPU for tests.
What a backend cannot run yet is declared in CAPABILITIES and refused from here, naming the option and the
backends that can run it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from ..config import DTYPES, QUANTIZATION_SCHEMES, EngineConfig, sparsity_pattern
from ..llama.linears import Int4Linear, Int8Linear, Q80Linear, W8A8Linear
from ..moe.experts import moe_layers


@dataclass(frozen=True)
class Capability:
    dtypes: tuple                  # EngineConfig.dtype values
    quantization: tuple            # EngineConfig.quantization schemes
    kv_cache_dtypes: tuple         # EngineConfig.kv_cache_dtype values
    speculative: tuple             # speculative methods (chains need rows at every query token; Medusa a tree
                                   # mask, RoPE positions apart from cache slots, and hidden states)
    linears: tuple | None          # the linear module types it has kernels for (exact types); None: any module
                                   # with a forward over the last dimension (a weight type plugged into the model)
    sparsity: tuple = ("unstructured", "n:m")  # EngineConfig.sparsity patterns: unstructured and N:M are dense weights
                                   # with zeros (any backend); "2:4" is Sparse24Linear (values + 2-bit indices)
    kv_eviction: tuple = ()        # kv_eviction methods (keys stored before RoPE, attention probabilities kept)
    lora: bool = False             # enable_lora: per-row adapters in the linears (minillm.lora.adapters)
    moe: bool = False              # mixture-of-experts FFNs (minillm.moe.experts: a router, experts run per token)
    parallel: tuple = ()           # tensor_parallel_size / pipeline_parallel_size > 1 (minillm.parallel): "tensor",
                                   # "pipeline"
    families: tuple = ("llama", "qwen2", "qwen3")   # ModelConfig.family: Llama (2, 3.x with its RoPE scaling,
                                   # SmolLM2, TinyLlama), Qwen2 (q, k, v biases), Qwen3 (q/k norms)


CAPABILITIES = {
    "torch": Capability(DTYPES, QUANTIZATION_SCHEMES, ("auto", "int8"), ("draft", "ngram", "medusa"), None,
                        sparsity=("unstructured", "n:m", "2:4"), kv_eviction=("streaming", "h2o"), lora=True,
                        moe=True, parallel=("tensor", "pipeline")),
    "numba": Capability(("float32",), ("int8", "int4", "q8_0", "gptq", "w8a8"), ("auto", "int8"),  # gptq: int4 weights
                        ("draft", "ngram", "medusa"),
                        (nn.Linear, Int8Linear, Int4Linear, Q80Linear, W8A8Linear)),
    "cuda": Capability(("float32",), (), ("auto",), ("draft", "ngram"), (nn.Linear,), families=("llama",)),
}


SPEED_ORDER = ("cuda", "numba", "torch")     # what "auto" tries, fastest first


def _refuse(backend: str, what: str, value, ok) -> ValueError:
    can = [b for b, cap in CAPABILITIES.items() if ok(cap)]
    return ValueError(f"backend={backend!r} does not run {what}={value!r} yet; "
                      f"{'backends that do: ' + ', '.join(can) if can else 'no backend does'} "
                      "(minillm.backends.capabilities.CAPABILITIES)")


def check_backend(config: EngineConfig, method=None):
    """Refuse an option the chosen backend cannot run, before anything is built."""
    _check_options(config.backend, config, method)


def _check_options(b: str, config: EngineConfig, method=None):
    cap = CAPABILITIES[b]
    if config.dtype not in cap.dtypes:
        raise _refuse(b, "dtype", config.dtype, lambda c: config.dtype in c.dtypes)
    if config.quantization and config.quantization not in cap.quantization:
        raise _refuse(b, "quantization", config.quantization, lambda c: config.quantization in c.quantization)
    if config.kv_cache_dtype not in cap.kv_cache_dtypes:
        raise _refuse(b, "kv_cache_dtype", config.kv_cache_dtype, lambda c: config.kv_cache_dtype in c.kv_cache_dtypes)
    kind = sparsity_kind(config.sparsity)
    if kind and kind not in cap.sparsity:
        raise _refuse(b, "sparsity pattern", config.sparsity["pattern"], lambda c: kind in c.sparsity)
    evict = config.kv_eviction["method"] if config.kv_eviction else None
    if evict is not None and evict not in cap.kv_eviction:
        raise _refuse(b, "kv_eviction method", evict, lambda c: evict in c.kv_eviction)
    if method is not None and method not in cap.speculative:
        raise _refuse(b, "speculative method", method, lambda c: method in c.speculative)
    if config.enable_lora and not cap.lora:
        raise _refuse(b, "enable_lora", True, lambda c: c.lora)
    for kind, size in (("tensor", config.tensor_parallel_size), ("pipeline", config.pipeline_parallel_size)):
        if size > 1 and kind not in cap.parallel:
            raise _refuse(b, f"{kind}_parallel_size", size, lambda c: kind in c.parallel)   # noqa: B023 (called now)


def sparsity_kind(sparsity) -> str | None:
    """EngineConfig.sparsity's row in the table: None, "unstructured", "2:4" (stored compressed) or "n:m"."""
    if not sparsity:
        return None
    n, m = sparsity_pattern(sparsity["pattern"])
    return "unstructured" if m is None else "2:4" if (n, m) == (2, 4) else "n:m"


def choose_backend(config: EngineConfig, method=None, model: nn.Module | None = None) -> tuple[str, str]:
    """backend="auto": the first of SPEED_ORDER that this machine has and whose row covers every option (and
    the model's linear types) -> (backend, a sentence saying why). Any other backend is returned as asked."""
    if config.backend != "auto":
        return config.backend, f"backend={config.backend!r} (asked for)"
    skipped = []
    for b in SPEED_ORDER:
        if b == "cuda" and not _has_gpu():
            skipped.append("cuda: no GPU")
            continue
        try:
            _check_options(b, config, method)
            if model is not None:
                check_model(model, b)
        except ValueError as e:
            skipped.append(f"{b}: {str(e).split(';')[0].split(' yet')[0].replace(f'backend={b!r} ', '')}")
            continue
        return b, f"backend='auto' chose {b!r}" + (f" ({'; '.join(skipped)})" if skipped else "")
    raise AssertionError("torch runs every option")   # the torch row covers everything (built first)


def _has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


def check_model(model: nn.Module, backend: str):
    """The numba and CUDA twins copy the weights of the linear types they have kernels for; any other weight type
    (a student's, plugged into the model) runs on torch only."""
    if moe_layers(model) and not CAPABILITIES[backend].moe:      # its twins copy dense FFN weights, which MoE lacks
        where = next(n for n, m in model.named_modules() if m is moe_layers(model)[0])
        raise _refuse(backend, "a mixture-of-experts FFN (MoEFeedForward) at", where, lambda c: c.moe)
    family = getattr(getattr(model, "config", None), "family", "llama")
    if family not in CAPABILITIES[backend].families:
        raise _refuse(backend, "a model of family (model_type)", family, lambda c: family in c.families)
    kinds = CAPABILITIES[backend].linears
    if kinds is None:
        return
    for name, mod in model.named_modules():
        if type(mod) is W8A8Linear and mod.smooth is not None and backend != "torch":
            raise _refuse(backend, "a SmoothQuant linear (W8A8 with smoothing factors) at", name,
                          lambda c: c.linears is None)      # q|k|v fused into one matmul need one smoothing
        if type(mod) in kinds or isinstance(mod, nn.Embedding) or not hasattr(mod, "in_features"):
            continue
        raise _refuse(backend, f"a linear of type {type(mod).__name__} at", name,
                      lambda c: c.linears is None or type(mod) in c.linears)


def backend_model(model: nn.Module, backend: str):
    """The module that runs the forward for this backend: the torch model itself, or its numba or CUDA twin
    built on the same weights (imported only when asked for: they compile on first use)."""
    check_model(model, backend)
    if backend == "numba":
        from .numba_model import NumbaTransformer
        return NumbaTransformer(model)
    if backend == "cuda":
        from .cuda_model import CudaTransformer
        return CudaTransformer(model)
    return model
