"""Configuration dataclasses: the model's shape (ModelConfig) and the engine's options (EngineConfig).

Config is plain data: derived fields are computed in __post_init__, mistakes are caught there with a
message that names the value (gpt-fast `ModelArgs`, nano-vllm `Config`). The value checks below are
shared with SamplingParams, so every option is refused the same way: `Owner.field must be ..., got value`.
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Optional


# ---------------------------------------------------------------------------- value checks
def _is_int(value) -> bool:
    """An integer, numpy's included, but not a bool: bool subclasses int, so True would pass as 1."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_int(owner: str, name: str, value, minimum: int = 1, maximum: Optional[int] = None,
               what: Optional[str] = None) -> int:
    """value as a plain int, if it is an integer in [minimum, maximum); else a ValueError naming owner.name."""
    if _is_int(value) and value >= minimum and (maximum is None or value < maximum):
        return int(value)
    what = what or ("a positive integer" if minimum == 1 else f"an integer >= {minimum}")
    raise ValueError(f"{owner}.{name} must be {what}, got {value!r}")


def _check_real(owner: str, name: str, value, what: str, ok: Callable[[float], bool] = lambda x: x >= 0) -> float:
    """value as a float, if it is a finite real number (int or float, not a bool, NaN or inf) passing ok."""
    x = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            x = float(value)
        except OverflowError:   # an int too large for a float
            x = math.inf
    if math.isfinite(x) and ok(x):
        return x
    raise ValueError(f"{owner}.{name} must be {what}, got {value!r}")


def _check_bool(owner: str, name: str, value) -> bool:
    """True or False only: a truthy string such as "false" must not switch a feature on."""
    if value is True or value is False:
        return value
    raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


