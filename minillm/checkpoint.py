"""llama2.c checkpoints, legacy "v0": the format run.c reads (FORMATS.md).

    header: 7 x int32  dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
            (vocab_size < 0: the classifier is a separate matrix after the weights)
    then float32, row-major, all layers of one kind together:
    tok_emb (V, C) | rms_att (L, C) | wq (L, C, C) | wk (L, KV, C) | wv (L, KV, C) | wo (L, C, C)
    | rms_ffn (L, C) | w1 (L, Hd, C) | w2 (L, C, Hd) | w3 (L, Hd, C) | rms_final (C)
    | freq_cis_real (S, D/2) | freq_cis_imag (S, D/2) | [wcls (V, C)]

v0 has no field for rope theta or norm eps: run.c hard-codes 10000 and 1e-5, so a model with other
values cannot be written to it faithfully and export refuses.
"""
from __future__ import annotations

import os
import struct

import numpy as np
import torch

from .config import ModelConfig
from .model import Transformer

HEADER = struct.Struct("<7i")
_MAGIC_V1 = 0x616B3432  # "ak42": llama2.c's versioned exports


def _layout(cfg: ModelConfig):
    """(name in our state_dict, or a list of per-layer names, or "#..." for legacy filler; shape) in file order."""
    C, Hd, L, KV, V, S, D = cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.kv_dim, cfg.vocab_size, cfg.max_seq_len, cfg.head_dim
    per_layer = [("attention_norm.weight", (C,)), ("attention.wq.weight", (C, C)), ("attention.wk.weight", (KV, C)),
                 ("attention.wv.weight", (KV, C)), ("attention.wo.weight", (C, C)), ("ffn_norm.weight", (C,)),
                 ("feed_forward.w1.weight", (Hd, C)), ("feed_forward.w2.weight", (C, Hd)), ("feed_forward.w3.weight", (Hd, C))]
    out = [("tok_embeddings.weight", (V, C))]
    out += [([f"layers.{i}.{name}" for i in range(L)], shape) for name, shape in per_layer]
    out += [("norm.weight", (C,)), ("#freq_cis_real", (S, D // 2)), ("#freq_cis_imag", (S, D // 2))]
    if not cfg.shared_classifier:
        out.append(("output.weight", (V, C)))
    return out


def expected_size(cfg: ModelConfig) -> int:
    n = 0
    for names, shape in _layout(cfg):
        count = len(names) if isinstance(names, list) else 1
        n += count * int(np.prod(shape))
    return HEADER.size + 4 * n


def read_header(path) -> ModelConfig:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise ValueError(f"{path}: {size} bytes is shorter than the {HEADER.size}-byte llama2.c header")
    if struct.unpack_from("<I", head)[0] == _MAGIC_V1:
        version = struct.unpack_from("<i", head, 4)[0]
        raise ValueError(f"{path}: a llama2.c version-{version} export (magic 'ak42'); this reader takes "
                         f"the legacy v0 format that run.c reads (export with --version 0)")
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = HEADER.unpack(head)
    try:
        return ModelConfig(dim=dim, hidden_dim=hidden, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                           vocab_size=abs(vocab), max_seq_len=seq_len, shared_classifier=vocab > 0)
    except ValueError as e:
        raise ValueError(f"{path}: not a llama2.c v0 checkpoint, its header says {HEADER.unpack(head)}: {e}") from None


def load_bin(path) -> Transformer:
    """Read a v0 .bin into a Transformer (float32), or a runq.c version-2 file (magic "ak42") into one
    with Q8_0 linears (minillm.runq). Truncated or padded files raise, naming both sizes."""
    from .runq import MAGIC, load_runq
    if os.path.exists(path) and os.path.getsize(path) >= 8 and struct.unpack("<I", open(path, "rb").read(4))[0] == MAGIC:
        return load_runq(path)
    cfg = read_header(path)
    size, want = os.path.getsize(path), expected_size(cfg)
    if size != want:
        raise ValueError(f"{os.fspath(path)}: expected {want} bytes for the shape in its header "
                         f"(dim={cfg.dim}, layers={cfg.n_layers}, vocab={cfg.vocab_size}, seq_len={cfg.max_seq_len}), "
                         f"found {size}: the file is {'truncated' if size < want else 'longer than expected'}")
    data = np.fromfile(path, dtype=np.float32, offset=HEADER.size)
    state, off = {}, 0
    for names, shape in _layout(cfg):
        names = names if isinstance(names, list) else [names]
        for name in names:
            n = int(np.prod(shape))
            if not name.startswith("#"):
                state[name] = torch.from_numpy(data[off: off + n].reshape(shape).copy())
            off += n
    model = Transformer(cfg)
    if cfg.shared_classifier:
        state["output.weight"] = state["tok_embeddings.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()


def save_bin(model: Transformer, path):
    """Write a v0 .bin that run.c reads. Raises if the model's numerics are not what v0 implies."""
    cfg = model.config
    if cfg.rope_theta != 10000.0 or cfg.norm_eps != 1e-5:
        raise ValueError(f"llama2.c v0 implies rope_theta=10000 and norm_eps=1e-5; this model has "
                         f"rope_theta={cfg.rope_theta}, norm_eps={cfg.norm_eps}, which run.c would silently ignore")
    state = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in model.state_dict().items()}
    vocab = cfg.vocab_size if cfg.shared_classifier else -cfg.vocab_size
    with open(path, "wb") as f:
        f.write(HEADER.pack(cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, vocab, cfg.max_seq_len))
        for names, shape in _layout(cfg):
            if names == "#freq_cis_real":  # legacy RoPE tables: run.c skips them, but they must be there
                f.write(model.rope_cos.numpy().astype(np.float32).tobytes())
                continue
            if names == "#freq_cis_imag":
                f.write(model.rope_sin.numpy().astype(np.float32).tobytes())
                continue
            for name in names if isinstance(names, list) else [names]:
                f.write(np.ascontiguousarray(state[name], dtype=np.float32).tobytes())
