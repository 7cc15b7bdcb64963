"""Rank 0's handle on a model spread over a rank group: the Transformer's forward signature, the KV pool's methods.

    tp = TensorParallelModel(model, 2)                # or PipelineParallelModel(model, 2, micro_batches=4)
    logits = tp(tokens, positions)                    # (B, T, V), as model(tokens, positions)
    logits = tp(tokens, positions, tp.kv, attn, rows=rows)   # the serving call (minillm.core.model_runner)

A forward: rank 0 checks the inputs, tells every worker "forward" (its command queue), broadcasts the inputs as one
int64 tensor (torch.distributed; counted by minillm.parallel.comm), and every rank runs its shard in step
(minillm.parallel.tensor, minillm.parallel.pipeline); rank 0 returns the full logits. The engine needs no change:
minillm.engine.parts hands it this model as its forward and `kv` (a ParallelKV) as its KV pool, whose block copies
are broadcast to every rank too; the scheduler runs on rank 0 only.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Optional, Union

import torch
import torch.nn as nn

from ..llama.attention import AttentionMetadata
from ..llama.kv_cache import KVCache
from ..llama.transformer import FeedForward
from .group import RankGroup, RankState, start_group
from .pipeline import Stage, stage_layers, stage_modules
from .tensor import TensorShard, check_tensor_parallel, split_weights

_ids = itertools.count()
SHARDS = {"tensor": TensorShard, "pipeline": Stage}


class ParallelModel:
    """A model whose shards live on every rank of a group; called as the Transformer is. Subclasses say how it is
    split (kind, check, shard_weights)."""
    kind = ""
    micro_batches = 1           # a pipeline's; one for tensor parallelism

    def __init__(self, model, group: Union[RankGroup, int] = 2, *, kv_blocks: Optional[int] = None,
                 block_size: int = 16, kv_dtype=None):
        """model: a Transformer; group: a RankGroup, or a size for start_group. kv_blocks: a paged KV pool of that
        many blocks of block_size tokens on every rank (each its share), reachable as .kv; None: no cache."""
        self.group = start_group(group) if isinstance(group, int) else group
        self.config, self.p = model.config, self.group.world
        self.dtype = next(model.parameters()).dtype
        self.device = "cpu"
        _check_linears(model, self.kind)
        self.check(model.config, self.p)
        kv_spec = (kv_blocks, block_size, kv_dtype or self.dtype) if kv_blocks else None
        payloads = [(model.config, self.p, r, self.shard_weights(model, r), kv_spec) for r in range(self.p)]
        self.id = next(_ids)
        kv_bytes = self.group.call(_install, self.id, self.kind, each=payloads)
        self.local = self.group.state.objects[self.id]
        self.kv = ParallelKV(self, kv_spec, sum(kv_bytes)) if kv_spec else None
        weakref.finalize(self, _release, weakref.ref(self.group), self.id).atexit = False

    # what a kind defines
    def check(self, cfg, p: int):
        """ValueError naming the value unless p ranks can split this model."""
        raise NotImplementedError

    def shard_weights(self, model, r: int):
        """What rank r's shard is built from (it travels to the rank)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the forward
    def __call__(self, tokens, positions=None, kv=None, attn: Optional[AttentionMetadata] = None, rows=None,
                 last_index=None, return_hidden: bool = False):
        """Transformer.forward's signature (minillm.llama.transformer): logits (B, T, V), (N, V) with rows,
        (B, 1, V) with last_index. kv: this model's .kv (or None: no cache)."""
        if return_hidden:
            raise ValueError("return_hidden: a parallel model returns logits only (Medusa reads hidden states: it "
                             "runs on one rank)")
        B, T = tokens.shape
        if positions is None:
            positions = torch.arange(T).expand(B, T)                              # (B, T)
        if last_index is not None:
            rows = torch.arange(B) * T + torch.as_tensor(last_index)              # (B,)
        self._check_inputs(tokens, positions, kv, attn, rows)
        shape, flat = pack(tokens, positions, attn if kv is not None else None, rows)
        g = self.group
        g.launch(_forward, self.id, shape, self.micro_batches)
        with g.closing_on_error("forward"):
            g.comm.begin_step()
            g.comm.broadcast(flat)
            out = _run(g.state.objects[self.id], g.comm, shape, flat, self.micro_batches)
        return out[:, None] if last_index is not None else out                    # (B, 1, V)

    forward = __call__

    def _check_inputs(self, tokens, positions, kv, attn, rows):
        """A mistake refused here, on rank 0, before any rank starts (a worker that fails closes the group)."""
        cfg = self.config
        if kv is not None and kv is not self.kv:
            raise ValueError("kv must be this model's own pool (.kv, a ParallelKV: each rank holds its share) or None")
        if kv is not None and attn is None:
            raise ValueError("a KV cache needs AttentionMetadata (slot_mapping, block_tables, context_lens)")
        if attn is not None and (attn.tree_mask is not None or attn.rope_on_read or attn.received is not None):
            raise ValueError("a parallel model runs plain causal attention over the paged cache: no tree mask "
                             "(Medusa), no kv_eviction")
        if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size:
            raise ValueError(f"token ids must be in [0, {cfg.vocab_size}), got "
                             f"{int(tokens.min())}..{int(tokens.max())}")
        if int(positions.min()) < 0 or int(positions.max()) >= cfg.max_seq_len:
            raise ValueError(f"position {int(positions.max())} is beyond the model's context "
                             f"max_seq_len={cfg.max_seq_len}")
        if rows is not None and len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= tokens.numel()):
            raise ValueError(f"rows must index the B*T={tokens.numel()} tokens, got "
                             f"{int(rows.min())}..{int(rows.max())}")
        if kv is not None and int(attn.block_tables.max()) >= kv.num_blocks:
            raise ValueError(f"block {int(attn.block_tables.max())} is beyond the pool's {kv.num_blocks} blocks")

    def close(self):
        """Free this model's shards on every rank (also when it is garbage-collected)."""
        _release(weakref.ref(self.group), self.id)