def _check_list(owner: str, name: str, value, ok: Callable[[Any], bool], what: str) -> list:
    """None (-> []) or a list or tuple whose every item passes ok (-> a new list)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)) and all(ok(v) for v in value):
        return list(value)
    raise ValueError(f"{owner}.{name} must be {what}, got {value!r}")


def _physical_memory() -> Optional[int]:
    """Bytes of RAM, or None where os.sysconf cannot tell (it does not exist on Windows)."""
    try:
        page, pages = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return page * pages if page > 0 and pages > 0 else None


@dataclass
class ModelConfig:
    dim: int = 288                 # C, the residual stream width
    hidden_dim: int = 768          # SwiGLU inner width
    n_layers: int = 6
    n_heads: int = 6               # H, query heads
    n_kv_heads: Optional[int] = None   # Hkv; None means n_heads (multi-head attention)
    vocab_size: int = 32000        # V
    max_seq_len: int = 256         # the context length
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    shared_classifier: bool = True # output head tied to the token embedding (llama2.c's default)
    dropout: float = 0.0           # training only
    head_dim: Optional[int] = None # D; None: dim // n_heads (Qwen3 sets its own, with n_heads * D != dim)
    qkv_bias: bool = False         # biases on q, k and v (Qwen2, Qwen2.5)
    qk_norm: bool = False          # RMSNorm over each head of q and of k, before RoPE (Qwen3)
    rope_scaling: Optional[dict] = None   # None, or {"rope_type": "llama3", "factor", "low_freq_factor",
                                   # "high_freq_factor", "original_max_position_embeddings"} (Llama 3.x), or
                                   # {"rope_type": "linear", "factor"}: minillm.llama.transformer.rope_frequencies
    kv_dim: int = field(init=False)    # Hkv * D

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        for name in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ValueError(f"dim={self.dim} is not divisible by n_heads={self.n_heads}")
            self.head_dim = self.dim // self.n_heads
        elif isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 1:
            raise ValueError(f"ModelConfig.head_dim must be a positive integer or None, got {self.head_dim!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE (dim={self.dim}, n_heads={self.n_heads})")
        self.kv_dim = self.n_kv_heads * self.head_dim
        need = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings")}
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type") if isinstance(self.rope_scaling, dict) else None
            if kind not in need or any(k not in self.rope_scaling for k in need[kind]):
                raise ValueError(f"ModelConfig.rope_scaling={self.rope_scaling!r}: rope_type must be one of "
                                 f"{', '.join(need)}, with {need}")

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; available: {', '.join(sorted(PRESETS))}")
        return cls(**{**PRESETS[name], **overrides})

    def to_dict(self) -> dict:
        """The constructor's arguments; the model-family settings only where they differ from Llama 2's (so a
        llama2.c model's dict, and what was saved from it, is as it always was)."""
        plain = {"head_dim": self.dim // self.n_heads if self.dim % self.n_heads == 0 else None, "qkv_bias": False,
                 "qk_norm": False, "rope_scaling": None}
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.init and not (f.name in plain and getattr(self, f.name) == plain[f.name])}

    def __repr__(self) -> str:
        """The dataclass repr, without the family settings at their Llama-2 defaults (a llama2.c model prints as
        it always did)."""
        plain = {"qkv_bias": False, "qk_norm": False, "rope_scaling": None}
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                          if not (f.name in plain and getattr(self, f.name) == plain[f.name]))
        return f"ModelConfig({shown})"

    @property
    def family(self) -> str:
        """The Hugging Face model_type this block is (minillm.formats.hf): llama, qwen2 (q, k, v biases), qwen3."""
        return "qwen3" if self.qk_norm else "qwen2" if self.qkv_bias else "llama"

    @property
    def q_dim(self) -> int:
        """H * D: the width of q and of attention's output (= dim, except where head_dim is set apart: Qwen3)."""
        return self.n_heads * self.head_dim

    def num_params(self) -> int:
        C, Hd, L, V = self.dim, self.hidden_dim, self.n_layers, self.vocab_size
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        norms = 2 * self.head_dim if self.qk_norm else 0
        per_layer = 2 * C + C * self.q_dim * 2 + 2 * C * self.kv_dim + 3 * C * Hd + bias + norms
        return V * C + L * per_layer + C + (0 if self.shared_classifier else V * C)

    def flops_per_token(self, context: int = 0) -> int:
        """Forward FLOPs for one token: 2 per weight multiply-add (every matmul, classifier included),
        plus attention's q.k and p.v over `context` cached positions (Kaplan et al. 2020's 2N + 2 L C T)."""
        C, Hd, L = self.dim, self.hidden_dim, self.n_layers
        matmul = L * (2 * C * self.q_dim + 2 * C * self.kv_dim + 3 * C * Hd) + self.vocab_size * C
        return 2 * matmul + 2 * 2 * L * self.q_dim * context

    def kv_bytes_per_token(self, bytes_per_elem: int = 4) -> int:
        """K and V of every layer for one token."""
        return 2 * self.n_layers * self.kv_dim * bytes_per_elem


