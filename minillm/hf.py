"""Hugging Face Llama directories: config.json + model.safetensors (+ tokenizer.json).

HF applies RoPE with rotate_half, pairing dims (j, j + D/2); llama2.c (and this engine) pair (2j, 2j+1).
The same model in both conventions differs by a fixed permutation of wq's and wk's rows per head:
    HF -> llama2.c:  W.reshape(H, 2, D/2, C).transpose(1, 2).reshape(H*D, C)
with H = n_heads for wq and n_kv_heads for wk (llama2.c's export.py uses n_heads for both, which is
wrong under GQA). Without it position 0 still matches (RoPE is the identity there), so tests compare
logits at every position.
"""
from __future__ import annotations

import json
import os

import torch

from .config import ModelConfig
from .model import Transformer

_NAMES = {  # HF name (per layer) -> ours
    "input_layernorm": "attention_norm", "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "feed_forward.w1", "mlp.down_proj": "feed_forward.w2", "mlp.up_proj": "feed_forward.w3",
}


def hf_to_pairs(w, n_heads: int):
    """Rows of a q/k projection from HF's half-split RoPE layout to llama2.c's interleaved pairs.
    w: (H*D, C) -> (H*D, C)"""
    HD, C = w.shape
    D = HD // n_heads
    return w.reshape(n_heads, 2, D // 2, C).transpose(1, 2).reshape(HD, C)  # (H, D/2, 2, C) flattened


def pairs_to_hf(w, n_heads: int):
    """The inverse of hf_to_pairs. w: (H*D, C) -> (H*D, C)"""
    HD, C = w.shape
    D = HD // n_heads
    return w.reshape(n_heads, D // 2, 2, C).transpose(1, 2).reshape(HD, C)  # (H, 2, D/2, C) flattened


def is_hf_dir(path) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))


def read_config(path) -> ModelConfig:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"no config.json in {path}")
    c = json.load(open(cfg_path))
    if c.get("model_type", "llama") != "llama":
        raise ValueError(f"{cfg_path}: model_type={c.get('model_type')!r}; only 'llama' is supported")
    if c.get("hidden_act", "silu") != "silu" or c.get("attention_bias") or c.get("mlp_bias"):
        raise ValueError(f"{cfg_path}: hidden_act={c.get('hidden_act')!r}, attention_bias={c.get('attention_bias')}, "
                         f"mlp_bias={c.get('mlp_bias')}; this engine implements silu without biases")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ValueError(f"{cfg_path}: rope_type={rope.get('rope_type')!r} is not supported (only default RoPE)")
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    if head_dim * heads != c["hidden_size"]:
        raise ValueError(f"{cfg_path}: head_dim={head_dim} x heads={heads} != hidden_size={c['hidden_size']}; "
                         f"this engine needs dim = n_heads * head_dim")
    return ModelConfig(dim=c["hidden_size"], hidden_dim=c["intermediate_size"], n_layers=c["num_hidden_layers"],
                       n_heads=heads, n_kv_heads=c.get("num_key_value_heads") or heads, vocab_size=c["vocab_size"],
                       max_seq_len=c.get("max_position_embeddings", 2048), rope_theta=float(theta),
                       norm_eps=float(c.get("rms_norm_eps", 1e-6)), shared_classifier=bool(c.get("tie_word_embeddings", False)))


def _read_tensors(path) -> dict:
    from safetensors.torch import load_file
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(single):
        return load_file(single)
    if os.path.exists(index):
        tensors = {}
        for shard in sorted(set(json.load(open(index))["weight_map"].values())):
            tensors.update(load_file(os.path.join(path, shard)))
        return tensors
    raise FileNotFoundError(f"no model.safetensors (or model.safetensors.index.json) in {path}")


def load_hf(path) -> Transformer:
    cfg = read_config(path)
    hf = {k.removeprefix("model."): v.to(torch.float32) for k, v in _read_tensors(path).items()}
    if "lm_head.weight" not in hf:
        cfg.shared_classifier = True
    for key in ("embed_tokens.weight", "norm.weight"):
        if key not in hf:
            raise ValueError(f"{path}: tensor {key!r} missing from the safetensors files")
    state = {"tok_embeddings.weight": hf.pop("embed_tokens.weight"), "norm.weight": hf.pop("norm.weight")}
    for i in range(cfg.n_layers):
        for theirs, ours in _NAMES.items():
            key = f"layers.{i}.{theirs}.weight"
            if key not in hf:
                raise ValueError(f"{path}: tensor {key!r} missing from the safetensors files")
            w = hf.pop(key)
            if theirs == "self_attn.q_proj":
                w = hf_to_pairs(w, cfg.n_heads)
            elif theirs == "self_attn.k_proj":
                w = hf_to_pairs(w, cfg.n_kv_heads)  # n_kv_heads, not n_heads: the GQA-correct permutation
            state[f"layers.{i}.{ours}.weight"] = w
    head = hf.pop("lm_head.weight", None)
    leftover = sorted(k for k in hf if "rotary_emb" not in k)
    if leftover:
        raise ValueError(f"{path}: tensors this Llama engine does not use: {leftover[:6]}")
    state["output.weight"] = state["tok_embeddings.weight"] if cfg.shared_classifier else head
    model = Transformer(cfg)
    model.load_state_dict(state, strict=True)
    return model.eval()


class HFTokenizer:
    """tokenizer.json through the `tokenizers` library, with the engine's Tokenizer interface."""

    def __init__(self, path):
        from tokenizers import Tokenizer as _T
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.exists(file):
            raise FileNotFoundError(f"tokenizer.json not found: looked for {file}")
        self._tok = _T.from_file(file)
        cfg_file = os.path.join(os.path.dirname(file), "config.json")
        c = json.load(open(cfg_file)) if os.path.exists(cfg_file) else {}
        self.bos_id = c.get("bos_token_id", 1)
        if not isinstance(self.bos_id, int):
            raise ValueError(f"{cfg_file}: bos_token_id={self.bos_id!r}; prompts here start with a BOS token id")
        eos = c.get("eos_token_id", 2)
        self.stop_ids = set(eos) if isinstance(eos, list) else {eos}  # newer configs list several
        self.eos_id = min(self.stop_ids)
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids, prev_token=None) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)
