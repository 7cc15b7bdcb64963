"""Weight-only int8 / int4: quantizer error bounds, exact int4 packing, the drop-in linear (single-row
GEMV path == batched torch path), the shipped model's logits under each scheme, and bad input."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels.quant_gemv import quantize_int4, quantize_int8

from minillm import LLM, SamplingParams, load
from minillm.llama.linears import Int4Linear, Int8Linear
from minillm.quantization.quantize import quantize_model


def test_quantizers_stay_within_half_a_step_per_element():
    w = np.random.default_rng(0).standard_normal((48, 256)).astype(np.float32) * 0.05
    q, s, err = quantize_int8(w)
    deq = q.astype(np.float64) * s[:, None]
    assert np.all(np.abs(deq - w) <= s[:, None] / 2 + 1e-9) and err == pytest.approx(np.abs(deq - w).max())
    for g in (32, 64, 128):
        packed, s4, err4 = quantize_int4(w, g)
        lin = Int4Linear(torch.from_numpy(packed), torch.from_numpy(s4), g)
        deq4 = lin.dequantize(torch.float64).numpy()
        step = np.repeat(s4, g, axis=1)
        assert np.all(np.abs(deq4 - w) <= step / 2 + 1e-9), f"group {g}"
        assert err4 == pytest.approx(np.abs(deq4 - w).max())


def test_int4_packing_round_trips_exactly():
    """DESIGN.md's layout, byte by byte: even k in the low nibble, odd k in the high one, each stored q + 8."""
    q = np.random.default_rng(1).integers(-8, 8, size=(5, 64))               # every nibble value, -8 included
    u = (q + 8).astype(np.uint8)
    packed = u[:, 0::2] | (u[:, 1::2] << 4)                                  # (5, 32) packed by hand
    ones = torch.ones(5, 2)
    back = Int4Linear(torch.from_numpy(packed), ones, 32).dequantize().numpy()
    assert np.array_equal(back, q.astype(np.float32))
    w = np.clip(q, -7, 7).astype(np.float32)
    w[:, 0] = w[:, 32] = 7.0                                                 # absmax 7 per group: scale exactly 1
    got, s, err = quantize_int4(w, 32)
    uw = (w.astype(np.int64) + 8).astype(np.uint8)
    assert np.all(s == 1.0) and err == 0.0 and np.array_equal(got, uw[:, 0::2] | (uw[:, 1::2] << 4))


@pytest.mark.parametrize("make", [lambda lin: Int8Linear.from_linear(lin)[0],
                                  lambda lin: Int4Linear.from_linear(lin, 32)[0]],
                         ids=["int8", "int4"])
def test_one_row_gemv_path_equals_the_batched_torch_path(make):
    lin = torch.nn.Linear(96, 40, bias=False)
    q = make(lin)
    x = torch.randn(3, 96)
    batched = q(x)                                                            # dequantize + torch matmul
    rows = torch.cat([q(x[i:i + 1]) for i in range(3)])                      # the numba GEMV, one row each
    # float32, 96 products summed in another order: 1e-5 is ~100 ulps at these magnitudes
    assert_close(rows, batched, atol=1e-5, rtol=1e-5, name="gemv vs dequantized matmul")
    assert_close(batched, x @ q.dequantize().T, atol=1e-5, rtol=1e-5, name="against its own dequantized weight")


@pytest.fixture(scope="module")
def shipped():
    return load("shakespeare")


def val_loss(model, tok):
    """Mean cross-entropy over the packaged held-out slice, in 256-token windows (as the model card)."""
    import os

    from minillm.formats.loader import MODELS_DIR
    ids = torch.tensor(tok.encode(open(os.path.join(MODELS_DIR, "val_slice.txt")).read()))
    n = (len(ids) - 1) // 256
    x, y = ids[:n * 256].view(n, 256), ids[1:n * 256 + 1].view(n, 256)
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()


# The goals, on the shipped model: int8 (per channel) within 0.5% perplexity of float32, int4
# (groups of 32) within 3%. Measured: int8 -0.01%, int4 g32 +1.72% (g64 +2.13%, g128 +2.21%), and q8_0
# (runq.c's scheme, groups of 64, activations quantized too) -0.02%.
@pytest.mark.parametrize("scheme,cfg,max_dppl,min_shrink", [("int8", None, 0.005, 3.9),
                                                              ("int4", {"group_size": 32}, 0.03, 6.0),
                                                              ("q8_0", None, 0.005, 3.7)])
def test_quantized_shipped_model_perplexity(shipped, scheme, cfg, max_dppl, min_shrink):
    model, tok = shipped
    qmodel, report = quantize_model(model, scheme, cfg)
    base, quant = val_loss(model, tok), val_loss(qmodel, tok)
    dppl = np.exp(quant - base) - 1
    assert dppl <= max_dppl, f"{scheme}: perplexity +{dppl:.2%}, goal <= {max_dppl:.1%}"
    assert report["linear_bytes"] * min_shrink < report["linear_bytes_fp32"]
    assert set(report["max_abs_error"]) >= {"layers.0.attention.wq", "output"}
    assert next(model.parameters()).dtype == torch.float32 and isinstance(model.output, torch.nn.Linear)  # untouched


