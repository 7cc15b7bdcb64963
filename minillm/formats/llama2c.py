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

import math
import os
import struct

import numpy as np
import torch

from ..atomic import open_replacing
from ..config import ModelConfig
from ..llama.transformer import Transformer

HEADER = struct.Struct("<7i")
FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len")  # the header's order
_MAGIC_V1 = 0x616B3432  # "ak42": llama2.c's versioned exports (runq.c's Q8_0 files are version 2)
_RUNQ_VERSION = 2

# The v0 file in order, each tensor's shape as header fields (kv_dim = n_kv_heads * head_dim): what the size
# check multiplies, so a header is checked against the file without building anything of its size.
_V0_TENSORS = [("tok_emb", ("vocab_size", "dim")), ("rms_att", ("n_layers", "dim")),
               ("wq", ("n_layers", "dim", "dim")), ("wk", ("n_layers", "kv_dim", "dim")),
               ("wv", ("n_layers", "kv_dim", "dim")), ("wo", ("n_layers", "dim", "dim")),
               ("rms_ffn", ("n_layers", "dim")),
               ("w1", ("n_layers", "hidden_dim", "dim")), ("w2", ("n_layers", "dim", "hidden_dim")),
               ("w3", ("n_layers", "hidden_dim", "dim")), ("rms_final", ("dim",)),
               ("freq_cis_real", ("max_seq_len", "half_head_dim")), ("freq_cis_imag", ("max_seq_len", "half_head_dim"))]
_V0_CLASSIFIER = ("wcls", ("vocab_size", "dim"))


def _layout(cfg: ModelConfig):
    """(name in our state_dict, or a list of per-layer names, or "#..." for legacy filler; shape) in file order.
    Builds a name per layer: only for a header that check_size has matched to its file."""
    C, Hd, L, KV = cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.kv_dim
    V, S, D = cfg.vocab_size, cfg.max_seq_len, cfg.head_dim
    per_layer = [("attention_norm.weight", (C,)), ("attention.wq.weight", (C, C)), ("attention.wk.weight", (KV, C)),
                 ("attention.wv.weight", (KV, C)), ("attention.wo.weight", (C, C)), ("ffn_norm.weight", (C,)),
                 ("feed_forward.w1.weight", (Hd, C)), ("feed_forward.w2.weight", (C, Hd)),
                 ("feed_forward.w3.weight", (Hd, C))]
    out = [("tok_embeddings.weight", (V, C))]
    out += [([f"layers.{i}.{name}" for i in range(L)], shape) for name, shape in per_layer]
    out += [("norm.weight", (C,)), ("#freq_cis_real", (S, D // 2)), ("#freq_cis_imag", (S, D // 2))]
    if not cfg.shared_classifier:
        out.append(("output.weight", (V, C)))
    return out


def shape_fields(cfg: ModelConfig) -> dict:
    """The header's fields and the two derived sizes the file layouts use."""
    return {**{n: getattr(cfg, n) for n in FIELDS}, "kv_dim": cfg.kv_dim, "half_head_dim": cfg.head_dim // 2}


def _v0_tensors(cfg: ModelConfig):
    return _V0_TENSORS + ([] if cfg.shared_classifier else [_V0_CLASSIFIER])


def float32_bytes(n: int) -> int:
    return 4 * n


def check_size(path, size: int, fields: dict, tensors, header_bytes: int):
    """Compare the size a header implies with the file's, by arithmetic on Python ints (no overflow, nothing
    allocated): a crafted header (a million layers in a 500 KB file) is refused before anything is built.
    tensors: (name, shape as keys of fields[, elements -> bytes in this format; float32 if not given])."""
    sizes = [(t[0], t[1], (t[2] if len(t) > 2 else float32_bytes)(math.prod(fields[f] for f in t[1]))) for t in tensors]
    want = header_bytes + sum(b for _, _, b in sizes)
    if size == want:
        return
    header = ", ".join(f"{n}={fields[n]}" for n in FIELDS)
    msg = (f"{os.fspath(path)}: expected {want} bytes for the shape in its header, found {size}: the file is "
           f"{'truncated' if size < want else 'longer than expected'} (header: {header})")
    name, shape, nbytes = max(sizes, key=lambda t: t[2])
    if nbytes > size:  # one tensor outgrows the file: a nonsense header, not a cut-off download
        msg += (f"; {name} ({' x '.join(shape)} = {' x '.join(str(fields[f]) for f in shape)}) alone would be "
                f"{nbytes} bytes, more than the whole file")
    raise ValueError(msg)


def expected_size(cfg: ModelConfig) -> int:
    fields = shape_fields(cfg)
    return HEADER.size + 4 * sum(math.prod(fields[f] for f in shape) for _, shape in _v0_tensors(cfg))


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
        if version == _RUNQ_VERSION:  # sniffing formats is loader.load_checkpoint's job; say where to go
            raise ValueError(f"{path}: a runq.c version-2 (Q8_0) file (magic 'ak42'); read it with minillm.load or "
                             f"minillm.formats.runq.load_runq "
                             f"(minillm.formats.loader.load_checkpoint takes either format)")
        raise ValueError(f"{path}: a llama2.c version-{version} export (magic 'ak42'); this reader takes "
                         f"the legacy v0 format that run.c reads (export with --version 0)")
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = HEADER.unpack(head)
    try:
        return ModelConfig(dim=dim, hidden_dim=hidden, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                           vocab_size=abs(vocab), max_seq_len=seq_len, shared_classifier=vocab > 0)
    except ValueError as e:
        raise ValueError(f"{path}: not a llama2.c v0 checkpoint, its header says {HEADER.unpack(head)}: {e}") from None


def load_bin(path) -> Transformer:
    """Read a v0 .bin into a Transformer (float32). Truncated or padded files raise, naming both sizes; a runq.c
    file raises, naming the reader to use (minillm.formats.loader.load_checkpoint sniffs which format a file is)."""
    cfg = read_header(path)
    check_size(path, os.path.getsize(path), shape_fields(cfg), _v0_tensors(cfg), HEADER.size)
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


def check_llama2c_model(cfg: ModelConfig, what: str = "llama2.c v0"):
    """A llama2.c file holds a Llama 2 block and nothing more: refuse what it would silently drop (Qwen's biases
    and q/k norms, RoPE scaling, a head_dim apart from dim / n_heads)."""
    if cfg.family != "llama" or cfg.rope_scaling is not None or cfg.q_dim != cfg.dim:
        raise ValueError(f"{what} holds a Llama 2 block; this model is {cfg.family!r} with rope_scaling="
                         f"{cfg.rope_scaling}, head_dim x n_heads = {cfg.q_dim} (dim {cfg.dim}), which the file cannot "
                         f"hold: export it as a Hugging Face folder (minillm export --hf)")


def save_bin(model: Transformer, path):
    """Write a v0 .bin that run.c reads. Raises if the model's numerics are not what v0 implies."""
    cfg = model.config
    check_llama2c_model(cfg)
    if cfg.rope_theta != 10000.0 or cfg.norm_eps != 1e-5:
        raise ValueError(f"llama2.c v0 implies rope_theta=10000 and norm_eps=1e-5; this model has "
                         f"rope_theta={cfg.rope_theta}, norm_eps={cfg.norm_eps}, which run.c would silently ignore")
    state = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in model.state_dict().items()}
    vocab = cfg.vocab_size if cfg.shared_classifier else -cfg.vocab_size
    with open_replacing(path) as f:
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
