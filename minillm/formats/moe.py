"""An upcycled mixture-of-experts model on disk: only what upcycling changed, beside the dense file it came from.

A safetensors file (any safetensors reader opens it) holding, per layer, the router and the stacked experts in fp16:
    layers.{i}.feed_forward.router.weight (E, C) | .w1 (E, He, C) | .w2 (E, C, He) | .w3 (E, He, C)
and in its metadata (str -> str): format "minillm-moe", version "1", moe (MoEConfig as JSON), base (the dense
llama2.c .bin every other weight is read from, a file name resolved beside this file), base_sha256 and
base_config (its ModelConfig as JSON). 8 layers x 3 x 256 x 768 fp16 = 9.4 MB for the shipped model, instead of
the 29.6 MB a whole second checkpoint would take: attention, norms and the embedding stay shared.
A file whose base is missing, differs (another checksum) or has another shape is refused, naming what differs.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import struct

import torch

from ..atomic import write_replacing
from ..config import ModelConfig
from ..llama.transformer import Transformer
from ..moe.experts import MoEConfig, attach_moe, moe_config, moe_layers
from .llama2c import load_bin

FORMAT, VERSION = "minillm-moe", "1"
STORED = ("router.weight", "w1", "w2", "w3")       # per layer, under layers.{i}.feed_forward.


def expected_shapes(cfg: ModelConfig, moe: MoEConfig) -> dict:
    C, E, He = cfg.dim, moe.n_experts, moe.expert_hidden
    shape = {"router.weight": (E, C), "w1": (E, He, C), "w2": (E, C, He), "w3": (E, He, C)}
    return {f"layers.{i}.feed_forward.{k}": s for i in range(cfg.n_layers) for k, s in shape.items()}


@functools.lru_cache(maxsize=4)
def _sha256(path: str, size: int, mtime: float) -> str:       # size and mtime in the key: a rewritten file rehashes
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256(path: str) -> str:
    st = os.stat(path)
    return _sha256(os.path.realpath(path), st.st_size, st.st_mtime)


def save_moe(model: Transformer, path, base_path):
    """Write the MoE layers of `model` (upcycled from the dense file base_path) in fp16, with the metadata above."""
    from safetensors.torch import save_file
    moe = moe_config(model)
    if moe is None:
        raise ValueError("save_moe: the model has no MoE layers (upcycle it first)")
    state = model.state_dict()
    tensors = {name: state[name].detach().to(torch.float16).contiguous()
               for name in expected_shapes(model.config, moe)}
    meta = {"format": FORMAT, "version": VERSION, "moe": json.dumps(moe.to_dict()),
            "base": os.path.basename(os.fspath(base_path)), "base_sha256": sha256(os.fspath(base_path)),
            "base_config": json.dumps(model.config.to_dict())}
    write_replacing(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def read_metadata(path) -> dict | None:
    """The safetensors header's metadata if `path` is a minillm-moe file, else None (read without safetensors:
    8 bytes of header length, then the JSON header)."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return None
        n = struct.unpack("<Q", head)[0]
        if not 2 <= n <= min(size - 8, 1 << 20):
            return None
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def is_moe_file(path) -> bool:
    return os.path.isfile(path) and read_metadata(path) is not None


def _moe_settings(path, meta: dict) -> tuple[MoEConfig, dict]:
    if meta.get("version") != VERSION:
        raise ValueError(f"{path}: {FORMAT} version {meta.get('version')!r}; this reader takes version {VERSION}")
    try:
        moe, base_cfg = MoEConfig(**json.loads(meta["moe"])), json.loads(meta["base_config"])
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: its metadata is damaged ({type(e).__name__}: {e})") from None
    return moe, base_cfg


def load_moe(path, base_path=None) -> Transformer:
    """-> the dense base (float32) with its FFNs replaced by the file's experts and routers, in eval mode.
    base_path: the dense .bin (default: the file the metadata names, beside `path`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    path = os.fspath(path)
    meta = read_metadata(path)
    if meta is None:
        raise ValueError(f"{path}: not a {FORMAT} file (a safetensors file whose metadata says format={FORMAT})")
    moe, base_cfg = _moe_settings(path, meta)
    base_path = os.fspath(base_path) if base_path else os.path.join(os.path.dirname(os.path.abspath(path)),
                                                                    os.path.basename(meta.get("base", "")))
    if not os.path.isfile(base_path):
        raise FileNotFoundError(f"{path}: its dense base {meta.get('base')!r} is not at {base_path}: the experts "
                                f"replace only the FFNs, every other weight is read from that file")
    if sha256(base_path) != meta.get("base_sha256"):
        raise ValueError(f"{path} was upcycled from a dense file with sha256 {meta.get('base_sha256')}, but "
                         f"{base_path} has sha256 {sha256(base_path)}: its experts belong to another model")
    model = load_bin(base_path)
    shape = {k: v for k, v in model.config.to_dict().items() if k != "dropout"}     # dropout: training, not shape
    if shape != {k: v for k, v in base_cfg.items() if k != "dropout"}:
        raise ValueError(f"{path}: made for a base of shape {base_cfg}, but {base_path} is {model.config.to_dict()}")
    try:
        tensors = load_file(path)
    except SafetensorError as e:
        raise ValueError(f"{path}: a damaged or truncated safetensors file ({e})") from None
    want = expected_shapes(model.config, moe)
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None or tuple(t.shape) != shape or t.dtype != torch.float16:
            got = "missing" if t is None else f"{tuple(t.shape)} {t.dtype}"
            raise ValueError(f"{path}: tensor {name} should be {shape} float16, found {got}")
    if set(tensors) - set(want):
        raise ValueError(f"{path}: unexpected tensors {sorted(set(tensors) - set(want))[:4]}")
    for name in want:                      # one float32 sum per tensor: a NaN or an inf makes it non-finite
        if not math.isfinite(float(tensors[name].sum(dtype=torch.float32))):
            raise ValueError(f"{path}: tensor {name} holds NaN or infinite values: refused (a corrupt file)")
    attach_moe(model, moe)
    with torch.no_grad():
        for layer_id, layer in enumerate(moe_layers(model)):
            for key in STORED:
                layer.get_parameter(key).copy_(tensors[f"layers.{layer_id}.feed_forward.{key}"].float())
    return model.eval()
