"""The MoE file (minillm.formats.moe): experts and routers in fp16 beside the dense .bin they were upcycled from;
round trip, loading by path and by the registered name, the engine on torch, and damaged or mismatched files."""
import json
import os
import shutil
import struct

import pytest
import torch

import minillm
from minillm.backends.capabilities import CAPABILITIES, check_model
from minillm.formats.llama2c import save_bin
from minillm.formats.loader import MODELS_DIR, random_model
from minillm.formats.moe import load_moe, read_metadata, save_moe
from minillm.moe.experts import MoEConfig, moe_config, moe_layers, upcycle


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """tiny dense base.bin, and moe.safetensors upcycled from it (router and experts perturbed, so a loader that
    dropped them would be caught)."""
    d = tmp_path_factory.mktemp("moe")
    dense, tok = random_model("tiny", seed=5)
    save_bin(dense, d / "base.bin")
    model = upcycle(dense, MoEConfig(4, 2, 48, partition="contiguous"))
    with torch.no_grad():
        for p in (p for layer in moe_layers(model) for p in layer.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.01)
    save_moe(model, d / "moe.safetensors", d / "base.bin")
    return d, model, tok


def fp16_rounded(model):
    """The model as the file holds it: MoE weights rounded to fp16, the base's float32 weights as they were."""
    import copy
    m = copy.deepcopy(model)
    with torch.no_grad():
        for layer in moe_layers(m):
            for p in layer.parameters():
                p.copy_(p.half().float())
    return m.eval()


def test_round_trip_is_exact_up_to_the_fp16_storage(files):
    d, model, _ = files
    loaded = load_moe(d / "moe.safetensors")
    assert moe_config(loaded).to_dict() == moe_config(model).to_dict()
    x = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        assert torch.equal(loaded(x), fp16_rounded(model)(x))     # same weights, same code: bit for bit
    meta = read_metadata(d / "moe.safetensors")
    assert meta["base"] == "base.bin" and json.loads(meta["moe"])["top_k"] == 2


def test_minillm_load_and_the_engine_take_the_file_by_path(files):
    d, model, tok = files
    net, _ = minillm.load(str(d / "moe.safetensors"), tokenizer=tok)
    assert moe_layers(net)
    llm = minillm.LLM(str(d / "moe.safetensors"), tokenizer=tok, max_model_len=64)
    assert "'torch'" in llm.engine.backend_choice and "numba" in llm.engine.backend_choice   # auto skipped numba
    out = llm.generate([[1, 5, 9]], minillm.SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 5


def test_backends_without_moe_refuse_it_by_name(files):
    d, model, _ = files
    assert CAPABILITIES["torch"].moe and not CAPABILITIES["numba"].moe
    with pytest.raises(ValueError, match="backend='numba' does not run a mixture-of-experts FFN "
                                         ".*layers.0.feed_forward.*torch"):
        check_model(model, "numba")


def _copy(d, tmp_path, name="moe.safetensors"):
    shutil.copy(d / "moe.safetensors", tmp_path / name)
    shutil.copy(d / "base.bin", tmp_path / "base.bin")
    return tmp_path / name


def test_truncated_file_is_refused(files, tmp_path):
    path = _copy(files[0], tmp_path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-100])
    with pytest.raises(ValueError, match="damaged or truncated"):
        load_moe(path)


def test_missing_base_is_named(files, tmp_path):
    path = _copy(files[0], tmp_path)
    os.remove(tmp_path / "base.bin")
    with pytest.raises(FileNotFoundError, match="dense base 'base.bin'"):
        load_moe(path)


def test_another_base_is_refused_by_checksum(files, tmp_path):
    path = _copy(files[0], tmp_path)
    other, _ = random_model("tiny", seed=6)
    save_bin(other, tmp_path / "base.bin")
    with pytest.raises(ValueError, match="sha256 .* belong to another model"):
        load_moe(path)


def _rewrite_header(path, edit):
    """Edit the safetensors JSON header in place (padded to its old length, as the format allows)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    open(path, "wb").write(raw[:8] + text.ljust(n) + raw[8 + n:])


def test_a_tensor_of_the_wrong_shape_is_named(files, tmp_path):
    path = _copy(files[0], tmp_path)

    def edit(h):     # same bytes, claimed as another shape: (4, 48, 64) -> (4, 64, 48)
        h["layers.0.feed_forward.w1"]["shape"] = [4, 64, 48]
    _rewrite_header(path, edit)
    with pytest.raises(ValueError, match=r"layers.0.feed_forward.w1 should be \(4, 48, 64\) float16, found "
                                         r"\(4, 64, 48\)"):
        load_moe(path)


def test_another_version_and_a_plain_file_are_refused(files, tmp_path):
    path = _copy(files[0], tmp_path)
    _rewrite_header(path, lambda h: h["__metadata__"].update(version="9"))
    with pytest.raises(ValueError, match="version '9'"):
        load_moe(path)
    with pytest.raises(ValueError, match="not a minillm-moe file"):
        load_moe(files[0] / "base.bin")


# ---------------------------------------------------------------------------- the shipped model
SHIPPED = os.path.join(MODELS_DIR, "shakespeare-moe.safetensors")


def test_shipped_file_holds_only_experts_and_routers_under_10_MB():
    """8 layers x 3 x 256 x 768 fp16 = 9,437,184 bytes of experts + 8 x 4 x 256 fp16 routers + a small header."""
    size = os.path.getsize(SHIPPED)
    assert 8 * 3 * 256 * 768 * 2 + 8 * 4 * 256 * 2 < size < 10_000_000
    meta = read_metadata(SHIPPED)
    assert meta["base"] == "shakespeare.bin" and json.loads(meta["moe"]) == {
        "n_experts": 4, "top_k": 2, "expert_hidden": 192, "gate_scale": 2.0, "partition": "cluster"}


def test_shipped_model_loads_by_name_and_matches_its_card():
    """The card's val_slice loss was measured on this file; 1e-4 nats allows float32 summation order only."""
    model, tok = minillm.load("shakespeare-moe")
    dense, _ = minillm.load("shakespeare")
    assert moe_config(model).top_k == 2 and "shakespeare-moe" in minillm.available_models()
    for name, p in dense.named_parameters():          # every weight but the FFNs is the dense file's
        if ".feed_forward." not in name:
            assert torch.equal(p, model.get_parameter(name)), name
    from minillm.bench.quant import held_out_windows
    from minillm.training.train import evaluate
    card = json.load(open(os.path.join(MODELS_DIR, "card.json")))["models"]["shakespeare-moe"]
    x, y = held_out_windows(tok, 256, 4)
    assert evaluate(model, x, y) == pytest.approx(card["val_slice_loss_4_windows"], abs=1e-4)


def test_nan_experts_are_refused_when_read(files, tmp_path):
    """N6's finite check for MoE files too: a NaN in one expert would make every token routed there NaN."""
    from safetensors.torch import load_file, save_file
    d, model, _ = files
    path = _copy(d, tmp_path)
    tensors = load_file(path)
    tensors["layers.1.feed_forward.w2"][3, 0, 0] = float("nan")
    save_file(tensors, path, metadata=read_metadata(d / "moe.safetensors"))
    with pytest.raises(ValueError, match=r"tensor layers.1.feed_forward.w2 holds NaN or infinite values"):
        load_moe(path)
