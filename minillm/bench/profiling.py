"""Measurements the notebooks make live: decode time with and without a KV cache, prefill vs decode,
KV-cache bytes (formula vs what the pool really allocates), MHA vs GQA, and where the parameters and
time of one forward pass go.

Everything here returns plain data (dataclasses of floats and lists); minillm.viz draws it, the
notebooks print and assert on it. No matplotlib here (DESIGN.md "Layers").

Timing rules, kept small enough for a 2-core laptop and noisy enough machines to agree on *ratios*:
time.perf_counter around each model call, one warm-up run first (allocations, first-call costs), the
median of `repeats` runs per point, torch.inference_mode throughout, and one torch thread by default
(threads=1), as llama2.c's run.c without OpenMP. Why one: a small model's ops last microseconds, and
when another process shares a 2-core machine, torch's second OpenMP thread spin-waits for a core;
we measured stories15M decode steps going from about 4 ms to about 100 ms that way. One thread keeps
the numbers steady.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..config import ModelConfig
from ..llama.attention import AttentionMetadata
from ..llama.kv_cache import KVCache
from ..llama.tokenizer import BOS
from ..llama.transformer import Transformer
from .timing import interleaved


@contextlib.contextmanager
def torch_threads(n: Optional[int]):
    """Run the block with n torch intra-op threads (None: leave as is), then restore the old count."""
    old = torch.get_num_threads()
    if n is not None:
        if n < 1:
            raise ValueError(f"threads must be >= 1 or None, got {n}")
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ---------------------------------------------------------------------------- decode timing
@dataclass
class DecodeTiming:
    """One greedy generation, timed token by token.

    Token i (i = 0 .. n-1) is produced by the model call that sees context_lens[i] tokens: the whole
    prefix without a cache, one new token (plus what is cached) with one."""
    method: str                  # "kv cache" or "no cache"
    prompt_len: int
    context_lens: list           # tokens the model call for token i attends over
    seconds: list                # seconds of the model call for token i, median over repeats
    token_ids: list              # the greedy tokens produced
    logits: Optional[torch.Tensor] = None  # (n, V) the logits each token was picked from (keep_logits=True)
    repeats: int = 1
    threads: Optional[int] = None  # torch threads while timing (None: whatever torch had)

    @property
    def cumulative_seconds(self) -> list:
        """Total time to produce the first i+1 tokens."""
        total, out = 0.0, []
        for s in self.seconds:
            total += s
            out.append(total)
        return out

    def tail_median(self, k: int = 16) -> float:
        """Median seconds per token over the last k tokens: a steadier number than the last point."""
        return statistics.median(self.seconds[-k:])

    def head_median(self, k: int = 16) -> float:
        """Median seconds per token over the first k tokens."""
        return statistics.median(self.seconds[:k])


def _check_length(model: Transformer, prompt_ids: list, n_tokens: int):
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: pass at least one token id (e.g. [BOS])")
    limit = model.config.max_seq_len
    if len(prompt_ids) + n_tokens - 1 > limit:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens + {n_tokens} new tokens needs "
                         f"{len(prompt_ids) + n_tokens - 1} positions; the model's max_seq_len is {limit}")


@torch.inference_mode()
def _greedy_no_cache(model: Transformer, prompt_ids: list, n_tokens: int, keep_logits: bool):
    """Recompute the full causal forward over every token so far, at every step (no state kept)."""
    ids, seconds, logits = list(prompt_ids), [], []
    for _ in range(n_tokens):
        tokens = torch.tensor([ids])                                     # (1, T)
        last = torch.tensor([len(ids) - 1])                              # (1,)
        t0 = time.perf_counter()
        row = model(tokens, last_index=last)[0, -1]                      # (V,) only the last row's logits
        seconds.append(time.perf_counter() - t0)
        if keep_logits:
            logits.append(row.clone())
        ids.append(int(torch.argmax(row)))
    return ids[len(prompt_ids):], seconds, logits


@torch.inference_mode()
def _greedy_with_cache(model: Transformer, prompt_ids: list, n_tokens: int, keep_logits: bool):
    """Prefill the prompt into a contiguous cache (the pool with one block of max_seq_len), then feed
    one token per step: each step writes its K/V at slot = position and reads the rest back."""
    cfg = model.config
    dtype = next(model.parameters()).dtype
    kv = KVCache(cfg, num_blocks=1, block_size=cfg.max_seq_len, dtype=dtype)
    table = torch.zeros(1, 1, dtype=torch.long)                          # (B=1, M=1): block 0
    ids, seconds, logits = list(prompt_ids), [], []
    new = list(prompt_ids)                                               # tokens not yet in the cache
    for _ in range(n_tokens):
        start = len(ids) - len(new)
        positions = torch.arange(start, len(ids))[None]                  # (1, T)
        t0 = time.perf_counter()
        attn = AttentionMetadata.build(positions, table, torch.tensor([len(ids)]), cfg.max_seq_len)
        row = model(torch.tensor([new]), positions, kv, attn, last_index=torch.tensor([len(new) - 1]))[0, -1]  # (V,)
        seconds.append(time.perf_counter() - t0)
        if keep_logits:
            logits.append(row.clone())
        nxt = int(torch.argmax(row))
        ids.append(nxt)
        new = [nxt]
    return ids[len(prompt_ids):], seconds, logits


def _timed_runs(run, method: str, model: Transformer, prompt_ids, n_tokens: int, repeats: int,
                keep_logits: bool, threads: Optional[int]) -> DecodeTiming:
    prompt_ids = [BOS] if prompt_ids is None else list(prompt_ids)
    _check_length(model, prompt_ids, n_tokens)
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    with torch_threads(threads):
        run(model, prompt_ids, min(4, n_tokens), False)                  # warm-up
        runs = [run(model, prompt_ids, n_tokens, keep_logits and r == 0) for r in range(repeats)]
    token_ids, _, logits = runs[0]
    per_token = [statistics.median(r[1][i] for r in runs) for i in range(n_tokens)]
    P = len(prompt_ids)
    return DecodeTiming(method, P, [P + i for i in range(n_tokens)], per_token, token_ids,
                        torch.stack(logits) if keep_logits else None, repeats, threads)


def time_per_token_with_cache(model: Transformer, n_tokens: int, prompt_ids=None, repeats: int = 3,
                              keep_logits: bool = False, threads: Optional[int] = 1) -> DecodeTiming:
    """Greedy generation through the KV pool: one new token per model call, so the cost per token
    stays nearly flat as the context grows (only attention's read of the cache grows)."""
    return _timed_runs(_greedy_with_cache, "kv cache", model, prompt_ids, n_tokens, repeats, keep_logits, threads)


def time_per_token_without_cache(model: Transformer, n_tokens: int, prompt_ids=None, repeats: int = 3,
                                 keep_logits: bool = False, threads: Optional[int] = 1) -> DecodeTiming:
    """Greedy generation recomputing the whole prefix at each step: the cost per token grows linearly
    with the context, so the total for n tokens grows quadratically."""
    return _timed_runs(_greedy_no_cache, "no cache", model, prompt_ids, n_tokens, repeats, keep_logits, threads)


# ---------------------------------------------------------------------------- prefill vs decode
@dataclass
class PrefillDecode:
    """The same n tokens written into the cache two ways: one prefill call, or n decode calls."""
    n_tokens: int
    prefill_seconds: float       # one model call over all n tokens (median over repeats)
    decode_seconds: float        # n model calls of one token each (median over repeats)
    speedup_range: tuple = ()    # prefill's speed-up per token over decode, min and max over the rounds

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.n_tokens / self.prefill_seconds

    @property
    def decode_tokens_per_s(self) -> float:
        return self.n_tokens / self.decode_seconds


@torch.inference_mode()
def prefill_vs_decode(model: Transformer, n_tokens: int = 64, repeats: int = 3, seed: int = 0,
                      threads: Optional[int] = 1) -> PrefillDecode:
    """Prefill processes the prompt's tokens in one batched call (big matmuls, compute-bound); decode
    must run one call per token (each call re-reads every weight for a single token: memory-bound)."""
    cfg = model.config
    if not 1 <= n_tokens <= cfg.max_seq_len:
        raise ValueError(f"n_tokens must be in [1, max_seq_len={cfg.max_seq_len}], got {n_tokens}")
    dtype = next(model.parameters()).dtype
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (1, n_tokens), generator=g)   # (1, T)
    kv = KVCache(cfg, num_blocks=1, block_size=cfg.max_seq_len, dtype=dtype)
    table = torch.zeros(1, 1, dtype=torch.long)

    def prefill():
        positions = torch.arange(n_tokens)[None]                            # (1, T)
        attn = AttentionMetadata.build(positions, table, torch.tensor([n_tokens]), cfg.max_seq_len)
        model(tokens, positions, kv, attn, last_index=torch.tensor([n_tokens - 1]))

    def decode():
        for p in range(n_tokens):
            positions = torch.tensor([[p]])                                  # (1, 1)
            attn = AttentionMetadata.build(positions, table, torch.tensor([p + 1]), cfg.max_seq_len)
            model(tokens[:, p:p + 1], positions, kv, attn)

    with torch_threads(threads):                                            # warmed, then rounds taking turns
        t = interleaved({"prefill": prefill, "decode": decode}, repeats=repeats, warmup=1)
    return PrefillDecode(n_tokens, t.median("prefill"), t.median("decode"), t.speedup("prefill", "decode")[1:])


