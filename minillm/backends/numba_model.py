"""The numba backend: the whole transformer forward on minillm.kernels' CPU twins, in one compiled call.

`NumbaTransformer(model)` is a drop-in for `Transformer` in the engine (same forward signature, same
KV pool, which it reads and writes in place through numpy views). Like llama2.c's run.c `forward()`,
one compiled function runs every layer: embedding, RMSNorm, q/k/v, RoPE, K/V written to their slots,
attention through the block tables, output projection, fused residual-add + RMSNorm, SwiGLU MLP,
classifier. Matmuls split output rows across threads (run.c's `omp parallel for`).

Every query token is its own row: row r sees the cached positions 0..its own cache position (the causal rule
of minillm.llama.attention, for prefill, chunks, decodes and speculative chains alike), or, for Medusa's tree
of candidates, the cached positions and its ancestors among the new tokens. The matmuls are blocked
(minillm.kernels.matmul.linear_cpu): a weight tile is read once for all rows of the step, so the 1 + k rows of
a verification cost little more than one. Each output element is summed in a fixed order, so a sequence's
logits are the same bit for bit whatever else shares its batch (tests/test_numba_backend.py shows it); the
torch backend does not promise that.
"""
from __future__ import annotations

import functools
import time
import weakref

import numba
import numpy as np
import torch
import torch.nn as nn
from numba.core.errors import NumbaError

from ..kernels.rmsnorm import add_rmsnorm_rows, rmsnorm_rows
from ..kernels.rope import rope_rows
from ..kernels.swiglu import swiglu_packed_rows
from ..llama.transformer import Transformer
from .compile_cache import cached, compile_error, compile_errors
from .numba_kv import kv_attend, kv_write
from .numba_linears import fuse, layer, linear, out_features, stack


@cached   # on disk, keyed on every kernel source (minillm.backends.compile_cache): numba's own key is this file
def forward_rows(tokens, rope_pos, slots, tables, ends, starts, visible, last, emb, rms_att, wqkv, bqkv, qkn, wo,
                rms_ffn, w13, w2, rms_final, wcls, cos, sin, k_cache, v_cache, k_scale, v_scale, n_heads, eps):
    """tokens, rope_pos, slots (R,) int64 (slot -1: padding, not written); tables (R, M) int64, each row's
    sequence's block table; row r attends to its sequence's cached positions 0 .. ends[r] - 1, except that
    with a tree (visible (R, T), else (R, 0)) it sees new token u, at position starts[r] + u, only where
    visible[r, u]; last (N,) the rows whose logits are wanted; weights stacked by layer ((L, out, in)
    matrices, llama2.c's order), with wq|wk|wv and w1|w3 concatenated along `out` so each pair or triple is
    one pass over the input (vLLM's QKVParallelLinear and MergedColumnParallelLinear); bqkv (L, H*D + 2*Hkv*D)
    the q|k|v biases (Qwen2) or (L, 0); qkn (L, 2, D) the q and k RMSNorm weights per head (Qwen3) or (L, 2, 0);
    k_cache, v_cache (L, NB, BS, Hkv, D) float32, or int8 with k_scale, v_scale (L, NB, BS, Hkv) (numba_kv)
    -> logits (N, V), final-normed hidden states (N, C)."""
    R, C = tokens.shape[0], emb.shape[1]
    L, F = rms_ffn.shape[0], out_features(w13) // 2
    Hkv, D = k_cache.shape[3], k_cache.shape[4]
    HD, KVD = n_heads * D, Hkv * D
    x = np.empty((R, C), np.float32)                    # (R, C) the residual stream
    for r in range(R):
        x[r] = emb[tokens[r]]
    xb = np.empty((R, C), np.float32)                   # (R, C) normalised input of a sublayer
    out = np.empty((R, C), np.float32)                  # (R, C) a sublayer's output
    qkv = np.empty((R, HD + 2 * KVD), np.float32)       # (R, H*D + 2*Hkv*D)
    att = np.empty((R, HD), np.float32)                 # (R, H*D)
    h13 = np.empty((R, 2 * F), np.float32)              # (R, 2F) gate | up
    act = np.empty((R, F), np.float32)                  # (R, F) silu(gate) * up
    rmsnorm_rows(x, rms_att[0], eps, xb)
    for li in range(L):
        linear(xb, layer(wqkv, li), qkv)
        if bqkv.shape[1]:                               # Qwen2's q, k, v biases
            for r in range(R):
                qkv[r] += bqkv[li]
        q = np.ascontiguousarray(qkv[:, :HD])           # (R, H*D)
        k = np.ascontiguousarray(qkv[:, HD:HD + KVD])   # (R, Hkv*D)
        v = qkv[:, HD + KVD:]                           # (R, Hkv*D), only read row by row
        if qkn.shape[2]:                                # Qwen3: each head of q and k RMS-normed, before RoPE
            rmsnorm_rows(q.reshape(R * n_heads, D), qkn[li, 0], eps, q.reshape(R * n_heads, D))
            rmsnorm_rows(k.reshape(R * Hkv, D), qkn[li, 1], eps, k.reshape(R * Hkv, D))
        rope_rows(q.reshape(R, n_heads, D), rope_pos, cos, sin)
        rope_rows(k.reshape(R, Hkv, D), rope_pos, cos, sin)
        # every row's K/V are in the pool before anyone reads (q, k, v as (R, heads, D) views)
        kv_write(k_cache[li], k_scale[li], k.reshape(R, Hkv, D), slots)
        kv_write(v_cache[li], v_scale[li], np.ascontiguousarray(v).reshape(R, Hkv, D), slots)
        kv_attend(q.reshape(R, n_heads, D), k_cache[li], v_cache[li], k_scale[li], v_scale[li], tables, ends, starts,
                  visible, att.reshape(R, n_heads, D))
        linear(att, layer(wo, li), out)
        add_rmsnorm_rows(out, x, rms_ffn[li], eps, xb)  # x += attention; xb = rmsnorm(x)
        linear(xb, layer(w13, li), h13)
        swiglu_packed_rows(h13, act)                    # act = silu(h13[:, :F]) * h13[:, F:]
        linear(act, layer(w2, li), out)
        add_rmsnorm_rows(out, x, rms_att[li + 1] if li + 1 < L else rms_final, eps, xb)  # x += mlp; next norm
    xl = np.empty((last.shape[0], C), np.float32)       # (N, C) only the rows whose next token is wanted
    for b in range(last.shape[0]):
        xl[b] = xb[last[b]]
    logits = np.empty((last.shape[0], out_features(wcls)), np.float32)  # (N, V)
    linear(xl, wcls, logits)
    return logits, xl


