"""Notebook 09's memory counts (minillm.training.memory) by hand and against real tensors, and the training
progress bar's label."""
import os
import tempfile

import pytest
import torch

from minillm.config import ModelConfig
from minillm.llama.kv_cache import KVCache
from minillm.llama.transformer import Transformer
from minillm.training.memory import (
    inference_bytes,
    measured_training_bytes,
    per_parameter,
    training_bytes,
)
from minillm.training.train import TrainConfig, _optimizer, run_label


def tiny():
    return ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=32)


def test_training_bytes_by_hand():
    assert training_bytes(10) == {"weights": 40, "gradients": 40, "Adam m": 40, "Adam v": 40}
    assert sum(per_parameter(training_bytes(1000), 1000).values()) == 16            # fp32 AdamW: 16 bytes a parameter
    assert training_bytes(10, weight_bytes=2, grad_bytes=2)["weights"] == 20
    with pytest.raises(ValueError):
        training_bytes(-1)


def test_inference_bytes_by_hand():
    cfg = tiny()          # K and V, 2 layers, 2 KV heads of dim 8, float32: 2 x 2 x 16 x 4 = 256 bytes a token
    got = inference_bytes(cfg, tokens=100)
    assert got == {"weights": 4 * cfg.num_params(), "KV cache": 100 * 256}
    assert got["KV cache"] == 100 * KVCache.bytes_per_token(cfg)
    assert inference_bytes(cfg, 100, weight_bytes=2, kv_bytes=2)["KV cache"] == 100 * 128
    with pytest.raises(ValueError):
        inference_bytes(cfg, -1)


def test_measured_after_one_adamw_step_matches_the_count():
    cfg = tiny()
    model = Transformer(cfg).init_weights(0)
    opt = _optimizer(model, TrainConfig(out_dir="unused"))
    with pytest.raises(ValueError, match="step"):
        measured_training_bytes(model, opt)
    x = torch.randint(0, 64, (2, 8))
    torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    opt.step()
    assert measured_training_bytes(model, opt) == training_bytes(cfg.num_params())   # the tied weight counted once


def test_run_label_names_the_model_for_a_temporary_folder():
    cfg = tiny()
    assert run_label(cfg, os.path.join("runs", "shakespeare")) == "shakespeare"
    assert run_label(cfg, os.path.join("runs", "shakespeare") + os.sep) == "shakespeare"
    with tempfile.TemporaryDirectory() as d:
        label = run_label(cfg, d)
    assert os.path.basename(d) not in label and "dim 32" in label and "2 layers" in label