# ---------------------------------------------------------------------------- KV-cache bytes
@dataclass
class KVBytes:
    """Bytes of K and V for n_tokens tokens: 2 (K and V) x layers x Hkv x D x bytes per element each."""
    label: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_tokens: int
    bytes_per_elem: int
    formula: int                 # n_tokens * ModelConfig.kv_bytes_per_token
    measured: int                # KVCache(...).nbytes: what the pool actually allocated

    @property
    def per_token(self) -> int:
        return self.formula // self.n_tokens


def kv_cache_bytes(cfg: ModelConfig, n_tokens: int, dtype=torch.float32, label: str = "") -> KVBytes:
    """Allocate a contiguous cache of n_tokens (one block of n_tokens) and count its bytes."""
    elem = torch.finfo(dtype).bits // 8
    kv = KVCache(cfg, num_blocks=1, block_size=n_tokens, dtype=dtype)
    measured = kv.nbytes
    del kv
    return KVBytes(label, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, n_tokens, elem,
                   n_tokens * cfg.kv_bytes_per_token(elem), measured)


def kv_bytes_by_preset(names=("tiny", "shakespeare", "stories15M"), n_tokens: Optional[int] = None,
                       dtype=torch.float32) -> list:
    """One KVBytes per named shape, at n_tokens (default: each model's full context)."""
    out = []
    for name in names:
        cfg = ModelConfig.from_name(name)
        out.append(kv_cache_bytes(cfg, n_tokens or cfg.max_seq_len, dtype, label=name))
    return out


