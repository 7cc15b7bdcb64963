"""llama2.c's runq.c checkpoints, "version 2": Q8_0 weights (FORMATS.md).

    header (256 bytes): uint32 magic 0x616b3432 ("ak42"), int32 version 2, 7 x int32 config
                        (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len),
                        uint8 shared_classifier, int32 group_size (at offset 37), zeros
    float32 norms:      rms_att (L, C), rms_ffn (L, C), rms_final (C)
    Q8_0 tensors:       tok_emb, wq[0..L-1], wk[..], wv[..], wo[..], w1[..], w2[..], w3[..], [wcls]
                        each as its int8 values, then its float32 scales (one per group)

Reading one gives a Transformer whose linears are minillm.llama.linears.Q80Linear (runq.c's int8 x int8
matmul) and whose embedding is the dequantized tok_emb, as runq.c uses it.
"""
from __future__ import annotations

import os
import struct

import numpy as np
import torch

from ..atomic import open_replacing
from ..config import ModelConfig
from ..llama.linears import Q80Linear, q80_group_size, q80_quantize
from ..llama.transformer import Transformer
from .llama2c import check_llama2c_model, check_size, shape_fields

MAGIC, VERSION, HEADER_BYTES = 0x616B3432, 2, 256
_HEAD = struct.Struct("<Ii7iBi")           # magic, version, 7 config ints, shared flag, group size (offset 37)
_PER_LAYER = ["attention.wq", "attention.wk", "attention.wv", "attention.wo",
              "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]


def is_runq(path) -> bool:
    """Whether `path` starts as a runq.c file does (magic 'ak42', version 2): how loader.load_checkpoint tells
    it from a v0 .bin. Reads 8 bytes."""
    with open(path, "rb") as f:
        head = f.read(8)
    return len(head) == 8 and struct.unpack("<Ii", head) == (MAGIC, VERSION)


def save_runq(model: Transformer, path, group_size: int | None = None) -> dict:
    """Write `model` (float32) as a runq.c version-2 file. -> {tensor name: max abs quantization error}."""
    cfg = model.config
    check_llama2c_model(cfg, "a runq.c file")
    if cfg.rope_theta != 10000.0 or cfg.norm_eps != 1e-5:
        raise ValueError(f"runq.c implies rope_theta=10000 and norm_eps=1e-5; this model has "
                         f"rope_theta={cfg.rope_theta}, norm_eps={cfg.norm_eps}")
    gs = group_size or q80_group_size(cfg.dim)
    for name, n in (("dim", cfg.dim), ("hidden_dim", cfg.hidden_dim)):
        if n % gs:
            raise ValueError(f"Q8_0 group size {gs} does not divide {name}={n}")
    head = _HEAD.pack(MAGIC, VERSION, cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                      cfg.vocab_size, cfg.max_seq_len, int(cfg.shared_classifier), gs)

    def f32(t):
        return t.detach().float().contiguous().numpy().tobytes()
    errors = {}
    with open_replacing(path) as f:
        f.write(head + b"\0" * (HEADER_BYTES - len(head)))
        for norm in ("attention_norm", "ffn_norm"):
            f.write(b"".join(f32(getattr(layer, norm).weight) for layer in model.layers))
        f.write(f32(model.norm.weight))
        tensors = [("tok_embeddings", model.tok_embeddings.weight)]
        for kind in _PER_LAYER:
            tensors += [(f"layers.{i}.{kind}", _weight(layer, kind)) for i, layer in enumerate(model.layers)]
        if not cfg.shared_classifier:
            tensors.append(("output", model.output.weight))
        for name, w in tensors:
            q, s, errors[name] = q80_quantize(w.detach(), gs)
            f.write(q.numpy().tobytes() + s.numpy().astype(np.float32).tobytes())
    return errors


def _tensors(cfg: ModelConfig, gs: int):
    """The file's tensors after the header, their shapes as header fields (checkpoint.check_size's terms):
    the norms in float32, then Q8_0 ones, each n int8 values and n / gs float32 scales."""

    def q80(n):
        return n + 4 * (n // gs)
    norms = [("rms_att", ("n_layers", "dim")), ("rms_ffn", ("n_layers", "dim")), ("rms_final", ("dim",))]
    quantized = [("tok_emb", ("vocab_size", "dim")), ("wq", ("n_layers", "dim", "dim")),
                 ("wk", ("n_layers", "kv_dim", "dim")), ("wv", ("n_layers", "kv_dim", "dim")),
                 ("wo", ("n_layers", "dim", "dim")), ("w1", ("n_layers", "hidden_dim", "dim")),
                 ("w2", ("n_layers", "dim", "hidden_dim")), ("w3", ("n_layers", "hidden_dim", "dim"))]
    quantized += [] if cfg.shared_classifier else [("wcls", ("vocab_size", "dim"))]
    return norms + [(name, shape, q80) for name, shape in quantized]


def read_runq_header(path) -> tuple[ModelConfig, int]:
    """-> (config, group size) from the 256-byte header alone, checked against the file's size before the
    file is read: a header that claims more than the file holds is refused without allocating its size."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise ValueError(f"{path}: {size} bytes is shorter than runq.c's {HEADER_BYTES}-byte header")
    magic, version, dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared, gs = _HEAD.unpack_from(head)
    if magic != MAGIC:
        raise ValueError(f"{path}: magic {magic:#010x} is not runq.c's {MAGIC:#010x} ('ak42')")
    if version != VERSION:
        raise ValueError(f"{path}: version {version}; runq.c reads version {VERSION} (Q8_0)")
    try:
        cfg = ModelConfig(dim=dim, hidden_dim=hidden, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                          vocab_size=vocab, max_seq_len=seq_len, shared_classifier=bool(shared))
    except ValueError as e:
        raise ValueError(f"{path}: not a runq.c checkpoint, its header says {_HEAD.unpack_from(head)[2:]}: "
                         f"{e}") from None
    if gs < 1 or dim % gs or hidden % gs:
        raise ValueError(f"{path}: group size {gs} does not divide dim={dim} and hidden_dim={hidden}")
    check_size(path, size, shape_fields(cfg), _tensors(cfg, gs), HEADER_BYTES)
    return cfg, gs


def load_runq(path) -> Transformer:
    """Read a runq.c version-2 file: a Transformer with Q8_0 linears. Wrong magic, version or size raise."""
    path = os.fspath(path)
    cfg, gs = read_runq_header(path)
    with open(path, "rb") as f:
        data = f.read()
    C, L, Hd, KV, V = cfg.dim, cfg.n_layers, cfg.hidden_dim, cfg.kv_dim, cfg.vocab_size
    shapes = {"attention.wq": (C, C), "attention.wk": (KV, C), "attention.wv": (KV, C), "attention.wo": (C, C),
              "feed_forward.w1": (Hd, C), "feed_forward.w2": (C, Hd), "feed_forward.w3": (Hd, C)}
    off = HEADER_BYTES

    def floats(n):
        nonlocal off
        out = torch.from_numpy(np.frombuffer(data, np.float32, n, off).copy())
        off += 4 * n
        return out

    def q80(shape):
        nonlocal off
        n = int(np.prod(shape))
        q = torch.from_numpy(np.frombuffer(data, np.int8, n, off).copy()).view(shape)
        off += n
        return Q80Linear(q, floats(n // gs).view(shape[0], shape[1] // gs), gs)

    model = Transformer(cfg)
    with torch.no_grad():
        rms_att, rms_ffn, rms_final = floats(L * C).view(L, C), floats(L * C).view(L, C), floats(C)
        for i, layer in enumerate(model.layers):
            layer.attention_norm.weight.copy_(rms_att[i])
            layer.ffn_norm.weight.copy_(rms_ffn[i])
        model.norm.weight.copy_(rms_final)
        emb = q80((V, C))
        model.tok_embeddings.weight.copy_(emb.dequantize())                    # runq.c dequantizes it once
        for kind in _PER_LAYER:
            for layer in model.layers:
                parent, attr = _parent(layer, kind)
                setattr(parent, attr, q80(shapes[kind]))
        model.output = emb if cfg.shared_classifier else q80((V, C))
    return model.eval()


def _parent(layer, kind: str):
    sub, attr = kind.split(".")
    return getattr(layer, sub), attr


def _weight(layer, kind: str):
    parent, attr = _parent(layer, kind)
    return getattr(parent, attr).weight
