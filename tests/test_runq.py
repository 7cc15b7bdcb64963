"""Q8_0 as llama2.c's runq.c: its matmul emulated exactly, its version-2 file written and read back,
bad files refused, and the shipped model's perplexity under it."""
import struct

import numpy as np
import pytest
import torch

from minillm import load
from minillm.formats.llama2c import load_bin
from minillm.formats.loader import load_checkpoint
from minillm.formats.runq import load_runq, save_runq
from minillm.llama.linears import Q80Linear, q80_group_size, q80_quantize
from minillm.quantization.quantize import quantize_model


def runq_matmul(x, wq, ws, gs):
    """runq.c's quantize() + matmul(), transcribed to numpy float32 scalars: the reference."""
    n = x.shape[0]
    xq, xs = np.zeros(n, np.int32), np.zeros(n // gs, np.float32)
    for g in range(n // gs):
        grp = x[g * gs:(g + 1) * gs]
        wmax = np.float32(np.abs(grp).max())
        xs[g] = wmax / np.float32(127.0)
        for i in range(gs):
            v = float(grp[i] / xs[g])                                       # float32 division, then C's round()
            xq[g * gs + i] = int(np.sign(v) * np.floor(abs(v) + 0.5))
    out = np.zeros(wq.shape[0], np.float32)
    for i in range(wq.shape[0]):
        val = np.float32(0.0)
        for g in range(n // gs):
            ival = int(np.dot(xq[g * gs:(g + 1) * gs].astype(np.int64), wq[i, g * gs:(g + 1) * gs].astype(np.int64)))
            val = np.float32(val + np.float32(np.float32(ival) * ws[i, g]) * xs[g])
        out[i] = val
    return out


def test_q80_linear_is_runq_matmul_bit_for_bit():
    rng = np.random.default_rng(0)
    w = torch.from_numpy(rng.standard_normal((24, 128), dtype=np.float32))
    q, s, _ = q80_quantize(w, 32)
    lin = Q80Linear(q, s, 32)
    for x in rng.standard_normal((3, 128), dtype=np.float32) * np.array([[1.0], [100.0], [1e-3]], np.float32):
        want = runq_matmul(x, q.numpy(), s.numpy(), 32)
        assert np.array_equal(lin(torch.from_numpy(x)[None])[0].numpy(), want)


def test_q80_quantize_rounds_half_away_from_zero_and_bounds_the_error():
    x = torch.tensor([[127.0, 0.5, -0.5, 1.5, -2.5, 63.5, 0.0, -127.0]])      # scale 1: exact halves
    q, s, err = q80_quantize(x, 8)
    assert q.tolist() == [[127, 1, -1, 2, -3, 64, 0, -127]] and s.tolist() == [[1.0]] and err == 0.5
    assert q80_group_size(288) == 32 and q80_group_size(256) == 64 and q80_group_size(48) == 16
    w = torch.randn(16, 64)
    q, s, err = q80_quantize(w, 32)
    step = s.repeat_interleave(32, dim=1)
    assert bool(((q.float() * step - w).abs() <= step / 2 + 1e-7).all())


@pytest.fixture(scope="module")
def shipped():
    return load("shakespeare")


def test_runq_file_round_trips_into_the_quantized_model(shipped, tmp_path):
    model, tok = shipped
    errors = save_runq(model, tmp_path / "q.bin")
    assert max(errors.values()) < 0.01 and set(errors) >= {"tok_embeddings", "layers.7.feed_forward.w2"}
    back = load_checkpoint(tmp_path / "q.bin")                # load_checkpoint recognises the 'ak42' magic
    qmodel = quantize_model(model, "q8_0")[0]
    ids = torch.tensor([tok.encode("ROMEO. But soft, what light")])
    with torch.no_grad():
        assert torch.equal(back(ids), qmodel(ids))           # same int8 values, scales, dequantized embedding
        assert (back(ids) - model(ids)).abs().max() < 1.0     # measured 0.24 on these tokens


def test_bad_runq_files_name_what_is_wrong(shipped, tmp_path):
    model, _ = shipped
    good = tmp_path / "q.bin"
    save_runq(model, good)
    data = bytearray(good.read_bytes())
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(data[:4]) + struct.pack("<i", 1) + bytes(data[8:]))
    with pytest.raises(ValueError, match="version 1; runq.c reads version 2"):
        load_runq(bad)
    bad.write_bytes(b"abcd" + bytes(data[4:]))
    with pytest.raises(ValueError, match=r"magic 0x64636261 is not runq.c's 0x616b3432"):
        load_runq(bad)
    bad.write_bytes(bytes(data[:-10]))
    with pytest.raises(ValueError, match=r"expected \d+ bytes for the shape in its header, found \d+"):
        load_checkpoint(bad)
    with pytest.raises(ValueError, match="group size 48 does not divide"):
        save_runq(model, tmp_path / "x.bin", group_size=48)


def test_run_cli_reads_a_runq_file(data_dir, tmp_path, capfdbinary):
    from minillm.__main__ import main
    save_runq(load_bin(f"{data_dir}/golden.bin"), tmp_path / "g.bin")
    rc = main(["run", str(tmp_path / "g.bin"), "-z", f"{data_dir}/golden_tok.bin", "-t", "0", "-n", "20",
               "-i", "Hamlet"])
    out, err = capfdbinary.readouterr()
    assert rc == 0 and out.startswith(b"Hamlet") and err.startswith(b"achieved tok/s")
