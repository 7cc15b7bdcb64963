"""Notebook 15's checkers: the router and the multi-adapter LoRA linear pass and run in the engine; the common mistakes
fail with a message that names them (no renormalisation, gate_scale, softmax over the wrong dim, overflow; the LoRA
scaling, A and B swapped, another row's update, the base missing); the warm-ups name theirs; code that raises fails
cleanly and the next (correct) attempt passes."""
import torch

from minillm.labs import check_lora_bytes, check_lora_linear, check_moe_params, check_route_top_k


def route_top_k(logits, top_k, gate_scale):
    probs = torch.softmax(logits, dim=-1)
    top, experts = probs.topk(top_k, dim=-1)
    return experts, top / top.sum(-1, keepdim=True) * gate_scale


def lora_linear(x, W, slots, adapters, scale=lambda alpha, r: alpha / r, rows_of=None):
    y = x @ W.T
    for s, (A, B, alpha) in adapters.items():
        rows = (slots == s).nonzero().squeeze(1)
        if len(rows):
            src = rows if rows_of is None else rows_of(rows)
            y[rows] += scale(alpha, A.shape[0]) * (x[src] @ A.T) @ B.T
    return y


def test_router_passes_in_the_engine():
    r = check_route_top_k(route_top_k)
    assert r and r.kind == "core", r.message
    assert "plugged into every MoE layer" in r.message and "tokens per expert" in r.message


def test_softmax_after_top_k_is_the_same_router():
    """softmax over the k kept logits == the top-k probabilities renormalised: accepted."""
    def after(logits, k, scale):
        top, experts = logits.topk(k, dim=-1)
        return experts.int(), torch.softmax(top, -1) * scale
    assert check_route_top_k(after)


def test_router_mistakes_are_named():
    def no_renorm(logits, k, scale):
        top, experts = torch.softmax(logits, -1).topk(k)
        return experts, top * scale
    def no_scale(logits, k, scale):
        e, g = route_top_k(logits, k, scale)
        return e, g / scale
    def tokens_dim(logits, k, scale):
        top, experts = torch.softmax(logits, 0).topk(k)
        return experts, top / top.sum(-1, keepdim=True) * scale
    def overflow(logits, k, scale):
        top, experts = logits.topk(k)
        return experts, top.exp() / top.exp().sum(-1, keepdim=True) * scale
    def least(logits, k, scale):
        top, experts = torch.softmax(logits, -1).topk(k, largest=False)
        return experts, top / top.sum(-1, keepdim=True) * scale
    for fn, words in ((no_renorm, "no renormalisation"), (no_scale, "gate_scale is missing"),
                      (tokens_dim, "over the tokens"), (overflow, "overflowed"), (least, "LEAST probable")):
        r = check_route_top_k(fn)
        assert not r and words in r.message, (fn.__name__, r.message)
    r = check_route_top_k(lambda logits, k, scale: route_top_k(logits, k, scale)[1])
    assert not r and "(experts, gates)" in r.message
    r = check_route_top_k(lambda logits, k, scale: (route_top_k(logits, k, scale)[0].double(), 1))
    assert not r


def test_lora_linear_passes_in_the_engine_against_merged_models():
    r = check_lora_linear(lora_linear)
    assert r and r.kind == "core", r.message
    assert "each equal to its merged model" in r.message


def test_lora_mistakes_are_named():
    def swapped(x, W, slots, adapters):
        y = x @ W.T
        for s, (A, B, alpha) in adapters.items():
            rows = (slots == s).nonzero().squeeze(1)
            y[rows] += alpha / A.shape[0] * (x[rows] @ B) @ A
        return y
    cases = ((lambda *a: lora_linear(*a, scale=lambda alpha, r: alpha), "alpha, not alpha / r"),
             (lambda *a: lora_linear(*a, scale=lambda alpha, r: alpha / r ** 0.5), "rsLoRA"),
             (lambda *a: lora_linear(*a, scale=lambda alpha, r: 1.0), "no scaling"),
             (lambda *a: lora_linear(*a, rows_of=lambda rows: rows.flip(0)), "the update of row"),
             (lambda *a: lora_linear(*a) - a[0] @ a[1].T, "base output x W^T is missing"),
             (swapped, "A and B swapped"))
    for fn, words in cases:
        r = check_lora_linear(lambda x, W, slots, adapters, fn=fn: fn(x, W, slots, adapters))
        assert not r and words in r.message, (words, r.message)

    def every_row(x, W, slots, adapters):                  # slot -1 rows get an adapter too
        return lora_linear(x, W, slots.clamp_min(0), adapters)
    r = check_lora_linear(every_row)
    assert not r and "no adapter, slot -1" in r.message


def test_a_merged_copy_is_not_a_lora_linear():
    """The reviewer's answer: W + s B A built per adapter, then x (W + s B A)^T. Right numbers, wrong technique."""
    def merged(x, W, slots, adapters):
        y = x @ W.T
        for s, (A, B, alpha) in adapters.items():
            rows = (slots == s).nonzero().squeeze(1)
            y[rows] = x[rows] @ (W + alpha / A.shape[0] * B @ A).T
        return y
    r = check_lora_linear(merged)
    assert not r and "builds an (N, K) = (10, 6) matrix" in r.message and "(x A^T) B^T" in r.message


def test_warm_ups_pass_and_name_the_mistakes():
    def moe_params(dim, E, He, k):
        return E * 3 * dim * He + dim * E, k * 3 * dim * He + dim * E
    assert check_moe_params(moe_params)
    r = check_moe_params(lambda dim, E, He, k: (E * 3 * dim * He, k * 3 * dim * He))
    assert not r and "router" in r.message
    r = check_moe_params(lambda dim, E, He, k: (E * 2 * dim * He + dim * E, k * 2 * dim * He + dim * E))
    assert not r and "THREE" in r.message

    def lora_bytes(cfg, r, modules, b, kv=None):
        hd = cfg.n_heads * cfg.head_dim
        kv = cfg.kv_dim if kv is None else kv
        shapes = {"attention.wq": (hd, cfg.dim), "attention.wk": (kv, cfg.dim), "attention.wv": (kv, cfg.dim),
                  "attention.wo": (cfg.dim, hd), "feed_forward.w1": (cfg.hidden_dim, cfg.dim),
                  "feed_forward.w2": (cfg.dim, cfg.hidden_dim), "feed_forward.w3": (cfg.hidden_dim, cfg.dim)}
        return cfg.n_layers * b * sum(r * sum(shapes[m]) for m in modules)
    assert check_lora_bytes(lora_bytes)
    r = check_lora_bytes(lambda cfg, rank, mods, b: lora_bytes(cfg, rank, mods, b, kv=cfg.dim))
    assert not r and "GQA" in r.message
    r = check_lora_bytes(lambda cfg, rank, mods, b: lora_bytes(cfg, rank, mods, b) // cfg.n_layers)
    assert not r and "one layer" in r.message


def test_bad_student_code_fails_cleanly_then_passes():
    def boom(logits, top_k, gate_scale):
        raise RuntimeError("oops")
    r = check_route_top_k(boom)
    assert not r and "RuntimeError: oops" in r.message
    r = check_lora_linear(lambda x, W, slots, adapters: x @ W.T + x @ adapters[0][1])   # x (M, K) @ B (N, r)
    assert not r and "(x A^T) B^T" in r.message
    r = check_lora_linear(lambda x, W: x)
    assert not r and "wrong signature" in r.message
    assert check_route_top_k(route_top_k)