@cached
def forward_batch(tokens, rope_pos, slots, tables, cache_pos, context_lens, visible, last, emb, rms_att, wqkv, bqkv,
                  qkn, wo, rms_ffn, w13, w2, rms_final, wcls, cos, sin, k_cache, v_cache, k_scale, v_scale, n_heads,
                  eps):
    """forward_rows from the engine's step as it is: tokens, rope_pos, slots, cache_pos (B, T), tables (B, M),
    context_lens (B,), as AttentionMetadata holds them. Each of the B * T query tokens becomes a row here, in
    compiled code: row b * T + t sees its sequence's positions 0 .. min(cache_pos[b, t] + 1, context_lens[b]) - 1
    (padding past a short row's tokens sees no more than the row), the step's new tokens start at cache_pos[b, 0],
    and it reads row b's block table. (Built in Python with numpy, this metadata cost more than the batch-1 step's
    RMSNorms and RoPE together.)"""
    B, T = tokens.shape
    R, M = B * T, tables.shape[1]
    ends, starts = np.empty(R, np.int64), np.empty(R, np.int64)      # (R,) each row's positions seen, first new
    row_tables = np.empty((R, M), np.int64)                          # (R, M) each row's sequence's block table
    for r in range(R):
        b, t = r // T, r % T
        ends[r] = min(cache_pos[b, t] + 1, context_lens[b])
        starts[r] = cache_pos[b, 0]
        row_tables[r] = tables[b]
    return forward_rows(tokens.reshape(R), rope_pos.reshape(R), slots.reshape(R), row_tables, ends, starts, visible,
                        last, emb, rms_att, wqkv, bqkv, qkn, wo, rms_ffn, w13, w2, rms_final, wcls, cos, sin, k_cache,
                        v_cache, k_scale, v_scale, n_heads, eps)


