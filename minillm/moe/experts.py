"""Mixture of experts: a feed-forward layer of E small SwiGLU experts and a learned top-k router, and sparse upcycling
(Komatsuzaki et al. 2023) that builds one from a trained dense FFN by splitting its hidden units into E fine-grained
experts (DeepSeekMoE, Dai et al. 2024; "MoE upcycling with expert splitting", Zhang et al. 2022 "MoEfication").

    y(x) = sum over the k experts e the router chose for x of  g_e(x) * w2_e(silu(w1_e x) * w3_e x)

Routing (Mixtral's rule, Jiang et al. 2024): p = softmax(router(x)) over the E experts, keep the top k, renormalise
the k kept probabilities to sum to 1, then multiply by gate_scale (default k). The scale is this project's choice, for
upcycling: equal gates then give each chosen expert weight 1, the weight its hidden units had in the dense FFN, so
top-E of E with a uniform router IS the dense layer (the identity tests/test_moe.py checks), and top-k of E starts
as the dense FFN with the other experts' units dropped.

Tokens are dispatched per expert, as MoE kernels do (vLLM's fused_moe, MegaBlocks): the N*k (token, expert)
assignments are sorted by expert, the rows gathered once, each expert runs ONE matmul chain on its contiguous slice,
and the gated outputs are scatter-added back to their tokens. Each call keeps its statistics for the engine, the
benches and the notebook: tokens per expert (`last.counts`, and `load`, summed over every call since reset) and the
router probabilities; with `aux` the Switch load-balancing loss (Fedus et al. 2022) E * sum_e f_e * P_e.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ModelConfig

PARTITIONS = ("contiguous", "cluster")      # how upcycling splits a dense FFN's hidden units among the experts


@dataclass
class MoEConfig:
    n_experts: int = 4               # E
    top_k: int = 2                   # k experts per token
    expert_hidden: int = 192         # He, each expert's SwiGLU width (upcycled: dense hidden_dim / E)
    gate_scale: Optional[float] = None   # gates sum to this (None: top_k, so equal gates are 1 each)
    partition: str = "cluster"       # how the dense hidden units were split (recorded in the file)

    def __post_init__(self):
        for name in ("n_experts", "top_k", "expert_hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MoEConfig.{name} must be a positive integer, got {value!r}")
        if self.top_k > self.n_experts:
            raise ValueError(f"MoEConfig.top_k={self.top_k} is larger than n_experts={self.n_experts}: a token "
                             f"can be routed to at most every expert once")
        if self.partition not in PARTITIONS:
            raise ValueError(f"MoEConfig.partition={self.partition!r} is not one of {PARTITIONS}")
        if self.gate_scale is None:
            self.gate_scale = float(self.top_k)

    def to_dict(self) -> dict:
        return {"n_experts": self.n_experts, "top_k": self.top_k, "expert_hidden": self.expert_hidden,
                "gate_scale": self.gate_scale, "partition": self.partition}


@dataclass
class RouterStats:
    """One forward call of one MoE layer (detached): what the router decided for its N token rows."""
    counts: torch.Tensor             # (E,) int64, assignments per expert (sums to N * k)
    probs: torch.Tensor              # (N, E) router softmax, before top-k
    experts: torch.Tensor            # (N, k) int64, the chosen experts, most probable first
    gates: torch.Tensor              # (N, k) the weights their outputs were summed with


def expert_swiglu(x, w1, w2, w3):
    """One expert on its rows: x (n, C); w1, w3 (He, C); w2 (C, He) -> (n, C)."""
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T          # (n, He) -> (n, C)


def dispatch(x, experts, gates, w1, w2, w3):
    """Sparse compute: x (N, C); experts, gates (N, k); w1, w3 (E, He, C); w2 (E, C, He) -> (N, C).
    Every expert runs once, on the rows routed to it; a token's k outputs are summed with its gates."""
    N, k = experts.shape
    flat = experts.reshape(-1)                                  # (N*k,) the expert of each assignment
    order = torch.argsort(flat, stable=True)                    # (N*k,) assignments grouped by expert
    rows = order // k                                           # (N*k,) the token of each assignment
    counts = torch.bincount(flat, minlength=w1.shape[0]).tolist()
    xs = x[rows]                                                # (N*k, C) gathered, expert 0's rows first
    ys = [expert_swiglu(part, w1[e], w2[e], w3[e]) for e, part in enumerate(xs.split(counts)) if counts[e]]
    if not ys:                                                  # no rows at all
        return torch.zeros_like(x)
    ys = torch.cat(ys) * gates.reshape(-1)[order, None]         # (N*k, C) gated
    return torch.zeros_like(x).index_add_(0, rows, ys)          # (N, C): scatter-add back to the tokens


