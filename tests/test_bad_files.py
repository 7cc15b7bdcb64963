"""Crafted and malformed model files: every one is refused with a ValueError (or FileNotFoundError) that names
the file, the field and the value, before anything large is allocated (DESIGN.md rule 12)."""
import json
import struct
import tracemalloc

import pytest
import torch

from minillm import load
from minillm.config import ModelConfig
from minillm.formats.hf import load_hf, pairs_to_hf, read_config
from minillm.formats.llama2c import expected_size, load_bin, save_bin
from minillm.llama.transformer import Transformer

MB = 1 << 20


def peak_bytes(fn):
    """(exception raised by fn(), peak Python/numpy bytes allocated while it ran)."""
    tracemalloc.start()
    try:
        fn()
    except Exception as e:                                            # noqa: BLE001 - the caller checks it
        err = e
    else:
        err = None
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return err, peak


def tiny_model(**kw):
    cfg = ModelConfig(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=40, max_seq_len=16, **kw)
    return Transformer(cfg).init_weights(seed=1)


# ---------------------------------------------------------------------------- llama2.c v0 and runq headers
def test_v0_header_claiming_a_million_layers_is_refused_cheaply(tmp_path):
    path = tmp_path / "m.bin"
    save_bin(tiny_model(), path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<i", data, 8, 10**6)                            # n_layers, the third header int
    path.write_bytes(bytes(data))
    err, peak = peak_bytes(lambda: load_bin(path))
    assert isinstance(err, ValueError), repr(err)
    assert peak < 50 * MB, f"refusing a {len(data)}-byte file peaked at {peak / MB:.0f} MB"
    want = expected_size(ModelConfig(dim=32, hidden_dim=48, n_layers=10**6, n_heads=4, n_kv_heads=2, vocab_size=40,
                                     max_seq_len=16))
    assert f"expected {want} bytes" in str(err) and f"found {len(data)}" in str(err)
    assert "n_layers=1000000" in str(err)


def test_v0_absurd_dimension_names_the_field(tmp_path):
    path = tmp_path / "m.bin"
    save_bin(tiny_model(), path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<i", data, 0, 2**30)                            # dim: wq alone would be 2^60 floats
    struct.pack_into("<i", data, 12, 2**20)                           # n_heads, so head_dim stays even
    struct.pack_into("<i", data, 16, 2**20)
    path.write_bytes(bytes(data))
    err, peak = peak_bytes(lambda: load_bin(path))
    assert isinstance(err, ValueError), repr(err)
    assert "wq (n_layers x dim x dim = 2 x 1073741824 x 1073741824) alone would be" in str(err)
    assert peak < 50 * MB


def test_runq_header_is_checked_against_the_file_size_before_reading_it(tmp_path):
    from minillm.formats.runq import HEADER_BYTES, load_runq, save_runq
    good = tmp_path / "q.bin"
    save_runq(tiny_model(), good, group_size=16)
    head = bytearray(good.read_bytes()[:HEADER_BYTES])
    struct.pack_into("<i", head, 16, 10**6)                           # n_layers (after magic, version, dim, hidden)
    bad = tmp_path / "bad.bin"
    with open(bad, "wb") as f:
        f.write(head)
        f.truncate(64 * MB)                                           # sparse: costs no disk, but read() would
    err, peak = peak_bytes(lambda: load_runq(bad))
    assert isinstance(err, ValueError), repr(err)
    assert peak < 16 * MB, f"refusing the file peaked at {peak / MB:.0f} MB: it was read before the size check"
    assert "n_layers=1000000" in str(err) and f"found {64 * MB}" in str(err)


# ---------------------------------------------------------------------------- Hugging Face directories
def write_hf(path, model, config_edits=None, tensor_edits=None):
    """A HF Llama directory for `model` (config.json + model.safetensors), with optional damage."""
    from safetensors.torch import save_file
    cfg = model.config
    c = dict(model_type="llama", hidden_size=cfg.dim, intermediate_size=cfg.hidden_dim, num_hidden_layers=cfg.n_layers,
             num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, vocab_size=cfg.vocab_size,
             max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
             tie_word_embeddings=cfg.shared_classifier)
    c.update(config_edits or {})
    sd = model.state_dict()
    t = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"]}
    if not cfg.shared_classifier:
        t["lm_head.weight"] = sd["output.weight"]
    theirs = {"attention_norm": "input_layernorm", "attention.wq": "self_attn.q_proj",
              "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
              "attention.wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
              "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj", "feed_forward.w3": "mlp.up_proj"}
    for i in range(cfg.n_layers):
        for ours, hf in theirs.items():
            w = sd[f"layers.{i}.{ours}.weight"]
            if ours in ("attention.wq", "attention.wk"):
                w = pairs_to_hf(w, cfg.n_heads if ours == "attention.wq" else cfg.n_kv_heads)
            t[f"model.layers.{i}.{hf}.weight"] = w
    t.update(tensor_edits or {})
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(c))
    save_file({k: v.contiguous().clone() for k, v in t.items()}, str(path / "model.safetensors"))
    return path


def test_a_well_formed_hf_directory_loads(tmp_path):
    model = tiny_model(shared_classifier=False)
    back = load_hf(write_hf(tmp_path / "m", model))
    x = torch.randint(0, 40, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x))


