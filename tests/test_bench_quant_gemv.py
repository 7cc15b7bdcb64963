"""minillm.bench.quant's memory-bound regime (notebook 07): bench_gemv's shape and units, the layer sizes it
reads, the cache size it sizes them by, and bench_quant without its timings. No timing is compared here."""
import math

import numpy as np
import pytest
import torch

from minillm.bench import quant
from minillm.bench.quant import (
    GEMV_FORMATS,
    _size_bytes,
    bench_gemv,
    gemv_layer_bytes,
    gemv_layers,
    last_level_cache_bytes,
)
from minillm.llama.linears import Int4Linear, Int8Linear


def test_bench_gemv_reports_bytes_seconds_and_bandwidth_per_format():
    res = bench_gemv(shape=(64, 128), layers=3, repeats=2)
    assert res["shape"] == (64, 128) and res["layers"] == 3 and res["repeats"] == 2
    assert res["threads"] == torch.get_num_threads()
    assert list(res["rows"]) == list(GEMV_FORMATS)
    for fmt, r in res["rows"].items():
        assert r["weight_bytes"] == 3 * gemv_layer_bytes(fmt, 64, 128)                 # all layers, scales included
        assert r["seconds"] > 0
        assert r["ms_per_token"] == pytest.approx(r["seconds"] * 1e3)
        assert r["gb_s"] == pytest.approx(r["weight_bytes"] / r["seconds"] / 1e9)
        assert r["speedup"] == pytest.approx(res["rows"]["fp32"]["seconds"] / r["seconds"])
    assert res["rows"]["fp32"]["speedup"] == 1.0


def test_layer_bytes_by_format():
    N, K = 256, 512
    assert gemv_layer_bytes("fp32", N, K) == 4 * N * K
    assert gemv_layer_bytes("int8", N, K) == N * K + 4 * N                             # a float32 scale per row
    assert gemv_layer_bytes("int4 g32", N, K) == N * K // 2 + 4 * N * (K // 32)        # a scale per group of 32
    with pytest.raises(ValueError, match="unknown GEMV format"):
        gemv_layer_bytes("int3", N, K)


def test_gemv_layers_are_the_engines_weight_types_in_their_own_memory():
    for fmt, kind in [("fp32", torch.nn.Linear), ("int8", Int8Linear), ("int4 g32", Int4Linear)]:
        mods = gemv_layers(fmt, 32, 64, 2)
        assert len(mods) == 2 and all(isinstance(m, kind) for m in mods)
        nbytes = sum(b.numel() * b.element_size() for m in mods for b in list(m.parameters()) + list(m.buffers()))
        assert nbytes == 2 * gemv_layer_bytes(fmt, 32, 64)
        a, b = (next(iter(list(m.parameters()) + list(m.buffers()))) for m in mods)
        assert a.data_ptr() != b.data_ptr() and torch.equal(a, b)                       # copies, not views
        x = torch.randn(1, 64)
        y = mods[0](x)
        assert y.shape == (1, 32)
        w = mods[0].weight if fmt == "fp32" else mods[0].dequantize()
        np.testing.assert_allclose(y.detach().numpy(), (x @ w.T).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_default_layers_put_every_format_beyond_the_cache():
    res = bench_gemv(shape=(64, 64), repeats=1, llc_bytes=100_000)
    smallest = min(gemv_layer_bytes(f, 64, 64) for f in GEMV_FORMATS)
    assert res["layers"] == math.ceil(1.5 * 100_000 / smallest)
    assert res["llc_bytes"] == 100_000
    assert all(r["weight_bytes"] >= 1.5 * 100_000 for r in res["rows"].values())


def test_cache_sizes_parse_and_an_unknown_cache_is_none(monkeypatch):
    assert _size_bytes("32768K\n") == 32 << 20
    assert _size_bytes("32 MiB (1 instance)") == 32 << 20
    assert _size_bytes("512 KB") == 512 << 10
    assert _size_bytes("none") is None
    size = last_level_cache_bytes()
    assert size is None or (isinstance(size, int) and size > 0)
    monkeypatch.setattr(quant.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(quant.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(OSError("no lscpu")))
    assert last_level_cache_bytes() is None
    monkeypatch.setattr(quant, "DEFAULT_LLC", 10_000)                                   # (32 MiB: too slow here)
    res = bench_gemv(shape=(32, 32), repeats=1)                                          # sized for DEFAULT_LLC
    assert res["llc_bytes"] is None
    assert res["layers"] == math.ceil(1.5 * 10_000 / min(gemv_layer_bytes(f, 32, 32) for f in GEMV_FORMATS))


def test_lscpu_gives_the_last_level_per_instance(monkeypatch):
    class Out:
        stdout = "L1d cache: 64 KiB (2 instances)\nL2 cache: 1 MiB (2 instances)\nL3 cache: 64 MiB (2 instances)\n"
    monkeypatch.setattr(quant.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(quant.subprocess, "run", lambda *a, **k: Out())
    assert last_level_cache_bytes() == 32 << 20


def test_bench_gemv_rejects_nonsense():
    with pytest.raises(ValueError):
        bench_gemv(shape=(16, 16), layers=0)
    with pytest.raises(ValueError):
        bench_gemv(shape=(16, 16), layers=1, repeats=0)


def test_bench_quant_without_timings_keeps_quality_and_bytes(capsys):
    res = quant.bench_quant("shakespeare", windows=1, speed=False, schemes=quant.SCHEMES[:2])
    assert res["speed"] is False and list(res["runs"]) == ["fp32", "int8"]
    for r in res["runs"].values():
        assert {"perplexity", "delta_ppl", "weight_bytes", "weight_ratio", "kv_ratio"} <= set(r)
        assert "decode_tok_s" not in r and "decode_speedup" not in r
    assert res["runs"]["int8"]["weight_ratio"] < 0.45
    quant.print_table(res)
    out = capsys.readouterr().out
    assert "tok/s" not in out and "int8" in out
