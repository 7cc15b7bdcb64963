"""LoRA adapters, many served at once: a per-row adapter added to the linear op (DESIGN.md).

LoRA (Hu et al. 2021) fine-tunes a linear layer W (N, K) by a low-rank update, leaving W frozen:
    W' = W + s B A        A (r, K), B (N, r), r << min(N, K), s = alpha / r (alpha / sqrt(r) with rsLoRA)
so an adapter of rank 8 on all 7 linears of the shipped model is ~4% of its weights. One copy of the base weights
can then serve many adapters in one batch (S-LoRA, Sheng et al. 2023; Punica, Chen et al. 2023): each token row names
its adapter's slot, and the layer computes
    y = x W^T + s_a (x A_a^T) B_a^T          for the row's adapter a (nothing for slot -1)
never forming W + s B A. How the rows meet their adapters:
- grouped (what LoRALinear.forward does, S-LoRA's MBGMM on a CPU): the rows are grouped by slot once per
  forward (LoRAContext), and each adapter present runs two small matmuls on its own rows: gather x_g (M_a, K),
  h = x_g A_a^T (M_a, r), y[rows] += s_a h B_a^T (M_a, N). One pair of matmuls per adapter, not per row.
- BGMV (Punica's "batched gather matrix-vector", its decode kernel): every row gathers its own adapter's A and B
  and does one matrix-vector product with each, y_i += s B[a_i] (A[a_i] x_i): one kernel launch for the whole
  batch whatever the mix of adapters, which is what a GPU wants; on a CPU the gather copies an adapter's
  matrices once per row, so grouping wins. tests/test_lora.py holds it as the reference.
The slots are stacks, A (S, R, K) and B (S, N, R) with S = max_loras and R = max_lora_rank (vLLM's layout, B kept
transposed here); a slot of rank r < R uses its first r rows. The scaling s rides on the second matmul
(torch.addmm's alpha), so an adapter present costs two matmuls per layer and nothing else.

How the per-token slot index reaches the linears: the model owns a LoRAContext (model.lora_context), which the
model runner sets from each row's sequence for the length of one forward (`with ctx.use(slots): model(...)`) and
training sets to slot 0; the Transformer's forward signature stays as it was, and the numba and CUDA twins never
see it (enable_lora runs on torch only). It is not global state: one per model, cleared after each forward.

Sections: the adapter (LoRAAdapter, shapes), the op (LoRAContext, LoRALinear), wrapping and merging a model
(attach_lora, merge_lora), and the slots an engine keeps (LoRASlots: LRU, never evicting an adapter in use).
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import math
import os
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn as nn

from ..config import ModelConfig

# the linears an adapter may target, as module paths inside a Block (HF names in minillm.formats.peft)
MODULES = ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
           "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")


# ---------------------------------------------------------------------------- the adapter
@dataclass(eq=False)
class LoRAAdapter:
    """One adapter in memory, in this model's layout (wq/wk rows in llama2.c's RoPE pairs; PEFT files use HF's
    half-split rows: minillm.formats.peft converts). Equal weights give an equal digest, which names the adapter
    in the prefix cache (K/V computed under another adapter differ)."""
    name: str
    rank: int                            # r
    alpha: float
    weights: dict                        # (layer, module in MODULES) -> (A (r, K), B (N, r)) float32
    use_rslora: bool = False             # scaling alpha / sqrt(r) (Kalajdzievski 2023) instead of alpha / r
    base_model: str = ""                 # what it was trained on (PEFT's base_model_name_or_path)
    slot: int = field(default=-1)        # the engine slot it occupies now (LoRASlots), -1: none
    digest: bytes = field(default=b"", init=False)

    def __post_init__(self):
        h = hashlib.sha256(f"{self.rank} {self.scaling!r}".encode())
        for key in sorted(self.weights):
            a, b = self.weights[key]
            h.update(repr(key).encode())
            h.update(a.detach().float().contiguous().numpy().tobytes())
            h.update(b.detach().float().contiguous().numpy().tobytes())
        self.digest = h.digest()

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    @property
    def target_modules(self) -> list:
        return sorted({m for _, m in self.weights}, key=MODULES.index)

    @property
    def nbytes(self) -> int:
        """Bytes of its A and B as held (float32): what one more adapter costs, against a merged model copy."""
        return sum(t.numel() * t.element_size() for ab in self.weights.values() for t in ab)

    def __repr__(self):
        return (f"LoRAAdapter({self.name!r}, r={self.rank}, alpha={self.alpha:g}, {self.target_modules}, "
                f"slot={self.slot})")


def module_shapes(cfg: ModelConfig) -> dict:
    """(N, K) of each linear in MODULES for a model shape: output rows N, input columns K."""
    C, HD, Hd, kv = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.hidden_dim, cfg.kv_dim
    return {"attention.wq": (HD, C), "attention.wk": (kv, C), "attention.wv": (kv, C), "attention.wo": (C, HD),
            "feed_forward.w1": (Hd, C), "feed_forward.w2": (C, Hd), "feed_forward.w3": (Hd, C)}


def check_adapter(adapter: LoRAAdapter, cfg: ModelConfig, max_rank: Optional[int] = None,
                  label: Callable[[str], str] = lambda m: m.split(".")[-1]):
    """Shapes against the model (an adapter for another model names the first shape that differs), the rank against
    max_rank (EngineConfig.max_lora_rank) and against each layer's dims. label: how a module is named in messages
    (minillm.formats.peft passes HF's q_proj ...). ValueError, naming the value and the limit."""
    shapes, r = module_shapes(cfg), adapter.rank
    if not math.isfinite(adapter.alpha) or not abs(adapter.scaling) < torch.finfo(torch.float32).max:
        raise ValueError(f"LoRA adapter {adapter.name!r} has lora_alpha={adapter.alpha!r}: its scaling "
                         f"{adapter.scaling!r} is not a finite float32 (a corrupt or hostile adapter_config.json)")
    bad = [k for k, ab in sorted(adapter.weights.items()) if not all(bool(torch.isfinite(t).all()) for t in ab)]
    if bad:
        raise ValueError(f"LoRA adapter {adapter.name!r} has NaN or infinite weights in layer {bad[0][0]} "
                         f"{label(bad[0][1])} ({len(bad)} linears in all): refused, it would compute garbage")
    if max_rank is not None and r > max_rank:
        raise ValueError(f"LoRA adapter {adapter.name!r} has rank r={r}, more than max_lora_rank={max_rank}: raise "
                         f"max_lora_rank (an engine option) to at least {r}")
    unknown = sorted({m for _, m in adapter.weights} - set(shapes))
    if unknown:
        raise ValueError(f"LoRA adapter {adapter.name!r} targets {unknown}, not among {MODULES}")
    for (layer, module), (a, b) in sorted(adapter.weights.items(), key=lambda kv: (kv[0][0], MODULES.index(kv[0][1]))):
        if not 0 <= layer < cfg.n_layers:
            raise ValueError(f"LoRA adapter {adapter.name!r} has weights for layer {layer}, but this model has "
                             f"{cfg.n_layers} layers (0 .. {cfg.n_layers - 1}): an adapter for another model")
        N, K = shapes[module]
        name = label(module)
        if tuple(a.shape) != (r, K):
            raise ValueError(f"LoRA adapter {adapter.name!r}: layer {layer} {name} lora_A is {tuple(a.shape)} but "
                             f"this model's {name} has {K} inputs (lora_A should be ({r}, {K})): an adapter for "
                             f"another model")
        if tuple(b.shape) != (N, r):
            raise ValueError(f"LoRA adapter {adapter.name!r}: layer {layer} {name} lora_B is {tuple(b.shape)} but "
                             f"this model's {name} has {N} rows (lora_B should be ({N}, {r})): an adapter for "
                             f"another model")
        if r > min(N, K):
            raise ValueError(f"LoRA adapter {adapter.name!r} has rank r={r}, larger than layer {layer} {name} "
                             f"({N} x {K}): a rank above min(N, K) = {min(N, K)} is no longer low-rank")


# ---------------------------------------------------------------------------- the op
class LoRAContext:
    """Which adapter slot each token row uses, for every LoRALinear of one model (see the module doc).
    groups: [(slot, rows)] for the slots present, rows (M_s,) flat token indices, or None for every row."""

    def __init__(self):
        self.groups: list = []

    def set(self, index):
        """index: None (no adapter), an int (every row uses that slot; -1: none), a list of one slot per batch row
        (B,) applied to each of its T tokens (with T given to use()), or a (B, T) long tensor, -1 for none."""
        if index is None:
            self.groups = []
        elif isinstance(index, int):
            self.groups = [(index, None)] if index >= 0 else []
        else:
            flat = index.reshape(-1)                                         # (B*T,)
            slots = sorted(set(flat.tolist()) - {-1})
            if len(slots) == 1 and bool((flat == slots[0]).all()):
                self.groups = [(slots[0], None)]                             # one adapter for all: no gather
            else:
                self.groups = [(s, (flat == s).nonzero().squeeze(1)) for s in slots]

    @contextmanager
    def use(self, index, T: Optional[int] = None):
        """For one forward: `with ctx.use([slot of each row], T): model(tokens (B, T), ...)`; cleared afterwards."""
        if isinstance(index, (list, tuple)):
            index = torch.tensor(index, dtype=torch.long)[:, None].expand(len(index), T or 1)   # (B, T)
        self.set(index)
        try:
            yield
        finally:
            self.groups = []


class LoRALinear(nn.Module):
    """base(x) plus each row's adapter: a drop-in for the linear it wraps (nn.Linear or a quantized weight type).
    A (S, R, K) and Bt (S, R, N) hold S slots of rank up to R, B stored transposed so that a slot's first r rows
    are one contiguous (r, N) block; ranks[s] = 0 means slot s has no adapter in this layer."""

    def __init__(self, base: nn.Module, context: LoRAContext, slots: int, max_rank: int, dtype=torch.float32):
        super().__init__()
        self.base, self.context = base, context
        self.in_features, self.out_features = base.in_features, base.out_features
        K, N = self.in_features, self.out_features
        self.A = nn.Parameter(torch.zeros(slots, max_rank, K, dtype=dtype), requires_grad=False)    # (S, R, K)
        self.Bt = nn.Parameter(torch.zeros(slots, max_rank, N, dtype=dtype), requires_grad=False)   # (S, R, N)
        self.ranks = [0] * slots
        self.scaling = [0.0] * slots
        self._views: list = [None] * slots        # serving: each slot's (A^T (K, r), B^T (r, N)), made once

    @torch.no_grad()
    def set_slot(self, s: int, A: Optional[torch.Tensor], B: Optional[torch.Tensor], scaling: float = 1.0):
        """Put an adapter's A (r, K), B (N, r) in slot s (None: clear the slot)."""
        self.ranks[s], self.scaling[s], self._views[s] = 0, 0.0, None
        if A is None:
            return
        r, (R, K), N = A.shape[0], self.A.shape[1:], self.out_features
        if tuple(A.shape) != (r, K) or tuple(B.shape) != (N, r) or r > R:
            raise ValueError(f"LoRA A {tuple(A.shape)}, B {tuple(B.shape)} do not fit this layer: A must be (r, {K}), "
                             f"B ({N}, r), r <= {R}")
        self.A[s, :r], self.A[s, r:] = A, 0                                # rows past r: zeros (a smaller rank
        self.Bt[s, :r], self.Bt[s, r:] = B.T, 0                            # after a larger one leaves none behind)
        self.use_slot(s, r, scaling)

    def use_slot(self, s: int, r: int, scaling: float):
        """Slot s holds rank r (its weights already in A and Bt) scaled by `scaling`."""
        self.ranks[s], self.scaling[s] = r, float(scaling)
        self._views[s] = (self.A[s, :r].T, self.Bt[s, :r])                     # (K, r), (r, N)

    def slot_weights(self, s: int) -> tuple:
        """Slot s as (A (r, K), B (N, r)), views."""
        r = self.ranks[s]
        return self.A[s, :r], self.Bt[s, :r].T

    def forward(self, x):                                                  # (..., K) -> (..., N)
        y = self.base(x)                                                   # (..., N)
        groups = [(s, rows) for s, rows in self.context.groups if self.ranks[s]]
        if not groups:
            return y
        K, N = self.in_features, self.out_features
        x2, y2 = x.reshape(-1, K), y.reshape(-1, N)                        # (M, K), (M, N)
        for s, rows in groups:
            r = self.ranks[s]
            if self.A.requires_grad:                                       # training: views made afresh, in the graph
                at, bt = self.A[s, :r].T, self.Bt[s, :r]                   # (K, r), (r, N)
            else:
                at, bt = self._views[s]
            xg = x2 if rows is None else x2.index_select(0, rows)          # (M_s, K) the rows of adapter s
            h = xg @ at                                                    # (M_s, r)
            if rows is None:
                y2 = torch.addmm(y2, h, bt, alpha=self.scaling[s])         # y + s h B^T, (M, N)
            else:
                y2.index_add_(0, rows, h @ bt, alpha=self.scaling[s])      # the base's output is a fresh tensor
        return y2.view(y.shape)


# ---------------------------------------------------------------------------- wrapping and merging a model
def attach_lora(model: nn.Module, slots: int, max_rank: int, modules=MODULES) -> nn.Module:
    """A copy of the Transformer whose linears in `modules` are LoRALinear with `slots` empty slots of rank up to
    max_rank, and a LoRAContext at model.lora_context. The copy shares every base weight with `model` (nothing is
    duplicated; `model` itself is left as it was)."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    model = copy.deepcopy(model, memo=shared)                              # new modules, the same tensors
    model.lora_context = ctx = LoRAContext()
    dtype = model.tok_embeddings.weight.dtype
    for layer in model.layers:
        for path in modules:
            parent, name = layer.get_submodule(path.rsplit(".", 1)[0]), path.rsplit(".", 1)[1]
            setattr(parent, name, LoRALinear(getattr(parent, name), ctx, slots, max_rank, dtype))
    return model


def lora_linears(model: nn.Module) -> dict:
    """(layer, module path) -> LoRALinear, for a model made by attach_lora."""
    return {(i, path): layer.get_submodule(path) for i, layer in enumerate(model.layers) for path in MODULES
            if isinstance(layer.get_submodule(path), LoRALinear)}


def load_slot(model: nn.Module, s: int, adapter: Optional[LoRAAdapter]):
    """Slot s of every LoRALinear of `model` holds `adapter` (None: is emptied). A layer the adapter does not
    target gets rank 0 there (skipped in the forward)."""
    for key, lin in lora_linears(model).items():
        ab = adapter.weights.get(key) if adapter is not None else None
        if ab is None:
            lin.set_slot(s, None, None)
        else:
            lin.set_slot(s, ab[0].to(lin.A.dtype), ab[1].to(lin.A.dtype), adapter.scaling)


@torch.no_grad()
def merge_lora(model: nn.Module, adapter: LoRAAdapter) -> nn.Module:
    """A copy of a plain Transformer with the adapter merged: W + s B A in every targeted linear (computed in
    float64, then rounded to the weight's dtype). What S-LoRA serves without: one such copy per adapter."""
    merged = copy.deepcopy(model)
    for (layer, path), (a, b) in adapter.weights.items():
        lin = merged.layers[layer].get_submodule(path)
        if not isinstance(lin, nn.Linear):
            raise ValueError(f"merge_lora merges into float nn.Linear weights; layer {layer} {path} is a "
                             f"{type(lin).__name__}")
        w = lin.weight.double() + adapter.scaling * (b.double() @ a.double())       # (N, K)
        lin.weight.copy_(w.to(lin.weight.dtype))
    return merged


# ---------------------------------------------------------------------------- the slots an engine keeps
def _identity(spec) -> tuple:
    """What a directory holds now (each file's name, size and modification time): an adapter rewritten on disk
    is a new key, so it is read again. () for a name that is no directory (a shipped adapter)."""
    path = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else None
    if path is None or not os.path.isdir(path):
        return ()
    files = sorted((e for e in os.scandir(path) if e.is_file()), key=lambda e: e.name)
    return tuple((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in files)


class LoRASlots:
    """max_loras slots in a model made by attach_lora, filled on first use and reused least-recently-used.
    An adapter is parsed once (loader: a name, a path or a LoRAAdapter -> LoRAAdapter; the engine's parts pass
    minillm.formats.peft's) and kept in host memory; acquire() puts it in a slot when a sequence using it is
    admitted, evicting the least recently used adapter that no live sequence uses, or returns False (the sequence
    waits) when every slot is in use."""

    def __init__(self, model: nn.Module, max_loras: int, max_rank: int, loader: Callable):
        self.model, self.max_rank, self.loader = model, max_rank, loader
        self.resident: list = [None] * max_loras           # slot -> LoRAAdapter
        self.lru: OrderedDict = OrderedDict()               # slots holding an adapter, least recently used first
        self.known: dict = {}                               # digest -> LoRAAdapter (one object per content)
        self.by_spec: dict = {}                             # a name or path asked for -> its digest
        self.loads = self.evictions = 0

    def get(self, spec) -> LoRAAdapter:
        """The adapter a request names (parsed on first use, checked against the model and max_lora_rank), as this
        engine's own object: its slot is this engine's (a LoRAAdapter passed in is copied, its weights shared).
        None: the base model."""
        if spec is None:
            return None
        key = spec.digest if isinstance(spec, LoRAAdapter) else (spec, _identity(spec))   # rewritten: read again
        if key in self.by_spec:
            return self.known[self.by_spec[key]]
        adapter = copy.copy(spec) if isinstance(spec, LoRAAdapter) else self.loader(spec)
        adapter.slot = -1
        check_adapter(adapter, self.model.config, self.max_rank)
        adapter = self.known.setdefault(adapter.digest, adapter)
        self.by_spec[key] = adapter.digest
        return adapter

    def admit(self, seq, sched) -> bool:
        """The scheduler's hook (minillm.core.hooks.NoAdapters): a slot for the adapter of seq, being admitted
        (none needed for the base model). The running, swapped-out and padding sequences keep theirs resident. An
        adapter that fails to load ends its request with an error (finish_reason "error"); nothing else is touched."""
        if seq.lora is None:
            return True
        try:
            return self.acquire(seq.lora, sched.running + list(sched.swapped) + sched.padding)
        except Exception as e:                  # its adapter would not load: this request fails, the others go on
            sched.finish(seq, "error", f"LoRA adapter {seq.lora.name!r} could not be loaded: {type(e).__name__}: {e}")
            return False

    def use(self, rows: list, num_tokens: int):
        """The model runner's hook: each row's adapter slot (-1: the base model) for one forward of T tokens a row."""
        return self.model.lora_context.use([r.seq.lora_slot for r in rows], num_tokens)

    def acquire(self, adapter: LoRAAdapter, live: list) -> bool:
        """A slot for `adapter`, whose sequence is being admitted; live: the sequences that keep their adapters
        resident (running, swapped out, static padding). -> False when every slot holds an adapter in use."""
        if adapter.slot >= 0 and self.resident[adapter.slot] is adapter:
            self.lru.move_to_end(adapter.slot)
            return True
        free = [s for s, a in enumerate(self.resident) if a is None]
        if not free:
            busy = {s.lora.slot for s in live if getattr(s, "lora", None) is not None}
            free = [s for s in self.lru if s not in busy]      # least recently used first
            if not free:
                return False
            self.resident[free[0]].slot = -1
            self.evictions += 1
        s = free[0]
        try:
            load_slot(self.model, s, adapter)
        except Exception:                                    # half loaded: the slot holds no adapter now
            self.resident[s] = None
            self.lru.pop(s, None)
            raise
        self.resident[s], adapter.slot = adapter, s
        self.lru[s] = None
        self.lru.move_to_end(s)
        self.loads += 1
        return True

    @property
    def nbytes(self) -> int:
        """Bytes of the slot stacks allocated in the model (every slot at max rank)."""
        return sum(lin.A.numel() * lin.A.element_size() + lin.Bt.numel() * lin.Bt.element_size()
                   for lin in lora_linears(self.model).values())