class MoEFeedForward(nn.Module):
    """A drop-in for FeedForward: (B, T, C) -> (B, T, C). Experts' weights are stacked: w1, w3 (E, He, C) and
    w2 (E, C, He), so that expert e is w1[e], w2[e], w3[e] and the file stores three tensors per layer."""

    def __init__(self, dim: int, cfg: MoEConfig):
        super().__init__()
        E, He = cfg.n_experts, cfg.expert_hidden
        self.cfg = cfg
        self.router = nn.Linear(dim, E, bias=False)                     # (E, C)
        self.w1 = nn.Parameter(torch.zeros(E, He, dim))                 # gate
        self.w2 = nn.Parameter(torch.zeros(E, dim, He))                 # down
        self.w3 = nn.Parameter(torch.zeros(E, He, dim))                 # up
        self.register_buffer("load", torch.zeros(E, dtype=torch.long), persistent=False)  # (E,) since reset
        self.last: Optional[RouterStats] = None
        self.aux: Optional[torch.Tensor] = None                         # Switch loss of the last call (training)

    def route(self, x):
        """x (N, C) -> probs (N, E), experts (N, k), gates (N, k) (renormalised, times the scale); the softmax in
        float32 at least (an fp16 model's router logits are widened first)."""
        logits = self.router(x)                                         # (N, E)
        probs = F.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # (N, E)
        top, experts = probs.topk(self.cfg.top_k, dim=-1)               # (N, k) each
        gates = top / top.sum(-1, keepdim=True) * self.cfg.gate_scale   # (N, k)
        return probs, experts, gates

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        flat = x.reshape(B * T, C)                                      # (N, C)
        probs, experts, gates = self.route(flat)
        out = dispatch(flat, experts, gates.to(x.dtype), self.w1, self.w2, self.w3)  # (N, C)
        counts = torch.bincount(experts.reshape(-1), minlength=self.cfg.n_experts)   # (E,)
        self.last = RouterStats(counts, probs.detach(), experts, gates.detach())
        with torch.no_grad():
            self.load += counts
        self.aux = switch_aux_loss(probs, counts) if self.training else None
        return out.view(B, T, C)

    def reset_stats(self):
        self.load.zero_()
        self.last = None


def switch_aux_loss(probs, counts):
    """Switch Transformer's load-balancing loss: E * sum_e f_e * P_e, f_e the fraction of the N*k assignments
    sent to expert e (no gradient), P_e the mean router probability of e. probs (N, E); counts (E,).
    It is 1 when routing is uniform and grows to E when one expert takes everything."""
    E = probs.shape[-1]
    f = counts.to(probs.dtype) / counts.sum()                       # (E,)
    return E * (f * probs.mean(0)).sum()


# ---------------------------------------------------------------------------- a model's MoE layers
def moe_layers(model) -> list:
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def moe_config(model) -> Optional[MoEConfig]:
    """The MoE settings of an upcycled model (None for a dense one)."""
    layers = moe_layers(model)
    return layers[0].cfg if layers else None


def attach_moe(model, cfg: MoEConfig):
    """Replace every block's FeedForward by an (empty) MoEFeedForward, in place: for a loader to fill."""
    for block in model.layers:
        block.feed_forward = MoEFeedForward(model.config.dim, cfg).to(block.ffn_norm.weight.dtype)
    return model


def aux_loss(model):
    """Mean over layers of each layer's Switch loss from the last training forward (a tensor with gradients)."""
    losses = [m.aux for m in moe_layers(model) if m.aux is not None]
    if not losses:
        raise ValueError("no MoE layer has an auxiliary loss: run a forward in training mode first")
    return torch.stack(losses).mean()


def reset_stats(model):
    for m in moe_layers(model):
        m.reset_stats()


def expert_load(model) -> torch.Tensor:
    """(L, E) int64: tokens routed to each expert of each layer since the last reset_stats (k per token)."""
    return torch.stack([m.load.clone() for m in moe_layers(model)])


def load_imbalance(load) -> dict:
    """How unevenly tokens spread over experts. load: (L, E) or (E,) tokens per expert.
    max_over_mean (per layer): the busiest expert's tokens over the mean, 1 when perfectly balanced, E when one
    expert takes them all; the step's time under expert parallelism is set by the busiest expert.
    cv (per layer): standard deviation / mean of the counts (0 when balanced). Plus both averaged over layers."""
    load = torch.as_tensor(load, dtype=torch.float64)
    load = load[None] if load.dim() == 1 else load                      # (L, E)
    mean = load.mean(1).clamp_min(1e-12)                                # (L,)
    ratio, cv = load.max(1).values / mean, load.std(1, unbiased=False) / mean
    return {"max_over_mean": ratio.tolist(), "cv": cv.tolist(),
            "max_over_mean_avg": float(ratio.mean()), "cv_avg": float(cv.mean())}


