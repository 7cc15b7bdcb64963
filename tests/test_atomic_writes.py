"""Every writer of the package replaces a symlink at its target instead of writing through it (the hostile-user
issue's N8, after export_hf: tests/test_export_hf.py), and leaves no temporary file: checkpoints (llama2.c, runq.c
Q8_0), tokenizers, Medusa heads, LoRA adapters, MoE files, model cards, a bench's --json, training's logs."""
import json
import os

import pytest
import torch

from minillm.atomic import copy_replacing, open_appending
from minillm.formats.llama2c import save_bin
from minillm.formats.loader import random_model
from minillm.formats.moe import save_moe
from minillm.formats.peft import save_adapter
from minillm.formats.runq import save_runq
from minillm.moe.experts import MoEConfig, upcycle
from minillm.spec_decode.medusa_heads import MedusaHeads, save_medusa
from minillm.training.lora import adapter_of


@pytest.fixture(scope="module")
def tiny():
    return random_model("tiny", seed=3)


def writers(tiny, folder):
    """name -> (the file written, a call that writes it)"""
    model, tok = tiny
    bench_json = folder / "bench.json"
    return {
        "save_bin": (folder / "m.bin", lambda p: save_bin(model, p)),
        "save_runq": (folder / "q.bin", lambda p: save_runq(model, p)),
        "tokenizer": (folder / "tok.bin", lambda p: tok.save(p)),
        "save_medusa": (folder / "heads.bin",
                        lambda p: save_medusa(MedusaHeads(model.config.dim, model.config.vocab_size, 2), p, model)),
        "save_moe": (folder / "moe.safetensors", lambda p: (save_bin(model, folder / "base.bin"),
                                                            save_moe(upcycle(random_model("tiny", seed=3)[0],
                                                                             MoEConfig(4, 2, 48)), p,
                                                                     folder / "base.bin"))),   # upcycle: in place
        "save_adapter": (folder / "adapter" / "adapter_model.safetensors",
                         lambda p: save_adapter(adapter_of(model, "x", 2, 4.0), p.parent, model.config)),
        "copy": (folder / "copied.bin", lambda p: (save_bin(model, folder / "src.bin"),
                                                   copy_replacing(folder / "src.bin", p))),
        "bench --json": (bench_json, lambda p: __import__("minillm.bench.cli", fromlist=["_write_json"])
                         ._write_json({"ok": 1}, p)),
    }


@pytest.mark.parametrize("name", ["save_bin", "save_runq", "tokenizer", "save_medusa", "save_moe", "save_adapter",
                                  "copy", "bench --json"])
def test_a_symlink_at_the_target_is_replaced_not_written_through(tiny, tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target, write = writers(tiny, tmp_path)[name]
    target.parent.mkdir(exist_ok=True)
    target.symlink_to(victim)
    with torch.no_grad():
        write(target)
    assert victim.read_text() == "precious"
    assert not target.is_symlink() and target.stat().st_size > 0
    left = [p for p in os.listdir(target.parent) if p.endswith(".tmp")]
    assert not left, left


def test_a_log_appended_to_refuses_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "log.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        open_appending(tmp_path / "log.jsonl")
    with open_appending(tmp_path / "fresh.jsonl") as f:
        f.write(json.dumps({"step": 1}) + "\n")
    assert victim.read_text() == "precious" and (tmp_path / "fresh.jsonl").read_text() == '{"step": 1}\n'


def test_a_failed_write_leaves_the_old_file(tiny, tmp_path):
    from minillm.atomic import open_replacing
    target = tmp_path / "card.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with open_replacing(target, "w") as f:
            f.write("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["card.json"]
