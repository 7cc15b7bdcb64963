"""llama2.c .bin v0 and HF safetensors: write -> read identity, corrupt files, HF parity with transformers."""
import json
import os

import pytest
import torch
from close import assert_close

from minillm.config import ModelConfig
from minillm.formats.hf import hf_to_pairs, load_hf, pairs_to_hf, read_config
from minillm.formats.llama2c import expected_size, load_bin, save_bin
from minillm.llama.transformer import Transformer


@pytest.mark.parametrize("shared", [True, False])
def test_bin_roundtrip_identical(tmp_path, shared):
    cfg = ModelConfig(dim=48, hidden_dim=64, n_layers=3, n_heads=6, n_kv_heads=2, vocab_size=70, max_seq_len=40,
                      shared_classifier=shared)
    model = Transformer(cfg).init_weights(seed=4)
    path = tmp_path / "m.bin"
    save_bin(model, path)
    assert os.path.getsize(path) == expected_size(cfg)
    header = torch.frombuffer(bytearray(open(path, "rb").read(28)), dtype=torch.int32).tolist()
    assert header == [48, 64, 3, 6, 2, 70 if shared else -70, 40]  # negative vocab = separate classifier
    back = load_bin(path)
    assert back.config.to_dict() == cfg.to_dict()
    for (k, a), (k2, b) in zip(sorted(model.state_dict().items()), sorted(back.state_dict().items())):
        assert k == k2 and torch.equal(a, b), k
    assert (back.output.weight is back.tok_embeddings.weight) == shared


def test_bin_truncated_and_padded(tmp_path):
    model = Transformer(ModelConfig.from_name("tiny", max_seq_len=16)).init_weights(0)
    path = tmp_path / "m.bin"
    save_bin(model, path)
    data = open(path, "rb").read()
    open(tmp_path / "cut.bin", "wb").write(data[:-100])
    with pytest.raises(ValueError, match=rf"cut.bin: expected {len(data)} bytes .* found {len(data) - 100}.*truncated"):
        load_bin(tmp_path / "cut.bin")
    open(tmp_path / "long.bin", "wb").write(data + b"\0" * 4)
    with pytest.raises(ValueError, match="longer than expected"):
        load_bin(tmp_path / "long.bin")
    open(tmp_path / "tiny.bin", "wb").write(data[:10])
    with pytest.raises(ValueError, match="shorter than the 28-byte"):
        load_bin(tmp_path / "tiny.bin")
    open(tmp_path / "junk.bin", "wb").write(b"\xff" * 28 + data[28:])
    with pytest.raises(ValueError, match="not a llama2.c v0 checkpoint"):
        load_bin(tmp_path / "junk.bin")
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        load_bin(tmp_path / "nope.bin")


def test_export_refuses_numerics_v0_cannot_hold(tmp_path):
    for kw in (dict(rope_theta=500000.0), dict(norm_eps=1e-6)):
        model = Transformer(ModelConfig.from_name("tiny", **kw))
        with pytest.raises(ValueError, match="v0 implies rope_theta=10000 and norm_eps=1e-5"):
            save_bin(model, tmp_path / "x.bin")


def test_rope_permutation_roundtrip():
    w = torch.randn(2 * 8, 5)
    assert torch.equal(pairs_to_hf(hf_to_pairs(w, 2), 2), w)
    # HF's rotate_half pairs (j, j + D/2); after the permutation they are adjacent (2j, 2j+1)
    idx = torch.arange(16, dtype=torch.float32)[:, None]
    perm = hf_to_pairs(idx, 2)[:, 0].long().tolist()
    assert perm[:8] == [0, 4, 1, 5, 2, 6, 3, 7]


def _tiny_hf(tmp_path, tie, theta_style):
    transformers = pytest.importorskip("transformers", reason="transformers is in the dev extra")
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, tie_word_embeddings=tie, attention_bias=False, mlp_bias=False)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2)  # large enough that every position's logits differ
    hf.save_pretrained(tmp_path, safe_serialization=True)
    c = json.load(open(tmp_path / "config.json"))
    c.pop("rope_theta", None), c.pop("rope_parameters", None), c.pop("rope_scaling", None)
    if theta_style == "top":
        c["rope_theta"] = 50000.0
    else:
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": 50000.0}
    json.dump(c, open(tmp_path / "config.json", "w"))
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()  # re-read with the edited theta
    return hf


@pytest.mark.parametrize("tie,theta_style", [(False, "top"), (True, "parameters")])
def test_hf_parity_with_transformers(tmp_path, tie, theta_style):
    hf = _tiny_hf(tmp_path, tie, theta_style)
    assert read_config(tmp_path).rope_theta == 50000.0
    ours = load_hf(tmp_path)
    tokens = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(tokens).logits
        got = ours(tokens)
    # 1e-4: both float32, same math in a different association order (HF's rotate_half vs pairs)
    assert_close(got, want, atol=1e-4, rtol=1e-4, name="minillm vs transformers logits, all positions")
    # the permutation is what makes positions > 0 agree: without it they drift by ~1e-2
    bad = Transformer(ours.config)
    sd = ours.state_dict()
    for i in range(ours.config.n_layers):
        k = f"layers.{i}.attention.wk.weight"
        sd[k] = hf_to_pairs(pairs_to_hf(sd[k], ours.config.n_kv_heads), ours.config.n_heads)  # the export.py GQA bug
    bad.load_state_dict(sd)
    with torch.no_grad():
        wrong = bad.eval()(tokens)
    assert_close(wrong[:, 0], want[:, 0], atol=1e-4, rtol=1e-4, name="position 0 is blind to the permutation")
    assert (wrong[:, 1:] - want[:, 1:]).abs().max() > 1e-3


