"""Checkers for notebook 15_moe_and_lora: a mixture of experts' router, and a linear serving several LoRA adapters.

The two core exercises run inside the engine: the reader's router replaces MoEFeedForward.route in every layer of an
upcycled model, and the reader's LoRA linear replaces LoRALinear.forward in a model serving three adapters at once.
Both engines run in float64 on a small random model with large weights (varied text, so a wrong token shows), where
the reference and the reader's code agree to rounding (~1e-15): tokens must be equal, logprobs within 1e-9.
"""
from __future__ import annotations

import torch

from .common import _close, calls_building, checker

PROMPTS = ["The cat sat on the mat and then", "Once upon a time", "To be or not", "A dog barked at the moon"]
TOL64 = 1e-9          # float64 engines: the same sums in another order differ by ~1e-15 per op


# ---------------------------------------------------------------------------- shared: a small model, float64
def _tiny64():
    """random:tiny (dim 64, 2 layers, hidden 192) with large random weights, in float64: (model, tokenizer).
    Also one torch thread (the checker puts the count back): at this size a second thread gains nothing, and on a
    busy machine it waits for a taken core, ten times slower."""
    from ..formats.loader import random_model
    torch.set_num_threads(1)
    model, tok = random_model("tiny", seed=0)
    model.init_weights(seed=5, std=0.15)
    return model.double(), tok