class TensorParallelModel(ParallelModel):
    """Megatron-style tensor parallelism over the group's ranks (minillm.parallel.tensor)."""
    kind = "tensor"

    def check(self, cfg, p: int):
        check_tensor_parallel(cfg, p)

    def shard_weights(self, model, r: int):
        return split_weights(model, self.p, r)


class PipelineParallelModel(ParallelModel):
    """GPipe over the group's ranks, one stage each (minillm.parallel.pipeline); micro_batches: rows per step split
    into that many micro-batches (at most one per row), settable between forwards."""
    kind = "pipeline"

    def __init__(self, model, group: Union[RankGroup, int] = 2, *, micro_batches: int = 1, **kv):
        if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches < 1:
            raise ValueError(f"micro_batches must be a whole number >= 1, got {micro_batches!r}")
        self.micro_batches = micro_batches
        super().__init__(model, group, **kv)

    def check(self, cfg, p: int):
        stage_layers(cfg.n_layers, p)

    def shard_weights(self, model, r: int):
        return stage_modules(model, self.p, r)


class ParallelKV:
    """The engine's KV pool when every rank holds a share: the same num_blocks, block ids and tables on every rank
    (the scheduler's block manager, on rank 0, serves them all); a block copy is broadcast and done on each rank.
    nbytes counts every rank's share. `local` is rank 0's own KVCache."""

    def __init__(self, model: ParallelModel, spec: tuple, nbytes: int):
        self.group, self.model_id, self.local = model.group, model.id, model.local.kv   # not the model: no cycle
        self.num_blocks, self.block_size = spec[0], spec[1]
        self.quantized, self.nbytes = spec[2] == torch.int8, nbytes

    def copy_blocks(self, pairs):
        """Copy whole blocks src -> dst in every layer on every rank (copy-on-write). pairs: [(src, dst)]."""
        if pairs:
            self._everywhere("copy_blocks", torch.tensor(pairs, dtype=torch.long))     # (P, 2)

    def move_slots(self, src, dst):
        if src:
            self._everywhere("move_slots", torch.tensor([src, dst], dtype=torch.long))  # (2, P)

    def _everywhere(self, op: str, t: torch.Tensor):
        g = self.group
        g.launch(_kv_op, self.model_id, op, tuple(t.shape))
        with g.closing_on_error(op):
            _kv_apply(g.state, self.model_id, op, g.comm.broadcast(t))

    def tensors(self) -> list:
        return self.local.tensors()

    def layer(self, i: int):
        return self.local.layer(i)


def for_engine(model, config, kv_dtype) -> ParallelModel:
    """The engine's forward when tensor_parallel_size or pipeline_parallel_size > 1 (minillm.engine.parts): the
    running rank group of that size (start_group), a pool of as many blocks as one rank's would have (so scheduling,
    and so the output, is the one-rank engine's), and for pipelines one micro-batch per stage."""
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    blocks = KVCache.engine_bytes(model.config, config, kv_dtype) // \
        (config.block_size * KVCache.bytes_per_token(model.config, kv_dtype))
    kv = dict(kv_blocks=blocks, block_size=config.block_size, kv_dtype=kv_dtype)
    if tp > 1:
        return TensorParallelModel(model, start_group(tp), **kv)
    return PipelineParallelModel(model, start_group(pp), micro_batches=pp, **kv)


def check_engine_options(config, model_config=None):
    """Sizes the model cannot be split by, and options a parallel engine does not run yet: refused by name (never
    silently ignored), before any rank starts."""
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if tp > 1 and pp > 1:
        raise ValueError(f"tensor_parallel_size={tp} with pipeline_parallel_size={pp}: one kind of parallelism at "
                         f"a time here (not both)")
    if model_config is not None and tp > 1:
        check_tensor_parallel(model_config, tp)
    elif model_config is not None:
        stage_layers(model_config.n_layers, pp)
    name = f"tensor_parallel_size={tp}" if tp > 1 else f"pipeline_parallel_size={pp}"
    for option, value, ok in (("speculative", config.speculative, None), ("quantization", config.quantization, None),
                              ("sparsity", config.sparsity, None), ("kv_eviction", config.kv_eviction, None),
                              ("enable_lora", config.enable_lora, False), ("preemption_mode", config.preemption_mode,
                                                                          "recompute")):
        if value != ok:
            raise ValueError(f"{name} does not combine with {option}={value!r} yet (minillm.parallel splits the "
                             f"float model's nn.Linear weights; its pools have no swap space)")