@pytest.mark.parametrize("edit,match", [
    ({"hidden_size": None}, r"config.json: hidden_size=None"),
    ({"num_attention_heads": 0}, r"config.json: num_attention_heads=0 must be a positive integer"),
    ({"num_hidden_layers": "2"}, r"config.json: num_hidden_layers='2' must be a positive integer"),
    ({"vocab_size": 4.5}, r"config.json: vocab_size=4.5 must be a positive integer"),
    ({"intermediate_size": True}, r"config.json: intermediate_size=True must be a positive integer"),
    ({"num_key_value_heads": 3}, r"config.json: .*n_heads=4 is not divisible by n_kv_heads=3"),
    ({"num_key_value_heads": 0}, r"config.json: num_key_value_heads=0 must be a positive integer"),
    ({"rms_norm_eps": "1e-5"}, r"config.json: rms_norm_eps='1e-5' must be a positive number"),
    ({"rope_scaling": "linear"}, r"config.json: rope_scaling='linear' must be a JSON object"),
    ({"head_dim": 0}, r"config.json: head_dim=0 must be a positive integer"),
])
def test_bad_config_values_name_the_file_field_and_value(tmp_path, edit, match):
    path = write_hf(tmp_path / "m", tiny_model(), config_edits=edit)
    with pytest.raises(ValueError, match=match):
        read_config(path)


def test_missing_config_fields_are_named(tmp_path):
    path = write_hf(tmp_path / "m", tiny_model())
    c = json.loads((path / "config.json").read_text())
    for field in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"):
        (path / "config.json").write_text(json.dumps({k: v for k, v in c.items() if k != field}))
        with pytest.raises(ValueError, match=rf"config.json: required field {field!r} is missing"):
            load_hf(path)


def test_config_that_is_not_a_json_object(tmp_path):
    path = write_hf(tmp_path / "m", tiny_model())
    (path / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(ValueError, match=r"config.json must hold a JSON object, found a list"):
        load_hf(path)
    (path / "config.json").write_text("{'hidden_size': 64,")
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        load_hf(path)
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        load(str(path))


def test_tensor_shapes_that_disagree_with_the_config(tmp_path):
    model = tiny_model()
    path = write_hf(tmp_path / "m", model, tensor_edits={"model.layers.1.self_attn.q_proj.weight": torch.zeros(30, 32)})
    with pytest.raises(ValueError, match=r"model.safetensors: tensor 'model.layers.1.self_attn.q_proj.weight' has "
                                         r"shape \(30, 32\), config.json implies \(32, 32\)"):
        load_hf(path)
    path = write_hf(tmp_path / "e", model, tensor_edits={"model.embed_tokens.weight": torch.zeros(41, 32)})
    with pytest.raises(ValueError,
                       match=r"'model.embed_tokens.weight' has shape \(41, 32\), config.json implies \(40, 32\)"):
        load_hf(path)
    path = write_hf(tmp_path / "n", model, tensor_edits={"model.layers.0.input_layernorm.weight": torch.zeros(2, 16)})
    with pytest.raises(ValueError, match=r"'model.layers.0.input_layernorm.weight' has shape \(2, 16\)"):
        load_hf(path)


def test_garbage_safetensors_file_is_named(tmp_path):
    path = write_hf(tmp_path / "m", tiny_model())
    (path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(ValueError, match=r"model.safetensors: not a readable safetensors file"):
        load_hf(path)


@pytest.mark.parametrize("shard", ["/etc/passwd", "../outside.safetensors", "sub/../../outside.safetensors"])
def test_shard_index_may_not_point_outside_the_model_directory(tmp_path, shard):
    path = write_hf(tmp_path / "m", tiny_model())
    (path / "model.safetensors").rename(tmp_path / "outside.safetensors")
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"model.norm.weight": shard}}))
    with pytest.raises(ValueError, match=rf"shard {shard!r} .* outside the model directory"):
        load_hf(path)