# ---------------------------------------------------------------------------- sparse upcycling
def contiguous_partition(hidden: int, n_experts: int) -> torch.Tensor:
    """(E, He): expert e gets hidden units e*He .. (e+1)*He - 1."""
    if hidden % n_experts:
        raise ValueError(f"hidden_dim={hidden} does not split into n_experts={n_experts} equal experts")
    return torch.arange(hidden).view(n_experts, hidden // n_experts)


def cluster_partition(h, n_experts: int, iters: int = 25, seed: int = 0) -> torch.Tensor:
    """(E, He): hidden units grouped by co-activation on calibration tokens, with balanced k-means (MoEfication):
    a unit is described by |its activation| on each of the N tokens (unit-normalised, so cosine similarity says
    how often two units fire together); each round assigns units to centroids greedily, most similar pair first,
    every expert taking exactly He units. h: (N, Hd) the dense FFN's silu(w1 x) * w3 x."""
    Hd = h.shape[1]
    He = contiguous_partition(Hd, n_experts).shape[1]
    feats = F.normalize(h.abs().T.double(), dim=1)                          # (Hd, N)
    g = torch.Generator().manual_seed(seed)
    centroids = feats[torch.randperm(Hd, generator=g)[:n_experts]]          # (E, N)
    for _ in range(iters):
        sim = feats @ centroids.T                                           # (Hd, E)
        groups = _balanced_assign(sim, He)
        new = F.normalize(torch.stack([feats[idx].mean(0) for idx in groups]), dim=1)  # (E, N)
        if torch.equal(new, centroids):
            break
        centroids = new
    return torch.stack([idx.sort().values for idx in groups])               # (E, He)


def _balanced_assign(sim, capacity: int) -> list:
    """Greedy: the most similar (unit, expert) pairs first, an expert closing when it holds `capacity` units."""
    Hd, E = sim.shape
    taken, fill, groups = torch.zeros(Hd, dtype=torch.bool), [0] * E, [[] for _ in range(E)]
    for flat in torch.argsort(sim.reshape(-1), descending=True).tolist():
        j, e = divmod(flat, E)
        if not taken[j] and fill[e] < capacity:
            taken[j], fill[e] = True, fill[e] + 1
            groups[e].append(j)
    return [torch.tensor(g) for g in groups]


@torch.no_grad()
def ffn_inputs(model, tokens) -> list:
    """What every layer's FFN reads (the ffn_norm output) on tokens (B, T): a list of (B*T, C)."""
    seen, hooks = [], [b.feed_forward.register_forward_hook(lambda m, inp, out: seen.append(inp[0].flatten(0, 1)))
                       for b in model.layers]                                   # each (B*T, C)
    try:
        model(tokens)
    finally:
        for hk in hooks:
            hk.remove()
    return seen


@torch.no_grad()
def ffn_activations(model, tokens) -> list:
    """The dense FFN hidden activations silu(w1 x) * w3 x of every layer on tokens (B, T): a list of (B*T, Hd)."""
    inputs = ffn_inputs(model, tokens)                                          # each (B*T, C)
    return [F.silu(b.feed_forward.w1(x)) * b.feed_forward.w3(x) for b, x in zip(model.layers, inputs)]


@torch.no_grad()
def best_experts(layer: MoEFeedForward, x) -> torch.Tensor:
    """(N, k): for each row of x (N, C), the k experts whose omission changes the layer's output least when the
    chosen ones run at weight 1 (what a router would ideally pick, for this layer alone)."""
    from itertools import combinations
    E, k = layer.cfg.n_experts, layer.cfg.top_k
    subsets = torch.tensor(list(combinations(range(E), k)))                     # (S, k)
    ys = torch.stack([expert_swiglu(x, layer.w1[e], layer.w2[e], layer.w3[e]) for e in range(E)], 1)  # (N, E, C)
    dropped = ys.sum(1, keepdim=True) - ys[:, subsets].sum(2)                   # (N, S, C)
    return subsets[dropped.norm(dim=-1).argmin(1)]                              # (N, k)


def fit_router(layer: MoEFeedForward, x, steps: int = 200, lr: float = 0.01):
    """Train the router alone to predict best_experts on x (N, C): cross-entropy against 1/k on each of the k best,
    full batch, Adam (MoEfication fits its routers to the experts on data in the same spirit)."""
    target = torch.zeros(x.shape[0], layer.cfg.n_experts, dtype=x.dtype)
    target.scatter_(1, best_experts(layer, x), 1.0 / layer.cfg.top_k)           # (N, E)
    w = layer.router.weight.detach().clone().requires_grad_(True)              # (E, C)
    opt = torch.optim.Adam([w], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            loss = F.cross_entropy(x @ w.T, target)                             # (N, E) logits
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        layer.router.weight.copy_(w)


ROUTER_INITS = ("gate_mean", "random", "fit")


@torch.no_grad()
def upcycle(model, cfg: MoEConfig, partitions: Optional[list] = None, router_init: str = "gate_mean", seed: int = 0,
            calib_tokens=None):
    """Replace each dense FeedForward (hidden Hd) by a MoEFeedForward of E experts of Hd / E units, in place.
    partitions: per layer an (E, He) tensor of hidden-unit indices (contiguous_partition if None).
    router_init: "gate_mean" (router row e = the mean of expert e's gate rows w1: it prefers the expert whose units'
    gate pre-activations are largest on average), "random" (N(0, 0.02)), or "fit" (gate_mean, then fit_router on
    the dense model's FFN inputs for calib_tokens (B, T): the router starts out imitating best_experts)."""
    Hd = model.config.hidden_dim
    if cfg.n_experts * cfg.expert_hidden != Hd:
        raise ValueError(f"upcycling splits hidden_dim={Hd} into n_experts={cfg.n_experts} experts of "
                         f"expert_hidden={cfg.expert_hidden}: {cfg.n_experts} x {cfg.expert_hidden} != {Hd}")
    if router_init not in ROUTER_INITS:
        raise ValueError(f"router_init={router_init!r} is not one of {ROUTER_INITS}")
    if router_init == "fit" and calib_tokens is None:
        raise ValueError("router_init='fit' fits the routers on calibration text: it needs calib_tokens")
    inputs = ffn_inputs(model, calib_tokens) if router_init == "fit" else None
    g = torch.Generator().manual_seed(seed)
    for i, block in enumerate(model.layers):
        ff = block.feed_forward
        part = partitions[i] if partitions is not None else contiguous_partition(Hd, cfg.n_experts)   # (E, He)
        moe = MoEFeedForward(model.config.dim, cfg).to(ff.w1.weight.dtype)
        moe.w1.copy_(ff.w1.weight[part])                                # (E, He, C)
        moe.w3.copy_(ff.w3.weight[part])                                # (E, He, C)
        moe.w2.copy_(ff.w2.weight[:, part].permute(1, 0, 2))            # (C, E, He) -> (E, C, He)
        if router_init == "random":
            moe.router.weight.copy_(torch.randn(moe.router.weight.shape, generator=g) * 0.02)
        else:
            moe.router.weight.copy_(moe.w1.mean(1))                     # (E, C)
        if inputs is not None:
            fit_router(moe, inputs[i])
        block.feed_forward = moe
    return model


def moe_partitions(model, cfg: MoEConfig, calib_tokens=None, seed: int = 0) -> Optional[list]:
    """The per-layer partitions cfg.partition asks for: None (contiguous) or clusters on calib_tokens (B, T)."""
    if cfg.partition == "contiguous":
        return None
    if calib_tokens is None:
        raise ValueError("partition='cluster' groups units by co-activation: it needs calibration tokens")
    return [cluster_partition(h, cfg.n_experts, seed=seed) for h in ffn_activations(model, calib_tokens)]


def compute_vs_params(cfg: ModelConfig, moe: MoEConfig) -> dict:
    """Parameters stored vs used by one token, and forward FLOPs per token (ModelConfig.flops_per_token's count:
    2 per multiply-add, classifier included, no attention context). An MoE layer stores E experts and runs k."""
    L, C, E = cfg.n_layers, cfg.dim, moe.n_experts
    router = L * C * E
    total = replace(cfg, hidden_dim=E * moe.expert_hidden)           # every expert: the dense model's size
    active = replace(cfg, hidden_dim=moe.top_k * moe.expert_hidden)  # what a token's k experts add up to
    out = {"params_total": total.num_params() + router, "params_active": active.num_params() + router,
           "ffn_params_total": L * 3 * C * moe.expert_hidden * E, "ffn_params_active": L * 3 * C * moe.expert_hidden
           * moe.top_k, "router_params": router,
           "flops_per_token_active": active.flops_per_token() + 2 * router,
           "flops_per_token_all_experts": total.flops_per_token() + 2 * router}
    out["active_fraction"] = out["params_active"] / out["params_total"]
    out["flops_fraction"] = out["flops_per_token_active"] / out["flops_per_token_all_experts"]
    return out
