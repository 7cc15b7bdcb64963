"""export_hf: the exported directory is a Hugging Face Llama that transformers loads, computing our logits
(<= 1e-4 at every position), its tokenizer giving our ids on the packaged held-out slice, and minillm.load of it
giving back the original (weights bit for bit, the same greedy text). Quantized models export dequantized.

Tolerance: 1e-4 absolute on float32 logits of magnitude ~10-20. The two forwards differ only in summation order
(torch's sdpa vs our attention, HF's rotate_half vs our pairs, RoPE tables computed in float32 vs from a float64
cos of the float32 angle): measured about 2e-5 over 1024 positions; a wrong permutation or norm is >= 1e-1.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import minillm
from minillm import LLM, SamplingParams
from minillm.formats.chat_template import CHAT_TEMPLATE, render_chat
from minillm.formats.hf_export import export_hf
from minillm.formats.loader import random_model
from minillm.paths import MODELS_DIR
from minillm.quantization.quantize import quantize_model

transformers = pytest.importorskip("transformers")
ROOT = os.path.join(os.path.dirname(__file__), "..")
VAL = open(os.path.join(MODELS_DIR, "val_slice.txt"), encoding="utf-8").read()
ATOL = 1e-4


def hf_logits(path, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]                    # (T, V)


def our_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]))[0]                           # (T, V)


@pytest.fixture(scope="module")
def shipped():
    return minillm.load("shakespeare")


@pytest.fixture(scope="module")
def exported(shipped, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "shakespeare"
    report = export_hf(shipped[0], path, shipped[1])
    return path, report


def test_the_directory_holds_what_transformers_loads(exported):
    path, report = exported
    assert sorted(os.listdir(path)) == sorted(report.files)
    cfg = json.load(open(path / "config.json"))
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 2
    assert cfg["tie_word_embeddings"] is True and cfg["minillm_export"]["dequantized_from"] is None
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM"


def test_transformers_logits_equal_ours_at_every_position(shipped, exported):
    model, tok = shipped
    ids = tok.encode(VAL)[:model.config.max_seq_len]                     # the whole context: 1024 positions
    want, got = our_logits(model, ids), hf_logits(exported[0], ids)
    assert got.shape == want.shape == (1024, 4096)
    err = (got - want).abs().max().item()
    assert err <= ATOL, f"max |logit difference| {err:.2e} > {ATOL}"


def test_the_exported_tokenizer_gives_our_ids_on_the_held_out_slice(shipped, exported):
    from tokenizers import Tokenizer as HFTok
    tok = shipped[1]
    want = tok.encode(VAL)                                                # BOS + the slice, run.c's encode
    raw = HFTok.from_file(str(exported[0] / "tokenizer.json"))
    assert [tok.bos_id] + raw.encode(VAL, add_special_tokens=False).ids == want
    auto = transformers.AutoTokenizer.from_pretrained(exported[0])
    assert auto(VAL).input_ids == want                                    # BOS added by the post-processor
    assert auto.decode(want, skip_special_tokens=True) == tok.decode(want)
    for line in VAL.splitlines()[:200]:                                   # short texts: the dummy prefix each time
        assert auto(line).input_ids == tok.encode(line), line


def test_minillm_load_of_the_export_is_the_original(shipped, exported):
    model, tok = shipped
    back, back_tok = minillm.load(str(exported[0]))
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "weights differ after the round trip"
    assert back_tok.encode(VAL) == tok.encode(VAL)
    assert back_tok.stop_ids == {1, 2}                     # run.c stops on BOS too: generation_config.json says so
    prompts = ["ROMEO:", "To be, or not to be", "KING RICHARD.\n"]
    params = SamplingParams(temperature=0, max_tokens=24)
    a = [o.outputs[0] for o in LLM(model, tokenizer=tok).generate(prompts, params)]
    b = [o.outputs[0] for o in LLM(str(exported[0])).generate(prompts, params)]
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert [c.text for c in a] == [c.text for c in b]


def test_gqa_untied_head_and_rope_theta_survive_the_trip(tmp_path):
    """A shape the shipped model does not exercise: an untied classifier, rope_theta 500000, a float64 reference."""
    model, tok = random_model("tiny", seed=3, rope_theta=500000.0, shared_classifier=False)
    model.init_weights(seed=4, std=0.1)
    export_hf(model, tmp_path / "tiny", tok)
    cfg = json.load(open(tmp_path / "tiny" / "config.json"))
    assert cfg["tie_word_embeddings"] is False and cfg["rope_theta"] == 500000.0
    ids = tok.encode(VAL[:2000])[:200]
    err = (hf_logits(tmp_path / "tiny", ids) - our_logits(model, ids)).abs().max().item()
    assert err <= ATOL, err
    back, _ = minillm.load(str(tmp_path / "tiny"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_weight_only_quantized_model_exports_its_dequantized_weights(shipped, tmp_path, scheme):
    model, tok = shipped
    q, _ = quantize_model(model, scheme, None, tok)
    with pytest.warns(UserWarning, match=f"{scheme} weights were exported dequantized"):
        report = export_hf(q, tmp_path / scheme, tok)
    assert report.dequantized == scheme and report.dtype == "float32"
    assert json.load(open(tmp_path / scheme / "config.json"))["minillm_export"]["dequantized_from"] == scheme
    ids = tok.encode(VAL)[:256]
    err = (hf_logits(tmp_path / scheme, ids) - our_logits(q, ids)).abs().max().item()
    assert err <= ATOL, f"{scheme}: the export computes what the quantized model computes, up to {err:.2e}"


def test_activation_quantized_schemes_say_their_export_differs(shipped, tmp_path):
    model, tok = shipped
    q, _ = quantize_model(model, "q8_0", None, tok)
    with pytest.warns(UserWarning, match="also quantizes activations"):
        report = export_hf(q, tmp_path / "q8", tok)
    assert report.dequantized == "q8_0" and len(report.notes) == 2


def test_a_non_empty_directory_needs_force(shipped, tmp_path):
    model, tok = shipped
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty .* force=True"):
        export_hf(model, tmp_path, tok)
    (tmp_path / "model.safetensors.index.json").write_text("{}")          # a stale sharded export would shadow ours
    export_hf(model, tmp_path, tok, force=True)
    assert (tmp_path / "notes.txt").exists() and not (tmp_path / "model.safetensors.index.json").exists()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        export_hf(model, tmp_path / "afile", tok, force=True)
    with pytest.raises(ValueError, match="needs tokenizer="):
        export_hf(model, tmp_path / "new")


def test_the_cli_exports_and_refuses_a_non_empty_directory(tmp_path):
    env = dict(os.environ, MINILLM_PROGRESS="0", PYTHONPATH=os.path.abspath(ROOT))
    cmd = [sys.executable, "-m", "minillm", "export", "--hf", str(tmp_path), "--quantization", "int8"]
    (tmp_path / "x").write_text("x")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "is not empty" in r.stderr and "--force" in r.stderr, r.stderr
    r = subprocess.run(cmd + ["--force"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "int8 weights were exported dequantized" in r.stdout
    assert json.load(open(tmp_path / "config.json"))["minillm_export"]["dequantized_from"] == "int8"


def test_the_chat_template_renders_the_same_in_transformers(exported):
    auto = transformers.AutoTokenizer.from_pretrained(exported[0])
    messages = [{"role": "system", "content": "A dialogue."}, {"role": "user", "content": "Who art thou?"},
                {"role": "assistant", "content": "A friend."}, {"role": "user", "content": "Speak!"}]
    theirs = auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert theirs == render_chat(messages, CHAT_TEMPLATE) == \
        "<s>[A dialogue.]\n\nUSER.\nWho art thou?\n\nASSISTANT.\nA friend.\n\nUSER.\nSpeak!\n\nASSISTANT.\n"


def test_an_llm_exports_the_model_its_engine_runs_and_an_export_exports_again(exported, tmp_path):
    llm = LLM("shakespeare", quantization="int8")
    with pytest.warns(UserWarning, match="int8"):
        assert export_hf(llm, tmp_path / "llm").dequantized == "int8"
    back, back_tok = minillm.load(str(exported[0]))                      # an HF directory's tokenizer.json
    export_hf(back, tmp_path / "again", back_tok)
    again, again_tok = minillm.load(str(tmp_path / "again"))
    assert again_tok.encode(VAL) == back_tok.encode(VAL) and again_tok.stop_ids == back_tok.stop_ids
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), again.state_dict().values()))


def test_a_symlink_in_the_target_folder_is_replaced_never_written_through(tmp_path):
    """N8: export_hf(force=True) wrote through a symlink in the target onto the file it pointed to."""
    from minillm.formats.hf_export import export_hf
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "export"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (out / name).symlink_to(victim)
    export_hf("shakespeare", out, force=True)
    assert victim.read_text() == "precious"
    assert all(not (out / n).is_symlink() and (out / n).stat().st_size > 0
               for n in ("config.json", "model.safetensors", "tokenizer.json"))
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]          # no temporary file left behind
