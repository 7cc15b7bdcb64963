"""LoRA adapters in PEFT's format (minillm.formats.peft): saved and read back bit for bit, q/k rows in HF's layout,
loaded by the `peft` library itself onto the HF export of the shipped model with the same logits as minillm, and
broken or foreign adapter files refused by name."""
import json
import os

import pytest
import torch
from close import assert_close
from safetensors.torch import load_file, save_file
from test_lora import random_adapter

from minillm.formats.hf import pairs_to_hf
from minillm.formats.peft import CONFIG, WEIGHTS, load_adapter, save_adapter
from minillm.lora.adapters import MODULES, attach_lora, load_slot, merge_lora


def test_save_and_load_round_trip_with_q_and_k_rows_in_hf_layout(tiny64, tmp_path):
    model, _ = tiny64
    cfg = model.config
    a = random_adapter(cfg, 4, 0)
    save_adapter(a, tmp_path, cfg, base_model="tiny")
    config = json.load(open(tmp_path / CONFIG))
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == a.alpha
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "up_proj"]
    tensors = load_file(tmp_path / WEIGHTS)
    assert len(tensors) == 2 * len(MODULES) * cfg.n_layers
    key = "base_model.model.model.layers.1.self_attn.{}_proj.lora_{}.weight"
    A, B = a.weights[(1, "attention.wq")]
    assert torch.equal(tensors[key.format("q", "A")], A.float())
    assert torch.equal(tensors[key.format("q", "B")], pairs_to_hf(B.float(), cfg.n_heads))
    assert torch.equal(tensors[key.format("k", "B")], pairs_to_hf(a.weights[(1, "attention.wk")][1].float(),
                                                                  cfg.n_kv_heads))   # GQA: the KV heads' permutation
    assert torch.equal(tensors[key.format("v", "B")], a.weights[(1, "attention.wv")][1].float())
    back = load_adapter(tmp_path, cfg)
    assert back.digest == a.digest                                      # the same content: the same prefix-cache key
    for k, (x, y) in a.weights.items():
        assert torch.equal(back.weights[k][0], x.float()) and torch.equal(back.weights[k][1], y.float())
    assert back.rank == 4 and back.scaling == a.scaling and back.base_model == "tiny"