def test_sharded_directory_loads_and_names_a_missing_shard(tmp_path):
    model = tiny_model(shared_classifier=False)
    path = write_hf(tmp_path / "m", model)
    (path / "model.safetensors").rename(path / "model-00001-of-00001.safetensors")
    from safetensors.torch import load_file
    keys = load_file(str(path / "model-00001-of-00001.safetensors"))
    index = {"weight_map": {k: "model-00001-of-00001.safetensors" for k in keys}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    x = torch.randint(0, 40, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(load_hf(path)(x), model(x))
    index["weight_map"]["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        load_hf(path)
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["a"]}))
    with pytest.raises(ValueError,
                       match=r"model.safetensors.index.json: weight_map must map tensor names to shard files"):
        load_hf(path)


# ---------------------------------------------------------------------------- minillm.load's arguments
@pytest.mark.parametrize("bad", [None, 5, 3.0, ["random:tiny"], b"random:tiny"])
def test_load_names_a_model_argument_of_the_wrong_type(bad):
    with pytest.raises(ValueError, match=rf"model= must be .*; got {type(bad).__name__}"):
        load(bad)


@pytest.mark.parametrize("bad", [5, {"path": "tokenizer.bin"}, 2.5])
def test_load_names_a_tokenizer_argument_of_the_wrong_type(bad):
    with pytest.raises(ValueError, match=rf"tokenizer= must be .*; got {type(bad).__name__}"):
        load("random:tiny", tokenizer=bad)


def test_load_still_takes_what_it_took(tmp_path):
    model, tok = load("random:tiny")
    net, tok2 = load(model, tokenizer=tok)
    assert net is model and tok2 is tok
    save_bin(model, tmp_path / "m.bin")
    tok.save(str(tmp_path / "tokenizer.bin"))
    net, _ = load(tmp_path / "m.bin")                                  # a PathLike
    assert net.config.to_dict() == model.config.to_dict()


def test_a_malformed_tokenizer_json_names_the_file(tmp_path):
    from minillm.formats.hf import HFTokenizer
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {')
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a tokenizer.json the tokenizers library can read"):
        HFTokenizer(str(tmp_path))


def test_the_shard_index_decides_where_each_tensor_comes_from(tmp_path):
    """N5: a shard b holding zeroed copies of every tensor, and an index naming b for one of them, loaded a model
    with 0 tensors right (every shard was read, later files won). Each tensor must be in the shard the index names,
    and only there."""
    from safetensors.torch import load_file, save_file
    model = tiny_model(shared_classifier=False)
    path = write_hf(tmp_path / "m", model)
    real = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").rename(path / "a.safetensors")
    save_file({k: torch.zeros_like(v) for k, v in real.items()}, str(path / "b.safetensors"))
    index = {"weight_map": {k: "a.safetensors" for k in real}}
    index["weight_map"]["model.norm.weight"] = "b.safetensors"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"a\.safetensors holds model\.norm\.weight, which .* puts in b\.safetensors"):
        load_hf(path)
    save_file({"model.norm.weight": real["model.norm.weight"]}, str(path / "b.safetensors"))
    save_file({k: v for k, v in real.items() if k not in ("model.norm.weight", "lm_head.weight")},
              str(path / "a.safetensors"))
    with pytest.raises(ValueError, match=r"names 1 tensors its shards do not hold, e\.g\. lm_head\.weight"):
        load_hf(path)


def test_non_finite_weights_are_refused_when_read(tmp_path):
    model = tiny_model()
    bad = model.state_dict()["layers.0.ffn_norm.weight"].clone()
    bad[3] = float("nan")
    path = write_hf(tmp_path / "m", model, tensor_edits={"model.layers.0.post_attention_layernorm.weight": bad})
    with pytest.raises(ValueError, match="post_attention_layernorm.weight holds NaN or infinite values"):
        load_hf(path)