def mha_vs_gqa(preset: str = "shakespeare", n_tokens: int = 1024, kv_heads=None, dtype=torch.float32) -> list:
    """Same dim, layers and query heads; only n_kv_heads varies: H (MHA), divisors in between (GQA),
    1 (MQA). Default kv_heads: every divisor of n_heads, largest first."""
    base = ModelConfig.from_name(preset)
    H = base.n_heads
    kv_heads = kv_heads or [h for h in range(H, 0, -1) if H % h == 0]
    out = []
    for hkv in kv_heads:
        cfg = ModelConfig.from_name(preset, n_kv_heads=hkv)
        kind = "MHA" if hkv == H else ("MQA" if hkv == 1 else "GQA")
        out.append(kv_cache_bytes(cfg, n_tokens, dtype, label=f"{kind} Hkv={hkv}"))
    return out


def kv_bytes_vs_length(cfg: ModelConfig, lengths, dtype=torch.float32) -> list:
    """Measured bytes of a contiguous cache for each length: a straight line through the origin."""
    return [kv_cache_bytes(cfg, n, dtype).measured for n in lengths]


def greedy_agreement(a: DecodeTiming, b: DecodeTiming, margin: float = 1e-4) -> dict:
    """Compare two greedy runs kept with keep_logits=True (DESIGN.md rule 7): float32 sums in a
    different order, so compare tokens only up to the first step where a's top-2 logit margin is below
    `margin` (a near-tie either run may break its own way), and say how many steps that was."""
    if a.logits is None or b.logits is None:
        raise ValueError("greedy_agreement needs both runs made with keep_logits=True")
    n = min(len(a.token_ids), len(b.token_ids))
    top2 = torch.topk(a.logits[:n].float(), 2, dim=-1).values                 # (n, 2)
    close = ((top2[:, 0] - top2[:, 1]) < margin).nonzero()
    steps = int(close[0]) if len(close) else n
    return {"steps_compared": steps, "steps_total": n,
            "tokens_equal": a.token_ids[:steps] == b.token_ids[:steps],
            "max_abs_logit_diff": float((a.logits[:steps] - b.logits[:steps]).abs().max()) if steps else 0.0}