def _greedy(llm, lora=None, max_tokens: int = 12, prompt_ids: bool = False):
    """[(token_ids, [logprob of each chosen token])] for PROMPTS, greedy (with each prompt's ids first if asked)."""
    from ..core.sampling import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    outs = llm.generate(PROMPTS, params, lora=lora)
    return [((o.prompt_token_ids,) if prompt_ids else ())
            + (o.outputs[0].token_ids, [lp[t] for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outs]


def _same_run(got, want, what: str, prompts=PROMPTS):
    for p, (gt, gl), (wt, wl) in zip(prompts, got, want):
        assert gt == wt, f"{what}: prompt {p!r} generated {gt} instead of {wt}"
        gap = max(abs(a - b) for a, b in zip(gl, wl))
        assert gap < TOL64, f"{what}: prompt {p!r}: logprobs differ by {gap:.2g} (float64: tolerance {TOL64:g})"


# ---------------------------------------------------------------------------- MoE: parameters (warm-up)
@checker(signature="dim, n_experts, expert_hidden, top_k")
def check_moe_params(fn):
    """fn(dim, n_experts, expert_hidden, top_k) -> (stored, active): the parameters one MoE layer stores (E SwiGLU
    experts of expert_hidden units, and the router) and those one token's forward uses (its k experts + the router)."""
    from ..moe.experts import MoEConfig, MoEFeedForward
    for C, E, He, k in ((256, 4, 192, 2), (64, 8, 16, 1), (96, 6, 40, 3), (32, 4, 8, 4)):
        stored = sum(p.numel() for p in MoEFeedForward(C, MoEConfig(E, k, He)).parameters())
        expert, router = 3 * C * He, C * E
        active = k * expert + router
        got = fn(C, E, He, k)
        case = f"(dim={C}, {E} experts of {He}, top-{k})"
        assert isinstance(got, (tuple, list)) and len(got) == 2, f"returned {got!r}: return (stored, active)"
        s, a = (int(v) for v in got)
        assert s != stored - router, f"stored {s:,}: the router ({C} x {E} = {router:,}) is missing {case}"
        assert s != 2 * C * He * E + router, \
            f"stored {s:,}: a SwiGLU expert has THREE matrices (w1, w3: {He} x {C}; w2: {C} x {He}) {case}"
        assert s == stored, f"stored {s:,}, expected {stored:,} (the layer's own parameters) {case}"
        assert a != stored or k == E, f"active {a:,} = stored: a token runs only its {k} of {E} experts {case}"
        assert a != active - router, f"active {a:,}: every token also runs the router ({router:,}) {case}"
        assert a == active, f"active {a:,}, expected {active:,} {case}"
    return "stored = E x 3 C He + C E, active = k x 3 C He + C E, as the layer's parameters count them"


# ---------------------------------------------------------------------------- MoE: the router (core)
def _reference_route(logits, top_k, gate_scale):
    """The package's route() on these logits: a layer whose router is the identity."""
    from ..moe.experts import MoEConfig, MoEFeedForward
    N, E = logits.shape
    layer = MoEFeedForward(E, MoEConfig(E, top_k, 1, gate_scale=gate_scale)).to(logits.dtype)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(E, dtype=logits.dtype))
    _, experts, gates = layer.route(logits)
    return experts, gates


def _by_expert(experts, gates, E: int):
    """(N, E) gate of each expert per row (0 where not chosen): the routing, whatever order the k come in."""
    dense = torch.zeros(experts.shape[0], E, dtype=torch.float64)
    return dense.scatter_add_(1, experts.long(), gates.double())


def _check_route_shapes(got, N, k):
    assert isinstance(got, (tuple, list)) and len(got) == 2, f"returned {type(got).__name__}: return (experts, gates)"
    experts, gates = got
    assert isinstance(experts, torch.Tensor) and isinstance(gates, torch.Tensor), \
        "experts and gates must be tensors (N, k)"
    assert tuple(experts.shape) == (N, k) and tuple(gates.shape) == (N, k), \
        f"experts {tuple(experts.shape)}, gates {tuple(gates.shape)}: both should be (N, k) = ({N}, {k})"
    assert not experts.dtype.is_floating_point, f"experts are {experts.dtype}: they index the experts (torch.long)"
    assert gates.dtype.is_floating_point, f"gates are {gates.dtype}: they are weights (floating point)"
    return experts, gates


def _route_cases():
    g = torch.Generator().manual_seed(0)
    out = []
    for N, E, k, scale, spread, offset in ((7, 4, 2, 2.0, 2.0, 0), (5, 8, 2, 1.0, 1.0, 0), (6, 4, 1, 1.0, 1.5, 0),
                                           (4, 4, 4, 4.0, 1.0, 0), (5, 6, 3, 3.0, 0.5, 0),
                                           (3, 4, 2, 2.0, 1.0, 1000.0)):       # logits near 1000: exp() overflows
        out.append((torch.randn(N, E, generator=g, dtype=torch.float64) * spread + offset, k, scale))
    return out


def _diagnose_route(fn):
    """fn against the package's route on logits of several shapes; each common mistake named."""
    for logits, k, scale in _route_cases():
        N, E = logits.shape
        case = f"(N={N} tokens, E={E} experts, top_k={k}, gate_scale={scale:g})"
        got = fn(logits.clone(), k, scale)
        experts, gates = _check_route_shapes(got, N, k)
        assert bool(((experts >= 0) & (experts < E)).all()), f"an expert index outside 0..{E - 1} {case}"
        assert all(len(set(r)) == k for r in experts.tolist()), f"a token was sent to the same expert twice {case}"
        assert torch.isfinite(gates).all(), (f"gates hold inf or nan {case}: exp() of large logits overflowed; "
                                             "subtract the row's maximum first (torch.softmax does)")
        want_e, want_g = _reference_route(logits, k, scale)
        probs = torch.softmax(logits, -1)                                            # (N, E)
        top = probs.gather(1, want_e)                                                # (N, k)
        chosen = torch.zeros(N, E, dtype=torch.bool).scatter_(1, want_e, True)
        got_chosen = torch.zeros(N, E, dtype=torch.bool).scatter_(1, experts.long(), True)
        if not torch.equal(got_chosen, chosen):
            low = torch.zeros(N, E, dtype=torch.bool).scatter_(1, probs.topk(k, largest=False).indices, True)
            assert not torch.equal(got_chosen, low), f"chose the k LEAST probable experts (topk(largest=False)?) {case}"
            by_col = torch.zeros(N, E, dtype=torch.bool).scatter_(1, torch.softmax(logits, 0).topk(k).indices, True)
            assert not torch.equal(got_chosen, by_col), \
                f"softmax over the tokens (dim 0): a token's softmax runs over its E experts (dim -1) {case}"
            i = int((got_chosen != chosen).any(1).nonzero()[0])
            assert False, (f"token {i} was sent to experts {sorted(experts[i].tolist())}, the router's top-{k} are "
                           f"{sorted(want_e[i].tolist())} (probabilities {[round(p, 3) for p in probs[i].tolist()]}) "
                           f"{case}")
        mistakes = {
            "no renormalisation: the k kept probabilities must be divided by their sum (Switch and DeepSeek-V2 skip "
            "this; Mixtral, and this model, renormalise)": _by_expert(want_e, top * scale, E),
            f"gate_scale is missing: the gates sum to 1, this model's sum to gate_scale={scale:g} (so that equal "
            "gates give each expert weight 1, as its units had in the dense FFN)": _by_expert(want_e, top / top.sum(
                -1, keepdim=True), E),
            "no renormalisation and no gate_scale: the gates are the raw probabilities": _by_expert(want_e, top, E),
            "the gates are softmax(logits over the tokens, dim 0): a token's softmax runs over its E experts":
                _by_expert(want_e, torch.softmax(logits, 0).gather(1, want_e) * scale, E),
            "the gates are the raw logits: take the softmax first": _by_expert(want_e, logits.gather(1, want_e), E),
        }
        _close(f"gates {case}", _by_expert(experts, gates, E), _by_expert(want_e, want_g, E), atol=1e-9, rtol=1e-9,
               mistakes=mistakes)


def _moe_engine(route=None):
    """The tiny model upcycled to 4 experts of 48, top-2, with a router that spreads its choices -> its LLM (float64).
    route: None (the package's), or the reader's fn(logits, top_k, gate_scale) put into every layer."""
    from ..engine.llm import LLM
    from ..moe.experts import MoEConfig, moe_layers, upcycle
    model, tok = _tiny64()
    upcycle(model, MoEConfig(4, 2, model.config.hidden_dim // 4), router_init="random", seed=1)
    g = torch.Generator().manual_seed(2)
    for m in moe_layers(model):
        with torch.no_grad():
            m.router.weight.copy_(torch.randn(m.router.weight.shape, generator=g, dtype=torch.float64) * 0.3)
    llm = LLM(model, tokenizer=tok, backend="torch", dtype="float64")
    if route is not None:
        for m in moe_layers(llm.engine.parts.model):
            m.route = _plugged_route(m, route)
    return llm


def _plugged_route(layer, fn):
    """layer.route with the reader's top-k and gates: x (N, C) -> probs (N, E), experts (N, k), gates (N, k)."""
    def route(x):
        logits = layer.router(x)                                                     # (N, E)
        experts, gates = fn(logits, layer.cfg.top_k, layer.cfg.gate_scale)
        return torch.softmax(logits, -1), experts.long(), gates.to(x.dtype)
    return route


@checker(kind="core", signature="logits, top_k, gate_scale")
def check_route_top_k(fn):
    """fn(logits (N, E), top_k, gate_scale) -> (experts (N, k) long, gates (N, k)): each token's top_k experts by
    router probability (softmax over the E experts), their probabilities renormalised to sum to 1, times gate_scale."""
    from ..moe.experts import expert_load
    _diagnose_route(fn)
    ref = _moe_engine()
    want = _greedy(ref)
    llm = _moe_engine(fn)
    got = _greedy(llm)
    _same_run(got, want, "the engine with your router")
    load, want_load = expert_load(llm.engine.parts.model), expert_load(ref.engine.parts.model)    # (L, E)
    assert torch.equal(load, want_load), \
        f"tokens per expert {load.tolist()}, with the package's router {want_load.tolist()}"
    n = sum(len(t) for t, _ in got)
    return (f"plugged into every MoE layer of an upcycled model in the engine: {len(PROMPTS)} prompts, {n} tokens "
            f"generated, the same tokens (logprobs within {TOL64:g}) and the same tokens per expert "
            f"{load.sum(0).tolist()} as the package's router")


# ---------------------------------------------------------------------------- LoRA: bytes (warm-up)
@checker(signature="cfg, rank, modules, bytes_per_param")
def check_lora_bytes(fn):
    """fn(cfg: ModelConfig, rank, modules: list of names like "attention.wq", bytes_per_param) -> the bytes of one
    LoRA adapter of that rank on those linears of every layer: A (r, K) and B (N, r) for each (N, K) linear."""
    from ..config import ModelConfig
    from ..lora.adapters import MODULES, LoRAAdapter, module_shapes
    shipped = ModelConfig(dim=256, hidden_dim=768, n_layers=8, n_heads=4, n_kv_heads=2, vocab_size=4096)
    other = ModelConfig(dim=96, hidden_dim=160, n_layers=3, n_heads=6, n_kv_heads=3, vocab_size=512)
    for cfg, r, mods, b in ((shipped, 8, list(MODULES), 4), (shipped, 8, list(MODULES), 2),
                            (other, 4, ["attention.wq", "attention.wv"], 4), (other, 3, list(MODULES[3:]), 2)):
        shapes = module_shapes(cfg)
        weights = {(i, m): (torch.zeros(r, shapes[m][1]), torch.zeros(shapes[m][0], r))
                   for i in range(cfg.n_layers) for m in mods}
        want = LoRAAdapter("x", r, 1.0, weights).nbytes * b // 4                   # nbytes: float32
        got = fn(cfg, r, list(mods), b)
        case = (f"(dim {cfg.dim}, hidden {cfg.hidden_dim}, {cfg.n_layers} layers, {cfg.n_heads} heads / "
                f"{cfg.n_kv_heads} KV heads, rank {r}, {len(mods)} modules, {b} bytes each)")
        assert isinstance(got, (int, float)) and not isinstance(got, bool), f"returned {got!r}: a number of bytes"
        per = lambda f: cfg.n_layers * b * sum(f(*shapes[m]) for m in mods)       # noqa: E731
        named = {
            "counts the full matrix N x K: an adapter stores only A (r x K) and B (N x r)": per(lambda N, K: N * K),
            "counts A only: an adapter stores A (r x K) and B (N x r)": per(lambda N, K: r * K),
            "counts B only: an adapter stores A (r x K) and B (N x r)": per(lambda N, K: r * N),
            "counts one layer: the adapter has A and B in every layer": want // cfg.n_layers,
            "wk and wv are counted with dim outputs: under GQA they have kv_dim = n_kv_heads x head_dim": per(
                lambda N, K: r * (N + K)) + cfg.n_layers * b * r * (cfg.dim - cfg.kv_dim) * sum(
                m in ("attention.wk", "attention.wv") for m in mods),
            "every linear is counted as dim x dim: wk, wv have kv_dim outputs (GQA), w1, w3 are (hidden, dim) and w2 "
            "(dim, hidden)": per(lambda N, K: 2 * r * cfg.dim),
            "the feed-forward linears are counted as dim x dim: w1, w3 are (hidden, dim), w2 (dim, hidden)": want
                - cfg.n_layers * b * r * (cfg.hidden_dim - cfg.dim) * sum(m.startswith("feed_") for m in mods),
        }
        if int(got) != want:
            for why, wrong in named.items():
                assert int(got) != wrong, f"{int(got):,} bytes: {why} {case}"
            assert False, f"{int(got):,} bytes, expected {want:,} {case}"
    return "r x (N + K) parameters per linear and layer, times the bytes of each: what the engine's adapters hold"


# ---------------------------------------------------------------------------- LoRA: the forward (core)
def _lora_case(M, N, K, seed):
    """x (M, K), W (N, K), slots (M,) with -1 rows, adapters {slot: (A, B, alpha)} of ranks 1..4 (float64)."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)         # noqa: E731
    adapters = {s: (rnd(r, K), rnd(N, r), float(a)) for s, r, a in ((0, 4, 8.0), (2, 2, 16.0), (3, 1, 3.0))}
    slots = torch.tensor([(-1, 0, 2, 3, 0, 2, -1, 3, 2)[i % 9] for i in range(M)], dtype=torch.long)
    return rnd(M, K), rnd(N, K), slots, adapters


def _lora_reference(x, W, slots, adapters):
    """Per row, no grouping: y_i = W x_i + (alpha / r) B (A x_i) with the row's adapter (Punica's BGMV)."""
    y = x @ W.T                                                                      # (M, N)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            A, B, alpha = adapters[s]
            y[i] += alpha / A.shape[0] * (B @ (A @ x[i]))
    return y


def _row_diagnosis(got, x, W, slots, adapters, case):
    """What each wrong row carries instead of its own update: another adapter's, or one computed from another row's
    input ('the adapter of another row'), named with the rows."""
    near = lambda a, b: torch.allclose(a, b, atol=1e-8, rtol=1e-8)                # noqa: E731
    extra = got - x @ W.T                                                            # (M, N) what was added
    deltas = {t: alpha / A.shape[0] * (x @ A.T) @ B.T for t, (A, B, alpha) in adapters.items()}   # t -> (M, N)
    for i, s in enumerate(slots.tolist()):
        mine = torch.zeros_like(extra[i]) if s < 0 else deltas[s][i]
        if near(extra[i], mine):
            continue
        who = "row {i} (no adapter, slot -1)" if s < 0 else "row {i} (adapter slot {s})"
        who = who.format(i=i, s=s)
        if s >= 0 and near(extra[i], torch.zeros_like(mine)):
            raise AssertionError(f"{who} got no update: every row whose slot holds an adapter gets it {case}")
        for t, d in deltas.items():
            if t != s and near(extra[i], d[i]):
                raise AssertionError(f"{who} got slot {t}'s update: the rows gathered for an adapter must be the rows "
                                     f"whose slot it is (slots == s), and its output goes back to those rows {case}")
            for j in range(len(slots)):
                if j != i and near(extra[i], d[j]):
                    raise AssertionError(f"{who} got the update of row {j}'s input (slot {t}): the output of the "
                                         f"gathered rows must be added back to the same rows, in the same order {case}")


def _no_merged_weight(fn):
    """No (N, K) update built (B A, or W + s B A), on a case where (N, K) is no other tensor's shape."""
    N, K = 10, 6
    x, W, slots, adapters = _lora_case(7, N, K, 1)
    built = calls_building(fn, (x, W, slots, adapters), (N, K), besides=W)
    assert not built, (f"your linear builds an (N, K) = ({N}, {K}) matrix ({built[0]}): the merged W + s B A, or "
                       "B A. A LoRA linear applies the adapter as (x A^T) B^T, (M, r) then (M, N), never an N x K "
                       "update: that is what lets one batch serve many adapters over one W")


def _diagnose_lora(fn):
    for M, N, K, seed in ((9, 12, 12, 0), (7, 10, 6, 1), (1, 5, 8, 2), (11, 6, 16, 3)):
        x, W, slots, adapters = _lora_case(M, N, K, seed)
        case = f"(x {M} x {K}, W {N} x {K}, slots {slots.tolist()}, ranks 4, 2, 1 in slots 0, 2, 3)"
        try:
            got = fn(x.clone(), W.clone(), slots.clone(), {s: tuple(t.clone() if isinstance(t, torch.Tensor) else t
                                                                     for t in ab) for s, ab in adapters.items()})
        except NotImplementedError:
            raise                                               # the stub: the guard says "not implemented yet"
        except RuntimeError as e:
            raise AssertionError(f"{e} {case}: shapes are A (r, K), B (N, r), so the update is (x A^T) B^T, "
                                 "(M, r) then (M, N)") from None
        assert isinstance(got, torch.Tensor), f"returned {type(got).__name__}: return y, a tensor (M, N)"
        assert tuple(got.shape) == (M, N), f"y is {tuple(got.shape)}, expected (M, N) = ({M}, {N}) {case}"
        want = _lora_reference(x, W, slots, adapters)
        if torch.allclose(got.double(), want, atol=1e-8, rtol=1e-8):
            continue
        per_row = lambda f: torch.stack([x[i] @ W.T + (f(*adapters[s], x[i]) if s >= 0 else 0)   # noqa: E731
                                         for i, s in enumerate(slots.tolist())])
        mistakes = {
            "the base output x W^T is missing: y = x W^T + the update": want - x @ W.T,
            "the scaling is alpha, not alpha / r": per_row(lambda A, B, a, xi: a * (B @ (A @ xi))),
            "the scaling is alpha / sqrt(r) (rsLoRA), not alpha / r": per_row(
                lambda A, B, a, xi: a / A.shape[0] ** 0.5 * (B @ (A @ xi))),
            "the scaling is r / alpha, upside down: alpha / r": per_row(lambda A, B, a, xi: A.shape[0] / a * (B @ (
                A @ xi))),
            "no scaling: the update is (alpha / r) (x A^T) B^T": per_row(lambda A, B, a, xi: B @ (A @ xi)),
        }
        if N == K:
            mistakes["A and B swapped: x B A instead of (x A^T) B^T (A (r, K) reads the input, B (N, r) writes the "
                     "output)"] = per_row(lambda A, B, a, xi: a / A.shape[0] * (xi @ B @ A))
            mistakes["W used untransposed: x W instead of x W^T"] = want - x @ W.T + x @ W
        for why, wrong in mistakes.items():
            if torch.allclose(got.double(), wrong, atol=1e-8, rtol=1e-8):
                raise AssertionError(f"{why} {case}")
        _row_diagnosis(got.double(), x, W, slots, adapters, case)
        _close(f"y {case}", got.double(), want, atol=1e-8, rtol=1e-8)


def _lora_adapters(cfg):
    """Three adapters of ranks 2, 4, 8 on every linear, large random A and B (a trained adapter starts at B = 0)."""
    from ..lora.adapters import MODULES, LoRAAdapter, module_shapes
    shapes, out = module_shapes(cfg), []
    for name, r, alpha, seed in (("a", 4, 8.0, 1), ("b", 8, 12.0, 2), ("c", 2, 5.0, 3)):
        g = torch.Generator().manual_seed(seed)
        weights = {(i, m): (torch.randn(r, shapes[m][1], generator=g, dtype=torch.float64) * 0.1,
                            torch.randn(shapes[m][0], r, generator=g, dtype=torch.float64) * 0.1)
                   for i in range(cfg.n_layers) for m in MODULES}
        out.append(LoRAAdapter(name, r, alpha, weights))
    return out


def _plugged_lora(lin, fn):
    """LoRALinear.forward with the reader's fn: the engine's rows, their slots, and the slots' adapters."""
    def forward(x):                                                                 # (..., K) -> (..., N)
        x2 = x.reshape(-1, lin.in_features)                                          # (M, K)
        slots = torch.full((x2.shape[0],), -1, dtype=torch.long)                    # (M,)
        for s, rows in lin.context.groups:
            slots[slice(None) if rows is None else rows] = s
        adapters = {s: (*lin.slot_weights(s), lin.scaling[s] * lin.ranks[s]) for s in range(len(lin.ranks))
                    if lin.ranks[s]}                                                 # alpha = scaling x r
        y = fn(x2, lin.base.weight, slots, adapters)                                 # (M, N)
        return y.view(*x.shape[:-1], lin.out_features)
    return forward


@torch.no_grad()
def _merged_agrees(merged, prompt_ids, tokens, logprobs, what: str):
    """The merged model, run once over prompt + generated tokens (float64), must pick each generated token greedily
    and give it the engine's logprob: what its own greedy run would produce, without a second engine."""
    seq = torch.tensor([list(prompt_ids) + list(tokens)])                           # (1, T)
    logp = torch.log_softmax(merged(seq)[0, len(prompt_ids) - 1:-1].double(), -1)  # (n, V) before each new token
    for i, (t, lp) in enumerate(zip(tokens, logprobs)):
        best = int(logp[i].argmax())
        assert t == best, f"{what}: new token {i} is {t}, the merged model's greedy choice is {best}"
        assert abs(lp - float(logp[i, t])) < TOL64, \
            f"{what}: new token {i}'s logprob {lp:.6f}, the merged model's {float(logp[i, t]):.6f}"


@checker(kind="core", signature="x, W, slots, adapters")
def check_lora_linear(fn):
    """fn(x (M, K), W (N, K), slots (M,) long, adapters {slot: (A (r, K), B (N, r), alpha)}) -> y (M, N):
    y = x W^T, plus (alpha / r) (x A^T) B^T on the rows of each adapter (slot -1: none), rows grouped by adapter."""
    from ..engine.llm import LLM
    from ..lora.adapters import lora_linears, merge_lora
    _diagnose_lora(fn)
    _no_merged_weight(fn)
    model, tok = _tiny64()
    ads = _lora_adapters(model.config)
    lora = [ads[0], ads[1], None, ads[2]]                                           # one per prompt: three + base
    llm = LLM(model, tokenizer=tok, backend="torch", dtype="float64", enable_lora=True, max_loras=4)
    for lin in lora_linears(llm.engine.parts.model).values():
        lin.forward = _plugged_lora(lin, fn)
    for prompt, ad, (ids, tokens, logprobs) in zip(PROMPTS, lora, _greedy(llm, lora, prompt_ids=True)):
        label = "the base model" if ad is None else f"adapter {ad.name!r} (rank {ad.rank}) merged into W"
        _merged_agrees(merge_lora(model, ad) if ad else model, ids, tokens, logprobs,
                       f"the engine serving {len(ads)} adapters with your linear, prompt {prompt!r}, vs {label}")
    return (f"plugged into every LoRALinear of the engine: one batch of {len(PROMPTS)} requests with adapters "
            f"{[a.name if a else None for a in lora]}, each equal to its merged model (W + (alpha/r) B A): the same "
            f"tokens, logprobs within {TOL64:g}")
