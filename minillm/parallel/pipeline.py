"""Pipeline parallelism (GPipe, Huang et al. 2019): the layers split into p stages, one a rank, micro-batches in flight.

    stage 0 (rank 0)      embedding, layers [0, L/p)         -> send the activations (b, T, C) to stage 1
    stage s               layers [s L/p, (s+1) L/p)          -> send them on
    stage p - 1           the last layers, norm, classifier  -> send the logit rows (n, V) back to rank 0

The batch's rows are split into m micro-batches. Stage 0 computes micro-batch i and hands it to gloo (isend: the
bytes move on gloo's thread) while it computes micro-batch i + 1, so after the first micro-batch the stages work
at once. With equal stages a step lasts (m + p - 1) micro-batch times and each stage idles (p - 1) of them, the
bubble (p - 1) / (m + p - 1) (minillm.parallel.timeline measures it from the ranks' events).

Each stage runs the model's own Block modules (copies, with their layer ids counted from the stage's first layer
so that they index its own KV pool), so the summation order is unchanged: the logits are bit for bit those of one
rank running the same micro-batches. (Splitting a batch is not free in float32: a matmul of a single row may take
another path from a matmul of several, so one-token micro-batches can differ from the unsplit batch in the last
bits; whole prompts do not, on this CPU.) Each stage's KV pool holds its own layers, every KV head.
"""
from __future__ import annotations

import copy
from types import SimpleNamespace

import torch

from ..llama.attention import AttentionMetadata
from ..llama.kv_cache import KVCache
from .rope import RopeTables

LOGITS_TAG = 1 << 20          # tags: micro-batch i's activations use i, its logits LOGITS_TAG + i


def stage_layers(n_layers: int, p: int) -> list:
    """[(first, end)] layers of each stage, as even as possible (earlier stages take the remainder: the last one
    also runs the classifier)."""
    if p > n_layers:
        raise ValueError(f"pipeline_parallel_size={p} is more than the model's n_layers={n_layers}: every stage "
                         f"needs at least one layer")
    out, lo = [], 0
    for s in range(p):
        n = n_layers // p + (s < n_layers % p)
        out.append((lo, lo + n))
        lo += n
    return out


def stage_modules(model, p: int, s: int) -> dict:
    """Stage s's modules: copies of the model's blocks (layer ids renumbered from 0 for the stage's KV pool), plus
    the embedding (stage 0) or the final norm and classifier (the last stage)."""
    lo, hi = stage_layers(model.config.n_layers, p)[s]
    blocks = []
    for i in range(lo, hi):
        blk = copy.deepcopy(model.layers[i])
        blk.attention.layer_id = i - lo
        blocks.append(blk.eval())
    mods = {"layers": (lo, hi), "blocks": blocks}
    if s == 0:
        mods["embedding"] = copy.deepcopy(model.tok_embeddings)
    if s == p - 1:
        mods["norm"], mods["output"] = copy.deepcopy(model.norm), copy.deepcopy(model.output)
    return mods


def micro_batches(B: int, m: int) -> list:
    """[(b0, b1)]: B rows in min(m, B) micro-batches as even as possible."""
    m = max(1, min(m, B))
    out, b0 = [], 0
    for i in range(m):
        b1 = b0 + B // m + (i < B % m)
        out.append((b0, b1))
        b0 = b1
    return out


class Stage:
    """Rank s's stage, and its KV pool: run() is the GPipe schedule from this rank's side."""

    def __init__(self, cfg, p: int, s: int, mods: dict, kv_spec: tuple | None = None):
        self.cfg, self.p, self.s = cfg, p, s
        self.blocks, self.layers = mods["blocks"], mods["layers"]
        self.embedding, self.norm, self.output = mods.get("embedding"), mods.get("norm"), mods.get("output")
        self.dtype = next(self.blocks[0].parameters()).dtype
        self.rope = RopeTables(cfg, self.dtype)
        self.kv = None
        if kv_spec is not None:                      # (num_blocks, block_size, dtype): this stage's layers
            num_blocks, block_size, kv_dtype = kv_spec
            shape = SimpleNamespace(n_layers=len(self.blocks), n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim)
            self.kv = KVCache(shape, num_blocks, block_size, kv_dtype)

    @torch.inference_mode()
    def run(self, comm, tokens, positions, attn=None, rows=None, m: int = 1):
        """Every stage calls this with the same broadcast inputs. -> logits on rank 0 ((N, V), or (B, T, V) without
        rows), None on the other ranks."""
        B, T = tokens.shape
        first, last = self.s == 0, self.s == self.p - 1
        parts = [_micro(tokens, positions, attn, rows, T, b0, b1) for b0, b1 in micro_batches(B, m)]
        recvs, sends, span = [], [], comm.timeline.span
        if first and not last:                        # post every logits receive up front
            for i, mb in enumerate(parts):
                shape = (len(mb.rows), self.cfg.vocab_size) if rows is not None else (mb.B, T, self.cfg.vocab_size)
                mb.logits = torch.empty(shape, dtype=self.dtype)
                recvs.append(comm.irecv(mb.logits, self.p - 1, LOGITS_TAG + i))
        for i, mb in enumerate(parts):
            if first:
                x = None
            else:
                x = comm.recv(torch.empty(mb.B, T, self.cfg.dim, dtype=self.dtype), self.s - 1, i)   # (b, T, C)
            with span("compute", f"micro-batch {i}"):
                y = self._forward(mb, x)              # (b, T, C) activations, or the logits on the last stage
            if last and first:
                mb.logits = y
            elif last:
                sends.append(comm.isend(y.contiguous(), 0, LOGITS_TAG + i))
            else:
                sends.append(comm.isend(y, self.s + 1, i))
        for w in sends + recvs:
            w.wait()
        if not first:
            return None
        if rows is None:
            return torch.cat([mb.logits for mb in parts])                       # (B, T, V)
        out = torch.empty(len(rows), self.cfg.vocab_size, dtype=self.dtype)     # (N, V)
        for mb in parts:
            out[mb.index] = mb.logits
        return out

    def _forward(self, mb, x):
        """The model's forward (minillm.llama.transformer.Transformer.forward) over this stage's layers."""
        if x is None:
            x = self.embedding(mb.tokens)                                       # (b, T, C)
        cos, sin = self.rope(mb.positions)                                      # (b, T, D/2) each
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        kv = self.kv if mb.attn is not None else None
        for blk in self.blocks:
            x = blk(x, cos, sin, kv, mb.attn)                                   # (b, T, C)
        if self.output is None:
            return x
        if mb.rows is not None:
            x = x.reshape(-1, x.shape[-1])[mb.rows]                             # (n, C)
        return self.output(self.norm(x))                                        # (n, V) or (b, T, V)


def _micro(tokens, positions, attn, rows, T: int, b0: int, b1: int):
    """Rows b0 .. b1 - 1 of the step's inputs; rows (flat indices b T + t) kept with their place in the output."""
    mb = SimpleNamespace(B=b1 - b0, tokens=tokens[b0:b1], positions=positions[b0:b1], attn=None, rows=None,
                         index=None, logits=None)
    if attn is not None:
        mb.attn = AttentionMetadata(attn.slot_mapping[b0:b1], attn.block_tables[b0:b1], attn.context_lens[b0:b1],
                                    attn.positions[b0:b1])
    if rows is not None:
        mb.index = torch.nonzero((rows >= b0 * T) & (rows < b1 * T)).flatten()   # (n,) places in the output
        mb.rows = rows[mb.index] - b0 * T                                        # (n,) flat indices in the micro-batch
    return mb
