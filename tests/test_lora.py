"""The LoRA op (minillm.lora.adapters): rows grouped per adapter == Punica's BGMV reference (each row gathers its own
adapter) == the merged weight W + s B A; a model whose rows use different adapters == each adapter's merged model;
the slot manager's LRU; training's single slot."""
import pytest
import torch
import torch.nn as nn
from close import assert_close

from minillm.formats.peft import load_adapter, save_adapter
from minillm.llama.linears import Int8Linear
from minillm.lora.adapters import (
    MODULES,
    LoRAAdapter,
    LoRAContext,
    LoRALinear,
    LoRASlots,
    attach_lora,
    load_slot,
    merge_lora,
    module_shapes,
)
from minillm.training.lora import adapter_of, lora_model, split_work


def random_adapter(cfg, rank: int, seed: int, modules=MODULES, name=None, scale: float = 0.2) -> LoRAAdapter:
    """Large random A and B (trained adapters start with B = 0, which would hide a wrong B)."""
    g, shapes = torch.Generator().manual_seed(seed), module_shapes(cfg)
    weights = {(i, m): (torch.randn(rank, shapes[m][1], generator=g) * scale,
                        torch.randn(shapes[m][0], rank, generator=g) * scale)
               for i in range(cfg.n_layers) for m in modules}
    return LoRAAdapter(name or f"random{seed}", rank, 2.0 * rank + seed, weights)


def bgmv(x, A, Bt, scaling, index):
    """Punica's BGMV, the reference: every row gathers its adapter's A (R, K) and B (N, R) and does two
    matrix-vector products. x (M, K), A (S, R, K), Bt (S, R, N) = B^T, scaling (S,), index (M,), -1 = none
    -> (M, N). Ranks below R are zero rows of A and Bt."""
    out = torch.zeros(x.shape[0], Bt.shape[2], dtype=x.dtype)
    for i, s in enumerate(index.tolist()):
        if s >= 0:
            out[i] = scaling[s] * (Bt[s].T @ (A[s] @ x[i]))              # (N, R) @ ((R, K) @ (K,))
    return out


def test_grouped_rows_equal_bgmv_and_the_merged_weight():
    torch.manual_seed(0)
    K, N, S, R = 24, 20, 3, 6                      # odd sizes, rank below R in one slot
    base = nn.Linear(K, N, bias=False).double()
    ctx = LoRAContext()
    lin = LoRALinear(base, ctx, S, R, torch.float64)
    ads = [(torch.randn(r, K, dtype=torch.float64), torch.randn(N, r, dtype=torch.float64), 2.0 / r) for r in (6, 3, 5)]
    for s, (a, b, sc) in enumerate(ads):
        lin.set_slot(s, a, b, sc)
    x = torch.randn(2, 7, K, dtype=torch.float64)                       # (B, T, K)
    index = torch.tensor([[0, 1, -1, 2, 1, 1, 0], [2, 2, -1, 0, 1, 0, 2]])   # (B, T) every slot, and none
    with ctx.use(index):
        y = lin(x)                                                      # (B, T, N)
    want = base(x).reshape(-1, N) + bgmv(x.reshape(-1, K), lin.A, lin.Bt, lin.scaling, index.reshape(-1))
    # float64, the same products in another order: rounding ~1e-16 per op
    assert_close(y.reshape(-1, N), want, atol=1e-12, rtol=1e-12, name="grouped vs BGMV")
    for (bi, t), s in zip(torch.cartesian_prod(torch.arange(2), torch.arange(7)).tolist(), index.reshape(-1).tolist()):
        w = base.weight if s < 0 else base.weight + ads[s][2] * ads[s][1] @ ads[s][0]      # (N, K) merged
        assert_close(y[bi, t], w @ x[bi, t], atol=1e-12, rtol=1e-12, name=f"row ({bi}, {t}) vs merged")
    with ctx.use(1):                                                    # one slot for every row: no gather
        assert_close(lin(x), x @ (base.weight + ads[1][2] * ads[1][1] @ ads[1][0]).T, atol=1e-12, rtol=1e-12)
    assert torch.equal(lin(x), base(x))                                 # outside use(): the base alone


def test_lora_on_a_quantized_base_adds_to_its_output():
    torch.manual_seed(1)
    q, _ = Int8Linear.from_linear(nn.Linear(32, 16, bias=False))
    ctx = LoRAContext()
    lin = LoRALinear(q, ctx, 2, 4)
    a, b = torch.randn(4, 32), torch.randn(16, 4)
    lin.set_slot(1, a, b, 0.5)
    x = torch.randn(3, 32)
    with ctx.use(torch.tensor([1, -1, 1])):
        y = lin(x)
    want = q(x) + torch.tensor([1.0, 0.0, 1.0])[:, None] * (0.5 * x @ a.T @ b.T)
    assert_close(y, want, atol=1e-5, rtol=1e-5, name="int8 + LoRA")   # float32 sums of 32 terms


def test_rows_with_different_adapters_equal_each_merged_model(tiny64):
    model, _ = tiny64
    cfg = model.config
    ads = [random_adapter(cfg, 4, 1), random_adapter(cfg, 8, 2, MODULES[:4]), random_adapter(cfg, 2, 3, MODULES[4:])]
    lm = attach_lora(model, 4, 8)
    shared = {id(p) for p in lm.parameters()}
    assert all(id(p) in shared for p in model.parameters())             # the base weights are shared, not copied
    for s, a in enumerate(ads):
        load_slot(lm, s, a)
    x = torch.randint(0, cfg.vocab_size, (4, 11))
    with lm.lora_context.use([2, -1, 0, 1], 11):
        y = lm(x)                                                        # (B, T, V)
    for b, a in enumerate([ads[2], None, ads[0], ads[1]]):
        want = (merge_lora(model, a) if a else model)(x[b:b + 1])[0]     # (T, V)
        # float64 through 2 layers: rounding ~1e-16 per op; logits are O(10)
        assert_close(y[b], want, atol=1e-10, rtol=1e-10, name=f"row {b}")
    assert torch.equal(model(x), lm(x))                                  # no context: the base model