def test_engine_serves_a_quantized_model(shipped):
    model, tok = shipped
    llm = LLM(model, tokenizer=tok, quantization="int4", quant_config={"group_size": 64})
    out = llm.generate(["To be, or not to be", "ROMEO."], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [8, 8] and llm.engine.quant_report["group_size"] == 64


@pytest.mark.parametrize("kw,match", [
    (dict(quantization="int4", quant_config={"group_size": 48}), r"group_size must be one of \(32, 64, 128\), got 48"),
    (dict(quantization="int4", quant_config={"groups": 32}), r"unknown quant_config keys \['groups'\]"),
    (dict(quantization="int3"), r"EngineConfig.quantization='int3' is not one of"),
    (dict(quantization="awq", quant_config={"group_size": 48}), r"awq \(int4\) group_size must be one of"),
    (dict(quantization="smoothquant", quant_config={"alpha": 1.5}), r"smoothquant alpha must be in \[0, 1\], got 1.5"),
    (dict(quantization="int8", backend="cuda"), r"backend='cuda' does not run quantization='int8' yet; backends that "
                                                r"do: torch, numba"),
    (dict(quantization="awq", backend="numba"), r"backend='numba' does not run quantization='awq' yet")])
def test_bad_quantization_options_name_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        LLM("random:tiny", **kw)


def test_w8a8_is_integer_arithmetic_and_smoothing_preserves_the_product():
    from minillm.llama.linears import W8A8Linear
    from minillm.quantization.calibration import smoothing_factors
    lin = torch.nn.Linear(64, 24, bias=False)
    x = torch.randn(5, 64)
    q = W8A8Linear.from_linear(lin)[0]
    xs = x.abs().amax(-1, keepdim=True) / 127
    want = (torch.round(x / xs).double() @ q.w_q.double().T) * xs.double() * q.w_scale.double()
    assert_close(q(x), want.float(), atol=1e-5, rtol=1e-5, name="w8a8")
    s = smoothing_factors(x.abs().amax(0) * 10, lin.weight, 0.5)
    with torch.no_grad():
        # exact arithmetic: (x / s) (W diag(s))^T = x W^T; in float32 only rounding differs
        assert_close((x / s) @ (lin.weight * s).T, x @ lin.weight.T, atol=1e-4, rtol=1e-4, name="smoothing")


def test_smoothquant_rescues_w8a8_from_outlier_channels(shipped):
    """The shipped model has no activation outliers: naive W8A8 costs ~0 (measured -0.02%). Give it
    outlier channels without changing its function (quant.with_outlier_channels: 3 channels x 60) and
    per-token int8 activations break (measured +3.5% perplexity), while SmoothQuant (alpha 0.5) stays
    within 0.1% (measured +0.07%). Bounds: naive > 1%, SmoothQuant < 0.5%."""
    from minillm.quantization.calibration import with_outlier_channels
    model, tok = shipped
    twin = with_outlier_channels(model)
    assert abs(val_loss(twin, tok) - val_loss(model, tok)) < 1e-4                # the same function
    base = val_loss(twin, tok)
    naive = np.exp(val_loss(quantize_model(twin, "w8a8")[0], tok) - base) - 1
    smooth = np.exp(val_loss(quantize_model(twin, "smoothquant", {"alpha": 0.5}, tok)[0], tok) - base) - 1
    assert naive > 0.01 and smooth < 0.005, (naive, smooth)


def test_awq_never_loses_to_plain_int4_on_its_own_calibration_objective():
    """Both AWQ searches include the plain choice (a = 0 is s = 1; clip fraction 1 is no clipping), so
    each layer's calibration output error can only shrink; and the module's one-row (GEMV) and batched
    paths agree. Whether that carries over to held-out perplexity is measured by `bench quant`."""
    from minillm.llama.linears import AWQLinear
    from minillm.quantization.awq import awq_clip, awq_quantize, awq_scales, fake_int4
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 128, generator=g) * 0.05
    x = torch.randn(256, 128, generator=g) * torch.linspace(0.1, 5.0, 128)          # some channels matter more
    packed, sc, _ = quantize_int4(w.numpy(), 32)
    plain = Int4Linear(torch.from_numpy(packed), torch.from_numpy(sc), 32).dequantize()
    # the search's quantizer is the real one
    assert torch.equal(fake_int4(w, 32), plain)
    out_err = lambda wq: ((x @ wq.T - x @ w.T) ** 2).mean().item()                  # noqa: E731
    s, a, err = awq_scales(w, x, 32)
    assert err <= out_err(plain) + 1e-12 and 0.0 < a <= 1.0
    bound = awq_clip(w * s, x / s, 32)                                              # (48, 4)
    full = (w * s).reshape(48, 4, 32).abs().amax(-1)
    assert (bound <= full).all() and (bound >= 0.5 * full).all() and (bound < full).any()
    awq, max_err = awq_quantize(w, x, 32)
    assert isinstance(awq, AWQLinear) and out_err(awq.dequantize()) < err <= out_err(plain)
    assert max_err == pytest.approx((awq.dequantize() - w).abs().max().item())
    rows = torch.cat([awq(x[i:i + 1]) for i in range(4)])
    assert_close(rows, awq(x[:4]), atol=1e-4, rtol=1e-4, name="awq one-row vs batched")
    assert_close(awq(x[:4]), x[:4] @ awq.dequantize().T, atol=1e-4, rtol=1e-4, name="awq vs its weight")


def test_quantizing_a_non_float32_model_names_the_dtype():
    with pytest.raises(ValueError, match=r"quantization='int8' quantizes float32 weights; this model is torch.float64"):
        LLM("random:tiny", quantization="int8", dtype="float64")