def test_hf_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(model_type="llama", hidden_size=64, intermediate_size=96,
                                                          num_hidden_layers=1, num_attention_heads=4, vocab_size=10)))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf(tmp_path)


def test_hf_directory_through_llm_with_tokenizer_json(tmp_path):
    """LLM(dir) reads config.json + safetensors + tokenizer.json; greedy tokens equal transformers' generate."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models, pre_tokenizers

    from minillm import LLM, SamplingParams
    hf = _tiny_hf(tmp_path, tie=False, theta_style="top")
    words = "to be or not that is the question whether tis nobler in mind suffer".split()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = HFTok(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    llm = LLM(str(tmp_path), dtype="float32")
    out = llm.generate("to be or not to be", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert out.prompt_token_ids == [1] + [vocab[w] for w in "to be or not to be".split()]
    with torch.no_grad():
        want = hf.generate(torch.tensor([out.prompt_token_ids]), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(out.prompt_token_ids):].tolist()
    # float32 on both sides: compare up to the first step where HF's top-2 margin is tiny (DESIGN rule 7)
    with torch.no_grad():
        logits = hf(torch.tensor([out.prompt_token_ids + want])).logits[0, len(out.prompt_token_ids) - 1:-1]
    top2 = logits.topk(2).values
    safe = next((i for i, m in enumerate((top2[:, 0] - top2[:, 1]).tolist()) if m < 1e-4), len(want))
    assert safe >= 6, f"only {safe} steps comparable"
    assert out.token_ids[:safe] == want[:safe]


def test_hf_refuses_what_it_cannot_run(tmp_path):
    _tiny_hf(tmp_path, tie=False, theta_style="top")
    c = json.load(open(tmp_path / "config.json"))
    json.dump({**c, "hidden_act": "gelu"}, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        load_hf(tmp_path)
    json.dump({**c, "eos_token_id": [2, 7]}, open(tmp_path / "config.json", "w"))
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models

    from minillm.formats.hf import HFTokenizer
    HFTok(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>")).save(str(tmp_path / "tokenizer.json"))
    assert HFTokenizer(str(tmp_path)).stop_ids == {2, 7}  # newer configs list several end tokens


# ---------------------------------------------------------------------------- the import graph
def _imports(module) -> set[str]:
    """Every module `module` imports, anywhere in its source (function bodies too), as absolute names."""
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(module))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ("minillm." if node.level else "") + (node.module or "")
            out |= {base.rstrip(".")} | {f"{base}.{a.name}".replace("..", ".") for a in node.names}
    return out


def test_no_import_circle_between_checkpoint_runq_quant_and_loader():
    """checkpoint -> runq -> quant -> loader -> checkpoint was a circle, hidden by imports inside functions (now
    formats.llama2c, formats.runq, quantization.calibration, formats.loader; tests/test_layers.py checks every
    module for circles)."""
    import importlib
    names = {"paths": "paths", "checkpoint": "formats.llama2c", "runq": "formats.runq",
             "quant": "quantization.calibration", "loader": "formats.loader"}
    mods = {n: importlib.import_module(f"minillm.{m}") for n, m in names.items()}
    assert not any(m.startswith("minillm") for m in _imports(mods["paths"]))   # the bottom of the graph
    assert not any("runq" in m for m in _imports(mods["checkpoint"])), _imports(mods["checkpoint"])
    assert not any("loader" in m for m in _imports(mods["quant"])), _imports(mods["quant"])
    assert "minillm.paths" in _imports(mods["quant"]) and "minillm.paths" in _imports(mods["loader"])
    assert ((mods["loader"].MODELS_DIR, mods["loader"].SAMPLE_TEXT)
            == (mods["paths"].MODELS_DIR, mods["paths"].SAMPLE_TEXT))


def test_load_bin_names_a_runq_file_and_where_to_read_it(tmp_path):
    from minillm.formats.loader import load_checkpoint
    from minillm.formats.runq import save_runq
    model = Transformer(ModelConfig.from_name("tiny", max_seq_len=16)).init_weights(0)
    save_runq(model, tmp_path / "q.bin")
    with pytest.raises(ValueError, match=r"q.bin: a runq.c version-2 \(Q8_0\) file \(magic 'ak42'\); read it with "
                                         r"minillm.load or minillm.formats.runq.load_runq"):
        load_bin(tmp_path / "q.bin")
    assert type(load_checkpoint(tmp_path / "q.bin").layers[0].attention.wq).__name__ == "Q80Linear"
    save_bin(model, tmp_path / "m.bin")
    assert torch.equal(load_checkpoint(tmp_path / "m.bin").layers[0].attention.wq.weight,
                       model.layers[0].attention.wq.weight)


def test_readers_close_their_files(tmp_path):
    """No file handle is left for the garbage collector (a ResourceWarning each, and on Windows a locked file)."""
    import gc
    import warnings

    from minillm.formats.loader import load_checkpoint
    from minillm.formats.runq import is_runq, save_runq
    model = Transformer(ModelConfig.from_name("tiny", max_seq_len=16)).init_weights(0)
    save_bin(model, tmp_path / "m.bin")
    save_runq(model, tmp_path / "q.bin")
    (tmp_path / "cut.bin").write_bytes((tmp_path / "q.bin").read_bytes()[:-8])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        load_bin(tmp_path / "m.bin"), load_checkpoint(tmp_path / "m.bin"), load_checkpoint(tmp_path / "q.bin")
        assert is_runq(tmp_path / "q.bin") and not is_runq(tmp_path / "m.bin")
        for bad in ("q.bin", "cut.bin"):
            with pytest.raises(ValueError):
                load_bin(tmp_path / bad)
        with pytest.raises(ValueError):
            load_checkpoint(tmp_path / "cut.bin")
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