# Named shapes. stories* are Karpathy's llama2.c TinyStories models (vocab 32000, MHA);
# "shakespeare" is the target model this project trains and ships, "shakespeare-draft" its draft.
PRESETS: dict[str, dict[str, Any]] = {
    "stories15M": dict(dim=288, hidden_dim=768, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000, max_seq_len=256),
    "stories42M": dict(dim=512, hidden_dim=1376, n_layers=8, n_heads=8, n_kv_heads=8, vocab_size=32000,
                       max_seq_len=1024),
    "stories110M": dict(dim=768, hidden_dim=2048, n_layers=12, n_heads=12, n_kv_heads=12, vocab_size=32000,
                        max_seq_len=1024),
    "shakespeare": dict(dim=256, hidden_dim=768, n_layers=8, n_heads=4, n_kv_heads=2, vocab_size=4096,
                        max_seq_len=1024),
    # the draft: under a tenth of the target's FLOPs per token (0.08x by flops_per_token)
    "shakespeare-draft": dict(dim=96, hidden_dim=256, n_layers=2, n_heads=3, n_kv_heads=1, vocab_size=4096,
                              max_seq_len=1024),
    # small enough that the CPU runs it in milliseconds: tests and notebooks before the trained models
    "tiny": dict(dim=64, hidden_dim=192, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, max_seq_len=256),
    # the open models' exact shapes (their config.json), context cut to 2048: `random:<name>` measures memory and
    # speed at real size without the weights (issue 35); a real folder loads through minillm.formats.hf
    "smollm2-360m": dict(dim=960, hidden_dim=2560, n_layers=32, n_heads=15, n_kv_heads=5, vocab_size=49152,
                         max_seq_len=2048, rope_theta=100000.0),
    "qwen2.5-0.5b": dict(dim=896, hidden_dim=4864, n_layers=24, n_heads=14, n_kv_heads=2, vocab_size=151936,
                         max_seq_len=2048, rope_theta=1000000.0, norm_eps=1e-6, qkv_bias=True),
    "qwen3-0.6b": dict(dim=1024, hidden_dim=3072, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                       vocab_size=151936, max_seq_len=2048, rope_theta=1000000.0, norm_eps=1e-6, qk_norm=True),
    "llama3.2-1b": dict(dim=2048, hidden_dim=8192, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256,
                        max_seq_len=2048, rope_theta=500000.0, norm_eps=1e-5, rope_scaling={
                            "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}),
}


DTYPES = ("float32", "float16", "bfloat16", "float64")                      # EngineConfig.dtype
QUANTIZATION_SCHEMES = ("int8", "int4", "q8_0", "awq", "gptq", "w8a8", "smoothquant")   # EngineConfig.quantization
INT4_GROUPS = (32, 64, 128)                                                   # int4 and AWQ group sizes


SCHEDULING_POLICIES = ("fcfs", "sjf", "priority", "mlfq", "fair", "lpm")   # minillm.core.policies
SPARSITY_METHODS = ("magnitude", "wanda")                                     # minillm.quantization.prune


def sparsity_pattern(pattern) -> tuple:
    """EngineConfig.sparsity's "pattern": a fraction in (0, 1) pruned in each output row (unstructured), or "N:M"
    (keep N of every M consecutive inputs, N < M). -> (fraction, None) or (N, M); a ValueError naming the value."""
    if isinstance(pattern, str):
        parts = pattern.split(":")
        if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            n, m = int(parts[0]), int(parts[1])
            if 0 < n < m:
                return n, m
        raise ValueError(f"EngineConfig.sparsity pattern must be 'N:M' with 0 < N < M (e.g. '2:4') or a fraction "
                         f"in (0, 1), got {pattern!r}")
    return _check_real("EngineConfig", "sparsity pattern", pattern, "a fraction in (0, 1) or 'N:M' (e.g. '2:4')",
                       lambda x: 0.0 < x < 1.0), None


def check_sparsity(sparsity) -> Optional[dict]:
    """None, or {"method": "magnitude" | "wanda", "pattern": "2:4" | 0.5} checked (DESIGN.md's shape)."""
    if sparsity is None:
        return None
    if not isinstance(sparsity, dict) or set(sparsity) - {"method", "pattern"} or "pattern" not in sparsity:
        raise ValueError("EngineConfig.sparsity must be None or a dict {'method': 'magnitude' | 'wanda', "
                         f"'pattern': '2:4' | 0.5}}, got {sparsity!r}")
    method = sparsity.get("method", "wanda")
    if method not in SPARSITY_METHODS:
        raise ValueError(f"EngineConfig.sparsity method={method!r} is not one of {SPARSITY_METHODS}")
    sparsity_pattern(sparsity["pattern"])
    return {"method": method, "pattern": sparsity["pattern"]}


KV_EVICTION_METHODS = ("streaming", "h2o")                                    # minillm.kv_eviction


def check_kv_eviction(value) -> Optional[dict]:
    """None, or {"method": "streaming" | "h2o", "sinks": int >= 0, "window": int >= 1} checked; the window must
    hold at least as many tokens as the sinks. -> the dict with defaults filled (sinks 4, window 256)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"method", "sinks", "window"}:
        raise ValueError("EngineConfig.kv_eviction must be None or a dict {'method': 'streaming' | 'h2o', "
                         f"'sinks': 4, 'window': 256}}, got {value!r}")
    method = value.get("method", "streaming")
    if method not in KV_EVICTION_METHODS:
        raise ValueError(f"EngineConfig.kv_eviction method={method!r} is not one of {KV_EVICTION_METHODS}")
    sinks = _check_int("EngineConfig", "kv_eviction sinks", value.get("sinks", 4), 0)
    window = _check_int("EngineConfig", "kv_eviction window", value.get("window", 256), 1)
    if window < sinks:
        raise ValueError(f"EngineConfig.kv_eviction window={window} is smaller than sinks={sinks}: the window of "
                         f"recent tokens must hold at least as many tokens as the sinks")
    return {"method": method, "sinks": sinks, "window": window}



@dataclass
class EngineConfig:
    """Every engine option, one place (DESIGN.md "Public API"). LLM(model, **options) and the CLI use these names."""
    tokenizer: Optional[str] = None
    backend: str = "auto"
    dtype: str = "float32"
    quantization: Optional[str] = None
    quant_config: Optional[dict] = None
    kv_cache_dtype: str = "auto"
    kv_cache_bytes: Optional[int] = None
    block_size: int = 16
    max_model_len: Optional[int] = None
    batching: str = "continuous"
    batch_window_s: float = 0.0
    max_num_seqs: int = 32
    scheduling_policy: str = "fcfs"
    enable_chunked_prefill: bool = False
    max_num_batched_tokens: Optional[int] = None
    enable_prefix_caching: bool = False
    preemption_mode: str = "recompute"
    swap_bytes: int = 0
    speculative: Optional[dict] = None
    sparsity: Optional[dict] = None
    kv_eviction: Optional[dict] = None
    enable_lora: bool = False           # LoRA adapters per request (minillm.lora.adapters): generate(..., lora=name)
    max_loras: int = 4                  # adapters resident at once (vLLM's name)
    max_lora_rank: int = 16             # the largest adapter rank accepted (vLLM's name)
    tensor_parallel_size: int = 1       # ranks splitting every layer (minillm.parallel, torch.distributed)
    pipeline_parallel_size: int = 1     # ranks splitting the layers into stages
    max_n: int = 128                    # the most samples one request may ask (n, best_of): checked before any is built
    guided_compile_timeout_s: float = 20.0   # the most a guided_* request's pattern may take to compile (a 400 past
                                             # it): a 150k-token vocabulary's JSON schema takes about 4 s
    seed: int = 0
    trace: bool = True

    def check_samples(self, params):
        """A request's samples (n, or best_of) within max_n, or a ValueError naming the field and the limit."""
        if params.num_samples > self.max_n:
            which = "best_of" if params.best_of is not None else "n"
            raise ValueError(f"SamplingParams.{which}={params.num_samples} is above this engine's max_n="
                             f"{self.max_n} samples per request (raise EngineConfig.max_n)")

    def __post_init__(self):
        choices = {
            "backend": ("auto", "torch", "numba", "cuda"),
            "dtype": DTYPES,
            "quantization": (None,) + QUANTIZATION_SCHEMES,
            "kv_cache_dtype": ("auto", "int8"),
            "batching": ("static", "dynamic", "continuous"),
            "preemption_mode": ("recompute", "swap"),
            "scheduling_policy": SCHEDULING_POLICIES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"EngineConfig.{name}={getattr(self, name)!r} is not one of {allowed}")
        E = "EngineConfig"
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "enable_lora", "trace"):
            _check_bool(E, name, getattr(self, name))
        minimum = dict(block_size=1, max_num_seqs=1, max_model_len=1, kv_cache_bytes=1, max_num_batched_tokens=1,
                       swap_bytes=0, seed=0, max_loras=1, max_lora_rank=1, tensor_parallel_size=1,
                       pipeline_parallel_size=1, max_n=1)
        for name, low in minimum.items():       # the three that may be None are filled from the model or a default
            value = getattr(self, name)
            if value is not None or name not in ("max_model_len", "kv_cache_bytes", "max_num_batched_tokens"):
                setattr(self, name, _check_int(E, name, value, low))
        # finite: with batching='dynamic' an infinite window would keep a short batch waiting forever
        self.batch_window_s = _check_real(E, "batch_window_s", self.batch_window_s, "a finite number of seconds >= 0")
        self.guided_compile_timeout_s = _check_real(E, "guided_compile_timeout_s", self.guided_compile_timeout_s,
                                                    "a finite number of seconds > 0", lambda x: x > 0)
        if self.tokenizer is not None and not isinstance(self.tokenizer, str):
            raise ValueError(f"EngineConfig.tokenizer must be None or a path (str), got {self.tokenizer!r}")
        if self.quant_config is not None and not isinstance(self.quant_config, dict):
            raise ValueError(f"EngineConfig.quant_config must be None or a dict, got {self.quant_config!r}")
        if self.speculative is not None and not isinstance(self.speculative, dict):
            raise ValueError("EngineConfig.speculative must be None or a dict with a 'method', "
                             f"got {self.speculative!r}")

        self.sparsity = check_sparsity(self.sparsity)
        self.kv_eviction = check_kv_eviction(self.kv_eviction)
        if self.kv_eviction is not None and (self.enable_prefix_caching or self.speculative is not None):
            raise ValueError("EngineConfig.kv_eviction drops blocks from the middle of a sequence: it does not combine "
                             "with enable_prefix_caching=True (a block's name is its whole prefix) or speculative "
                             f"decoding, got enable_prefix_caching={self.enable_prefix_caching}, "
                             f"speculative={self.speculative!r}")

        # Options that contradict each other are refused, not silently ignored.
        if self.enable_chunked_prefill and self.batching != "continuous":
            raise ValueError(f"EngineConfig.enable_chunked_prefill=True needs batching='continuous' "
                             f"(a static or dynamic batch prefills whole prompts together), "
                             f"got batching={self.batching!r}")
        if self.max_num_batched_tokens is not None and not self.enable_chunked_prefill:
            raise ValueError(f"EngineConfig.max_num_batched_tokens={self.max_num_batched_tokens} is chunked prefill's "
                             f"per-step token budget: it needs enable_chunked_prefill=True")
        if self.quant_config is not None and self.quantization is None:
            raise ValueError(f"EngineConfig.quant_config={self.quant_config!r} configures a quantization scheme, "
                             f"but quantization=None: name one of {choices['quantization'][1:]}")
        if self.swap_bytes and self.preemption_mode == "recompute":
            raise ValueError(f"EngineConfig.swap_bytes={self.swap_bytes} is swap space that "
                             f"preemption_mode='recompute' never uses: set preemption_mode='swap' or swap_bytes=0")
        # (preemption_mode='swap' with too little swap_bytes is refused by LLMEngine, which knows a block's size.)
        total = _physical_memory()
        if self.kv_cache_bytes is not None and total is not None and self.kv_cache_bytes > total:
            raise ValueError(f"EngineConfig.kv_cache_bytes={self.kv_cache_bytes} is more than this machine's physical "
                             f"memory, {total} bytes ({total / 2**30:.1f} GiB)")

    def with_model(self, model_config: ModelConfig) -> "EngineConfig":
        """Fill in what depends on the model: max_model_len defaults to (and may not exceed) its context."""
        limit = model_config.max_seq_len
        if self.max_model_len is None:
            return replace(self, max_model_len=limit)
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's context max_seq_len={limit}")
        return self
