"""minillm.load(model) -> (Transformer, tokenizer): one entry point for every kind of model.

`model` may be
  - a registered name: a model shipped inside the package (see REGISTRY);
  - "random:<preset>" (e.g. "random:tiny", "random:stories15M"): a randomly initialised model of a
    named shape with a BPE tokenizer trained on the packaged Hamlet excerpt (for experiments before,
    or without, trained weights; its text is gibberish by design);
  - a llama2.c `.bin` file, v0 or runq.c's Q8_0 version 2 (tokenizer: `tokenizer=` or a `tokenizer.bin` beside it),
    or a mixture-of-experts file (minillm.formats.moe) beside the dense `.bin` it was upcycled from;
  - a Hugging Face Llama directory (config.json + model.safetensors + tokenizer.json).
"""
from __future__ import annotations

import copy
import functools
import os

import torch

from ..config import DTYPES, PRESETS, ModelConfig
from ..llama.tokenizer import Tokenizer
from ..llama.transformer import Transformer
from ..paths import MODELS_DIR, PACKAGE_DIR, SAMPLE_TEXT  # noqa: F401 - re-exported: `from .loader import MODELS_DIR`
from .bpe import train_bpe
from .hf import HFTokenizer, is_hf_dir, load_hf
from .llama2c import load_bin
from .moe import is_moe_file, load_moe
from .runq import is_runq, load_runq

# name -> (checkpoint file, tokenizer file), relative to minillm/models (see MODEL_CARD.md there)
REGISTRY: dict[str, tuple[str, str]] = {
    "shakespeare": ("shakespeare.bin", "tokenizer.bin"),
    "shakespeare-draft": ("shakespeare-draft.bin", "tokenizer.bin"),
    "shakespeare-draft-scratch": ("shakespeare-draft-scratch.bin", "tokenizer.bin"),  # same shape, no teacher
    "shakespeare-moe": ("shakespeare-moe.safetensors", "tokenizer.bin"),  # experts only; the rest from shakespeare.bin
}


def available_models() -> list[str]:
    shipped = [n for n, (ck, _) in REGISTRY.items() if os.path.exists(os.path.join(MODELS_DIR, ck))]
    return shipped + [f"random:{p}" for p in PRESETS]


@functools.lru_cache(maxsize=8)
def sample_tokenizer(vocab_size: int) -> Tokenizer:
    """A BPE tokenizer of exactly vocab_size tokens trained on the packaged excerpt; if the excerpt runs
    out of merges (large vocabularies), the rest are unique filler tokens that never occur in text."""
    text = open(SAMPLE_TEXT, encoding="utf-8").read()
    tok = train_bpe(text, vocab_size)
    pieces, scores = list(tok.pieces), tok.scores.tolist()
    low = min(scores)
    while len(pieces) < vocab_size:
        pieces.append(b"<unused%d>" % len(pieces))
        scores.append(low - 1.0)
    return Tokenizer(pieces, scores)


def random_model(preset: str, seed: int = 0, **overrides) -> tuple[Transformer, Tokenizer]:
    cfg = ModelConfig.from_name(preset, **overrides)
    return Transformer(cfg).init_weights(seed).eval(), sample_tokenizer(cfg.vocab_size)


def load_checkpoint(path) -> Transformer:
    """A llama2.c .bin of either kind: runq.c's Q8_0 version 2 (magic 'ak42') or the legacy v0 run.c reads; or an
    upcycled mixture of experts (minillm.formats.moe: a safetensors file of experts beside its dense .bin).
    Sniffing lives here, above the readers, so checkpoint.py need not import runq.py (an import circle)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if is_moe_file(path):
        return load_moe(path)
    return load_runq(path) if is_runq(path) else load_bin(path)


def _check_types(model, tokenizer):
    """A wrong type fails here, by name, rather than as an AttributeError or TypeError deep in a reader."""
    if not isinstance(model, (str, os.PathLike, Transformer)):
        raise ValueError(f"model= must be a registered name, 'random:<preset>', a path to a .bin file or a HF "
                         f"directory (str or os.PathLike), or a Transformer; got {type(model).__name__}: {model!r:.80}")
    is_tokenizer = all(hasattr(tokenizer, a) for a in ("encode", "decode", "vocab_size"))
    if not (tokenizer is None or isinstance(tokenizer, (str, os.PathLike)) or is_tokenizer):
        raise ValueError(f"tokenizer= must be None, a path to a tokenizer.bin / tokenizer.json / HF directory (str or "
                         f"os.PathLike), or a tokenizer object (encode, decode, vocab_size); "
                         f"got {type(tokenizer).__name__}: {tokenizer!r:.80}")


def load_tokenizer(path, vocab_size: int | None = None):
    if os.path.isdir(path) or str(path).endswith(".json"):
        return HFTokenizer(path)
    return Tokenizer.load(path, vocab_size)


def load(model, tokenizer=None, dtype: str = "float32", seed: int = 0):
    """-> (Transformer in eval mode, tokenizer). Errors name what was looked for and what exists."""
    _check_types(model, tokenizer)
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if isinstance(model, Transformer):
        if tokenizer is None:
            raise ValueError("a Transformer object needs tokenizer= (a Tokenizer or a tokenizer.bin path)")
        net = model
    elif str(model).startswith("random:"):
        net, tok = random_model(str(model)[len("random:"):], seed)
        tokenizer = tokenizer if tokenizer is not None else tok
    elif model in REGISTRY:
        ck, tk = REGISTRY[model]
        path = os.path.join(MODELS_DIR, ck)
        if not os.path.exists(path):
            raise FileNotFoundError(f"model {model!r} is registered but its file is missing: {path}")
        net = load_checkpoint(path)
        tokenizer = tokenizer if tokenizer is not None else os.path.join(MODELS_DIR, tk)
    elif is_hf_dir(model):
        net = load_hf(model)
        tokenizer = tokenizer if tokenizer is not None else model
    elif os.path.isfile(model):
        net = load_checkpoint(model)
        if tokenizer is None:
            tokenizer = os.path.join(os.path.dirname(os.path.abspath(model)), "tokenizer.bin")
            if not os.path.exists(tokenizer):
                raise FileNotFoundError(f"no tokenizer given for {model}; looked for {tokenizer}. "
                                        f"Pass tokenizer=PATH (the CLI's -z / --tokenizer)")
    elif os.sep in str(model) or str(model).endswith(".bin"):
        raise FileNotFoundError(f"model file or directory not found: {model}")
    else:
        raise ValueError(f"unknown model {model!r}: not a registered name, a .bin file or a HF directory. "
                         f"Available: {', '.join(available_models())}")
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer, net.config.vocab_size)
        if isinstance(tokenizer, HFTokenizer):
            if tokenizer.vocab_size > net.config.vocab_size:
                raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is only "
                                 f"{net.config.vocab_size}: they are not each other's")
            tokenizer.vocab_size = net.config.vocab_size   # the model's rows past the tokenizer's ids (Qwen2.5 pads
                                                           # 151,665 to 151,936) are ids no text has
    if tokenizer.vocab_size != net.config.vocab_size and not isinstance(tokenizer, HFTokenizer):
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is "
                         f"{net.config.vocab_size}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    if isinstance(model, Transformer) and next(net.parameters()).dtype != getattr(torch, dtype):
        net = copy.deepcopy(net)  # never convert the caller's module's weights
    net = net.to(getattr(torch, dtype))  # weights and the RoPE tables
    return net, tokenizer