# ---------------------------------------------------------------------------- the inputs, as one int64 tensor
def pack(tokens, positions, attn: Optional[AttentionMetadata], rows) -> tuple:
    """-> (shape (B, T, M, N, has_kv), flat int64 tensor): tokens, positions (B, T); with a cache slot_mapping and
    cache positions (B, T), block_tables (B, M), context_lens (B,); rows (N,). N = -1: no rows."""
    B, T = tokens.shape
    parts = [tokens, positions]
    M = 0
    if attn is not None:
        M = attn.block_tables.shape[1]
        parts += [attn.slot_mapping, attn.positions, attn.block_tables, attn.context_lens]
    if rows is not None:
        parts.append(rows)
    flat = torch.cat([t.reshape(-1).to(torch.long) for t in parts])
    return (B, T, M, -1 if rows is None else len(rows), attn is not None), flat


def unpack(shape: tuple, flat: torch.Tensor) -> tuple:
    """pack's inverse -> (tokens, positions, attn or None, rows or None)."""
    B, T, M, N, has_kv = shape
    sizes = [B * T, B * T] + ([B * T, B * T, B * M, B] if has_kv else []) + ([N] if N >= 0 else [])
    parts = list(torch.split(flat, sizes))
    tokens, positions = parts[0].view(B, T), parts[1].view(B, T)                  # (B, T) each
    attn = None
    if has_kv:
        attn = AttentionMetadata(parts[2].view(B, T), parts[4].view(B, M), parts[5], parts[3].view(B, T))
    return tokens, positions, attn, (parts[-1] if N >= 0 else None)


def flat_size(shape: tuple) -> int:
    B, T, M, N, has_kv = shape
    return 2 * B * T + ((2 * B * T + B * M + B) if has_kv else 0) + max(N, 0)


# ---------------------------------------------------------------------------- what every rank runs
def _install(state: RankState, model_id: int, kind: str, payload: tuple) -> int:
    """Build this rank's shard (and its share of the KV pool). -> its KV bytes."""
    shard = SHARDS[kind](*(payload if state.rank == 0 else _own(payload)))
    state.objects[model_id] = shard
    return shard.kv.nbytes if shard.kv is not None else 0


def _own(x):
    """Weights that arrived through shared memory, copied into this process's own (each shared tensor would hold a
    file descriptor open for as long as it lives)."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, nn.Module):
        for t in itertools.chain(x.parameters(), x.buffers()):
            t.data = t.data.clone()
        return x
    if isinstance(x, dict):
        return {k: _own(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_own(v) for v in x)
    return x


def _forward(state: RankState, model_id: int, shape: tuple, micro_batches: int):
    """A worker's side of a forward: receive the inputs, run the shard (logits stay on rank 0)."""
    state.comm.begin_step()
    flat = state.comm.broadcast(torch.empty(flat_size(shape), dtype=torch.long))
    _run(state.objects[model_id], state.comm, shape, flat, micro_batches)


@torch.inference_mode()
def _run(shard, comm, shape: tuple, flat: torch.Tensor, micro_batches: int):
    tokens, positions, attn, rows = unpack(shape, flat)
    return shard.run(comm, tokens, positions, attn, rows, micro_batches)


def _kv_op(state: RankState, model_id: int, op: str, shape: tuple):
    _kv_apply(state, model_id, op, state.comm.broadcast(torch.empty(shape, dtype=torch.long)))


def _kv_apply(state: RankState, model_id: int, op: str, t: torch.Tensor):
    kv = state.objects[model_id].kv
    if op == "copy_blocks":
        kv.copy_blocks([tuple(pair) for pair in t.tolist()])
    else:
        kv.move_slots(t[0].tolist(), t[1].tolist())


def _drop(state: RankState, model_id: int):
    state.objects.pop(model_id, None)


def _release(group_ref, model_id: int):
    group = group_ref()
    if group is not None and not group.closed and model_id in group.state.objects:
        group.state.objects.pop(model_id, None)
        group.launch(_drop, model_id)


def _check_linears(model, kind: str):
    """The splits read plain nn.Linear weights and the SwiGLU FFN: a quantized, LoRA or MoE layer is refused."""
    for i, blk in enumerate(model.layers):
        a, f = blk.attention, blk.feed_forward
        mods = {"wq": a.wq, "wk": a.wk, "wv": a.wv, "wo": a.wo}
        if not isinstance(f, FeedForward):
            raise ValueError(f"{kind} parallelism splits the SwiGLU FFN; layer {i}'s is a {type(f).__name__}")
        mods.update(w1=f.w1, w2=f.w2, w3=f.w3)
        for name, m in mods.items():
            if type(m) is not nn.Linear:
                raise ValueError(f"{kind} parallelism splits nn.Linear weights; layer {i}'s {name} is a "
                                 f"{type(m).__name__}")