@cached
def decode_one(token, pos, emb, rms_att, wqkv, bqkv, qkn, wo, rms_ffn, w13, w2, rms_final, wcls, cos, sin, k_cache,
               v_cache, k_scale, v_scale, n_heads, eps):
    """One batch-1 decode step on the contiguous cache (one block of max_seq_len slots: position = slot), with
    its metadata built here and the greedy choice made here: llama2.c's loop body, with no Python in between.
    -> (logits (V,), argmax). The same forward_rows, so the same bits as any other batch."""
    one = np.full(1, pos, np.int64)                      # (1,) RoPE position = slot = pos
    logits, _ = forward_rows(np.full(1, token, np.int64), one, one, np.zeros((1, 1), np.int64), one + 1, one,
                             np.zeros((1, 0), np.bool_), np.zeros(1, np.int64), emb, rms_att, wqkv, bqkv, qkn, wo,
                             rms_ffn, w13, w2, rms_final, wcls, cos, sin, k_cache, v_cache, k_scale, v_scale, n_heads,
                             eps)
    return logits[0], np.argmax(logits[0])


def qkv_bias(a) -> np.ndarray:
    """An Attention's q|k|v biases (Qwen2) as one (H*D + 2*Hkv*D,) float32 array; (0,) without them."""
    if not isinstance(a.q_bias, nn.Identity):
        return torch.cat([a.q_bias.bias, a.k_bias.bias, a.v_bias.bias]).detach().float().numpy()
    return np.zeros(0, np.float32)


def qk_norms(a) -> np.ndarray:
    """An Attention's per-head q and k RMSNorm weights (Qwen3) as (2, D) float32; (2, 0) without them."""
    if not isinstance(a.q_norm, nn.Identity):
        return torch.stack([a.q_norm.weight, a.k_norm.weight]).detach().float().numpy()
    return np.zeros((2, 0), np.float32)


@functools.lru_cache(maxsize=64)
def chain_mask(rows: int) -> np.ndarray:
    """The (rows, 0) tree mask of a step without a tree (made once per size: never written)."""
    return np.zeros((rows, 0), np.bool_)


def ints(t) -> np.ndarray:
    """A torch tensor, array or list of indices as the compiled forward takes them: contiguous int64 numpy
    (a view, when it already is one; the runner's arrays as they are)."""
    if type(t) is np.ndarray and t.dtype == np.int64 and t.flags.c_contiguous:
        return t
    return np.ascontiguousarray(t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t), dtype=np.int64)


_POOLS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # KVCache -> its pools(), made once


def pools(kv) -> tuple:
    """A KVCache's pools as forward_rows takes them: (k, v, k_scale, v_scale) numpy views, float or int8. Made once
    per cache (its tensors are written in place, never replaced), since each view is a torch call every step."""
    if kv not in _POOLS:
        empty = np.zeros((kv.k.shape[0], 0, 0, 0), np.float32)        # (L, 0, 0, 0): indexable by layer
        scales = (kv.k_scale.numpy(), kv.v_scale.numpy()) if kv.quantized else (empty, empty)
        _POOLS[kv] = (kv.k.numpy(), kv.v.numpy(), *scales)
    return _POOLS[kv]