# ---------------------------------------------------------------------------- where a forward pass goes
@dataclass
class ForwardBreakdown:
    """Parameters and measured seconds of one forward pass over n_tokens, by kind of op."""
    n_tokens: int
    params: dict                 # part -> parameters it owns (the tied classifier owns none)
    seconds: dict                # part -> seconds, summed over layers (median over repeats)
    total_seconds: float         # the whole forward, timed around model(tokens)
    tied_classifier: bool


PARTS = ("embedding", "rmsnorm", "attention", "feed-forward", "classifier")


@torch.inference_mode()
def forward_breakdown(model: Transformer, n_tokens: int = 64, repeats: int = 3, seed: int = 0,
                      threads: Optional[int] = 1) -> ForwardBreakdown:
    """Time each part of the forward with module hooks (perf_counter before and after each call);
    attention includes its q/k/v/o projections, RoPE and softmax(q k^T) v."""
    cfg = model.config
    if not 1 <= n_tokens <= cfg.max_seq_len:
        raise ValueError(f"n_tokens must be in [1, max_seq_len={cfg.max_seq_len}], got {n_tokens}")
    part_of = {model.tok_embeddings: "embedding", model.norm: "rmsnorm", model.output: "classifier"}
    for layer in model.layers:
        part_of.update({layer.attention_norm: "rmsnorm", layer.ffn_norm: "rmsnorm",
                        layer.attention: "attention", layer.feed_forward: "feed-forward"})
    tied = model.output.weight is model.tok_embeddings.weight
    params = dict.fromkeys(PARTS, 0)
    for module, part in part_of.items():
        if not (tied and module is model.output):
            params[part] += sum(p.numel() for p in module.parameters())
    clock: dict = {}
    started: dict = {}

    def pre(module, args):
        started[module] = time.perf_counter()

    def post(module, args, out):
        part = part_of[module]
        clock[part] = clock.get(part, 0.0) + time.perf_counter() - started[module]

    handles = [m.register_forward_pre_hook(pre) for m in part_of] + [m.register_forward_hook(post) for m in part_of]
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (1, n_tokens), generator=g)     # (1, T)
    runs, totals = [], []
    try:
        with torch_threads(threads):
            model(tokens)                                                     # warm-up
            for _ in range(repeats):
                clock.clear()
                t0 = time.perf_counter()
                model(tokens)                                                 # (1, T, V)
                totals.append(time.perf_counter() - t0)
                runs.append(dict(clock))
    finally:
        for h in handles:
            h.remove()
    seconds = {p: statistics.median(r.get(p, 0.0) for r in runs) for p in PARTS}
    return ForwardBreakdown(n_tokens, params, seconds, statistics.median(totals), tied)