def test_float32_rows_equal_merged_within_tolerance(tiny64):
    model, _ = tiny64
    m32 = model.float()
    a = random_adapter(m32.config, 8, 4)
    lm = attach_lora(m32, 2, 8)
    load_slot(lm, 1, a)
    x = torch.randint(0, m32.config.vocab_size, (2, 9))
    with lm.lora_context.use([1, -1], 9):
        y = lm(x)
    # float32: the merged weight rounds W + s B A once, the op adds s (x A^T) B^T to x W^T: ~1e-7 relative per op,
    # logits O(30) with these large random weights -> 1e-3 absolute
    assert_close(y[0], merge_lora(m32, a)(x[:1])[0], atol=1e-3, rtol=1e-4)
    assert_close(y[1], m32(x[1:])[0], atol=1e-3, rtol=1e-4)


def test_slots_are_lru_and_never_evict_an_adapter_in_use(tiny64):
    model, _ = tiny64
    lm = attach_lora(model, 2, 8)
    ads = {n: random_adapter(model.config, 2, i, name=n) for i, n in enumerate("abc")}
    slots = LoRASlots(lm, 2, 8, loader=lambda name: ads[name])
    a, b, c = (slots.get(n) for n in "abc")
    assert slots.get("a") is a and slots.get(random_adapter(model.config, 2, 0)) is a   # one object per content

    class Seq:      # what acquire reads of a live sequence
        def __init__(self, lora):
            self.lora = lora
    assert slots.acquire(a, []) and slots.acquire(b, [])
    assert (a.slot, b.slot) == (0, 1)
    assert not slots.acquire(c, [Seq(a), Seq(b)])                      # both in use: c waits
    assert slots.acquire(a, [Seq(b)])                                  # a is resident: touched, now most recent
    assert slots.acquire(c, [Seq(a)]) and c.slot == 1 and b.slot == -1   # b (least recent, unused) leaves
    assert slots.evictions == 1 and slots.loads == 3
    lin = lm.layers[0].attention.wq
    assert lin.ranks == [2, 2] and torch.equal(lin.A[1, :2], c.weights[(0, "attention.wq")][0])


def test_training_slot_starts_at_the_base_and_trains_only_a_and_b(tiny64, tmp_path):
    model, _ = tiny64
    lm, params = lora_model(model.float(), rank=4, alpha=8)
    x = torch.randint(0, model.config.vocab_size, (2, 8))
    assert torch.equal(lm(x), model.float()(x))                         # B = 0: the base model exactly
    assert len(params) == 2 * len(MODULES) * model.config.n_layers
    lm(x).square().mean().backward()
    assert all(p.grad is None for n, p in lm.named_parameters() if not n.endswith((".A", ".Bt")))
    assert all(p.grad is not None for p in params)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn_like(p) * 0.1)
    a = adapter_of(lm, "t", 4, 8)
    assert a.scaling == 2.0 and a.target_modules == list(MODULES)
    save_adapter(a, tmp_path, model.config)                             # B was stored transposed: saved contiguous
    assert load_adapter(tmp_path, model.config).digest == a.digest
    assert_close(lm(x), merge_lora(model.float(), a)(x), atol=1e-4, rtol=1e-4)   # float32, logits O(30)


@pytest.mark.parametrize("field,value", [("rank", 9), ("A", (4, 63)), ("B", (127, 4)), ("layer", 2)])
def test_check_adapter_names_the_shape_that_differs(tiny64, field, value):
    from minillm.lora.adapters import check_adapter
    model, _ = tiny64
    a = random_adapter(model.config, 4, 0, modules=("attention.wq",))
    if field == "rank":
        a.rank = value
        with pytest.raises(ValueError, match="rank r=9, more than max_lora_rank=8"):
            check_adapter(a, model.config, max_rank=8)
        return
    if field == "layer":
        a.weights[(2, "attention.wq")] = a.weights[(0, "attention.wq")]
        match = "layer 2, but this model has 2 layers"
    else:
        w = a.weights[(0, "attention.wq")]
        a.weights[(0, "attention.wq")] = (torch.zeros(value), w[1]) if field == "A" else (w[0], torch.zeros(value))
        match = (r"wq lora_A is \(4, 63\) but this model's wq has 64 inputs" if field == "A"
                 else r"wq lora_B is \(127, 4\) but this model's wq has 64 rows")
    with pytest.raises(ValueError, match=match):
        check_adapter(a, model.config)


def test_a_rank_above_the_layer_is_refused(tiny64):
    from minillm.lora.adapters import check_adapter
    model, _ = tiny64
    a = random_adapter(model.config, 65, 0, modules=("attention.wk",))     # wk is (32, 64): r <= 32
    with pytest.raises(ValueError, match=r"rank r=65, larger than layer 0 wk \(32 x 64\)"):
        check_adapter(a, model.config, max_rank=128)


def test_a_work_splits_at_a_line_past_its_middle_into_two_disjoint_halves():
    text = "".join(f"LINE {i}: {'word ' * (i % 7)}\n" for i in range(101))
    first, second = split_work(text)
    assert first + second == text                                   # nothing lost, nothing shared
    assert first.endswith("\n") and len(text) // 2 <= len(first) < len(text) // 2 + 50
    assert second.startswith("LINE ")                               # the held-out half starts on a whole line