class NumbaTransformer(nn.Module):
    """Runs `model`'s weights through forward_rows. The weights are copied once into llama2.c's
    layer-stacked layout (one (L, out, in) weight per matrix kind, q|k|v and w1|w3 fused), float32 or quantized
    (int8, int4, Q8_0, W8A8: minillm.backends.numba_linears). The engine's runner hands it numpy index arrays
    as it builds them (index_arrays: no torch tensors made, none read back)."""
    index_arrays = staticmethod(tuple)

    def __init__(self, model: Transformer):
        super().__init__()
        dtype = next(model.parameters()).dtype
        if dtype != torch.float32:
            raise ValueError(f"backend='numba' runs float32 weights, got {dtype}; use dtype='float32'")
        self.model, self.config = model, model.config
        layers = model.layers
        numba.get_num_threads()   # launches numba's thread pool: a forward loaded from the disk cache calls into it

        def norms(f):
            return np.ascontiguousarray(torch.stack([f(b).detach() for b in layers]).numpy())
        self.w = dict(
            emb=model.tok_embeddings.weight.detach().numpy(),
            rms_att=norms(lambda b: b.attention_norm.weight),
            wqkv=stack([fuse([b.attention.wq, b.attention.wk, b.attention.wv]) for b in layers]),
            wo=stack([fuse([b.attention.wo]) for b in layers]), rms_ffn=norms(lambda b: b.ffn_norm.weight),
            w13=stack([fuse([b.feed_forward.w1, b.feed_forward.w3]) for b in layers]),
            w2=stack([fuse([b.feed_forward.w2]) for b in layers]), rms_final=model.norm.weight.detach().numpy(),
            wcls=fuse([model.output]),
            cos=model.rope_cos.float().numpy(), sin=model.rope_sin.float().numpy(),   # (S, D/2) ensure_rope'd
            bqkv=np.ascontiguousarray(np.stack([qkv_bias(b.attention) for b in layers])),   # (L, HD + 2 KVD) or (L, 0)
            qkn=np.ascontiguousarray(np.stack([qk_norms(b.attention) for b in layers])))     # (L, 2, D) or (L, 2, 0)
        self.timing = [0.0, 0]   # seconds inside the compiled forward, calls (bench's profile): a list, since
                                 # nn.Module's __setattr__ costs a microsecond a write
        self._weights = tuple(self.w[k] for k in ("emb", "rms_att", "wqkv", "bqkv", "qkn", "wo", "rms_ffn", "w13", "w2",
                                                  "rms_final", "wcls", "cos", "sin"))   # decode_one's, in order

    def decode_step(self, token: int, pos: int, kv) -> tuple[np.ndarray, int]:
        """The common case in one compiled call: batch 1, the contiguous cache (`run`'s decode loop, llama2.c's
        shape), greedy choice included -> (logits (V,) numpy, argmax). The caller sets the threads (torch's to 1)."""
        if pos >= self.config.max_seq_len:
            raise ValueError(f"position {pos} is beyond the model's context max_seq_len={self.config.max_seq_len}")
        if kv.num_blocks != 1 or kv.block_size < pos + 1:
            raise ValueError("decode_step runs on the contiguous cache: one block of max_seq_len slots")
        t0 = time.perf_counter()
        with compile_errors("decode_one", self._weights):
            logits, best = decode_one(token, pos, *self._weights, *pools(kv), self.config.n_heads,
                                      self.config.norm_eps)
        self.timing[0] += time.perf_counter() - t0
        self.timing[1] += 1
        return logits, int(best)

    @property
    def compiled_seconds(self) -> float:
        return self.timing[0]

    @compiled_seconds.setter
    def compiled_seconds(self, value: float):
        self.timing[0] = value

    @property
    def compiled_calls(self) -> int:
        return self.timing[1]

    @compiled_calls.setter
    def compiled_calls(self, value: int):
        self.timing[1] = value

    def forward(self, tokens, positions, kv=None, attn=None, rows=None, return_hidden: bool = False):
        """The serving interface of Transformer.forward: tokens, positions (B, T) (RoPE positions) -> logits
        (N, V) [, final-normed hidden states (N, C)] at the flat token indices `rows` (default: each row's last
        token): torch in, torch out; the runner's numpy index arrays in, numpy logits out. Causality follows the
        cache positions in attn (attn.positions), which differ from the RoPE positions for Medusa's tree (node i is
        cached at end + i but rotated at end + depth), and attn.tree_mask restricts which new tokens each sees."""
        if kv is None or attn is None:
            raise ValueError("backend='numba' serves from the KV cache: pass kv and AttentionMetadata")
        B, T = tokens.shape
        rope_at, limit = ints(positions), self.config.max_seq_len
        if rope_at.max() >= limit:
            raise ValueError(f"position {int(rope_at.max())} is beyond the model's context max_seq_len={limit}")
        last = np.arange(B) * T + T - 1 if rows is None else ints(rows)                   # (N,) rows wanted
        if attn.tree_mask is not None:
            visible = np.ascontiguousarray(attn.tree_mask.reshape(B * T, T).numpy())        # (B*T, T)
        else:
            visible = chain_mask(B * T)                                                      # a chain: ends say it all
        args = (ints(tokens), rope_at, ints(attn.slot_mapping), ints(attn.block_tables), ints(attn.positions),
                ints(attn.context_lens), visible, last)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)   # torch's OpenMP threads would spin against numba's between our calls
        t0 = time.perf_counter()
        try:
            logits, hidden = forward_batch(*args, *self._weights, *pools(kv), self.config.n_heads, self.config.norm_eps)
        except NumbaError as e:
            raise compile_error("forward_batch", args + self._weights, e) from e
        finally:
            torch.set_num_threads(threads)
        self.timing[0] += time.perf_counter() - t0
        self.timing[1] += 1
        if type(rows) is not np.ndarray:          # torch in, torch out; the runner's numpy rows: numpy logits
            logits = torch.from_numpy(logits)                                    # (N, V)
        if return_hidden:
            return logits, torch.from_numpy(hidden)                              # (N, V), (N, C)
        return logits                                                            # (N, V)