def test_peft_loads_a_shipped_adapter_onto_the_hf_export(tmp_path):
    """The check the brief asks for: PeftModel.from_pretrained(LlamaForCausalLM(export), lora/comedies) gives
    minillm's logits, merged and served by the LoRA slots."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    from minillm.formats.hf_export import export_hf
    from minillm.formats.loader import load
    from minillm.formats.peft import resolve_adapter
    model, tok = load("shakespeare")
    adapter = load_adapter("comedies", model.config)
    export_hf(model, tmp_path / "hf", tok)
    hf = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32),
                                   resolve_adapter("comedies")).eval()
    x = torch.tensor([tok.encode("VIOLA. What country, friends, is this? CAPTAIN. This is Illyria, lady.")])
    lm = attach_lora(model, 2, 8)
    load_slot(lm, 1, adapter)
    with torch.no_grad():
        theirs = hf(x).logits[0]                                       # (T, V)
        merged = merge_lora(model, adapter)(x)[0]
        with lm.lora_context.use([1], x.shape[1]):
            slots = lm(x)[0]
    assert (theirs - model(x)[0]).abs().max() > 1e-2                   # the adapter changes the logits
    # float32, 8 layers, HF's RoPE and attention kernels vs ours: ~1e-6 relative, logits O(10) -> 1e-4 absolute
    assert_close(theirs, merged, atol=1e-4, rtol=1e-4, name="peft vs merged")
    assert_close(theirs, slots, atol=1e-4, rtol=1e-4, name="peft vs LoRA slots")


def test_an_adapter_for_another_model_names_the_shapes(tiny64, tmp_path):
    from minillm.config import ModelConfig
    model, _ = tiny64
    save_adapter(random_adapter(model.config, 4, 0), tmp_path, model.config)
    other = ModelConfig.from_name("shakespeare")
    with pytest.raises(ValueError, match=r"layer 0 q_proj lora_A is \(4, 64\) but this model's q_proj has 256 inputs"):
        load_adapter(tmp_path, other)
    shallow = ModelConfig.from_name("tiny", n_layers=1)                   # the same shapes, fewer layers
    with pytest.raises(ValueError, match="weights for layer 1, but this model has 1 layers"):
        load_adapter(tmp_path, shallow)


def _broken(tmp_path, cfg, edit_config=None, edit_tensors=None):
    save_adapter(random_adapter(cfg, 2, 0, modules=("attention.wq", "feed_forward.w2")), tmp_path, cfg)
    if edit_config:
        c = json.load(open(tmp_path / CONFIG))
        edit_config(c)
        json.dump(c, open(tmp_path / CONFIG, "w"))
    if edit_tensors:
        t = load_file(tmp_path / WEIGHTS)
        edit_tensors(t)
        save_file(t, tmp_path / WEIGHTS)
    return tmp_path


@pytest.mark.parametrize("edit_config,edit_tensors,match", [
    (lambda c: c.update(peft_type="PREFIX_TUNING"), None, "peft_type must be 'LORA'"),
    (lambda c: c.update(use_dora=True), None, "use_dora=True is not supported"),
    (lambda c: c.update(bias="all"), None, "bias='all' is not supported"),
    (lambda c: c.update(rank_pattern={"q_proj": 4}), None, "rank_pattern"),
    (lambda c: c.update(target_modules=["q_proj", "lm_head"]), None, "target_modules must list some of"),
    (lambda c: c.update(target_modules=["q_proj"]), None, "down_proj, which target_modules"),
    (lambda c: c.update(r=0), None, "r must be a positive integer"),
    (None, lambda t: t.pop("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"), "has lora_A but not lora_B"),
    (None, lambda t: t.update({"base_model.model.lm_head.lora_A.weight": torch.zeros(2, 64)}), "is not a LoRA weight"),
    (None, lambda t: t["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"].__setitem__((0, 0), float("nan")),
     "NaN or infinite weights in layer 1 down_proj"),                   # hostile: greedy output was token 0 forever
    (lambda c: c.update(lora_alpha=float("nan")), None, "lora_alpha=nan"),
    (lambda c: c.update(lora_alpha=1e308), None, "not a finite float32"),
])
def test_bad_adapter_files_are_refused_by_name(tiny64, tmp_path, edit_config, edit_tensors, match):
    model, _ = tiny64
    path = _broken(tmp_path, model.config, edit_config, edit_tensors)
    with pytest.raises(ValueError, match=match):
        load_adapter(path, model.config)


def test_an_adapter_rewritten_on_disk_is_read_again(tiny64, tmp_path):
    """The engine's adapter cache is keyed on the folder's files (size, modification time), not its path alone."""
    from minillm.formats.peft import load_adapter as loader
    from minillm.lora.adapters import LoRASlots
    model, _ = tiny64
    save_adapter(random_adapter(model.config, 2, 0), tmp_path, model.config)
    slots = LoRASlots(attach_lora(model, 2, 4), 2, 4, lambda spec: loader(spec, model.config))
    first = slots.get(str(tmp_path))
    assert slots.get(str(tmp_path)) is first                            # unchanged: the same object
    save_adapter(random_adapter(model.config, 2, 1), tmp_path, model.config)
    os.utime(tmp_path / WEIGHTS, ns=(0, os.stat(tmp_path / WEIGHTS).st_mtime_ns + 10**9))
    second = slots.get(str(tmp_path))
    assert second is not first and second.digest != first.digest


def test_unknown_names_and_missing_files(tiny64, tmp_path):
    model, _ = tiny64
    with pytest.raises(ValueError, match=r"unknown LoRA adapter 'nope': not a shipped adapter \(comedies"):
        load_adapter("nope", model.config)
    os.makedirs(tmp_path / "a")
    (tmp_path / "a" / CONFIG).write_text("{not json")
    with pytest.raises(ValueError, match="not readable JSON"):
        load_adapter(tmp_path / "a", model.config)
