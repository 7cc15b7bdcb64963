"""export_hf: a model as a Hugging Face Llama directory, which transformers and vLLM load as LlamaForCausalLM.

    config.json              the shape (LlamaConfig's names), plus "minillm_export": where it came from
    generation_config.json   the stop ids (llama2.c vocabularies stop on BOS as well as EOS, as run.c does)
    model.safetensors        float weights with HF's names; wq and wk rows permuted to HF's half-split RoPE
    tokenizer.json           the tokenizer, for the `tokenizers` library (below)
    tokenizer_config.json    special tokens, the BOS rule and the chat template (minillm.formats.chat_template)
    special_tokens_map.json

It is hf.py's reader run backwards: load_hf(export_hf(m)) has m's weights bit for bit (the RoPE permutation is
a reshape). A quantized model (minillm.llama.linears) is exported as its dequantized weights, the matrices its
linear layers multiply by: the same numbers in float32, so 4x (int8) or 8x (int4) the bytes; Q8_0 and W8A8 also
quantize activations at run time, which a plain Llama cannot express, so their export is the weights only.
The export says so: a warning, the report, and config.json's "minillm_export".

The tokenizer: llama2.c's encode (minillm.llama.tokenizer) is SentencePiece-style BPE over code points with byte
fallback, a " " prefixed to the text, and merges chosen by the score of the merged piece (highest first,
leftmost on ties). `tokenizers`' BPE model merges by rank (lowest first, leftmost on ties), so every way of
splitting a piece into two pieces becomes a merge ranked by the piece's score; byte_fallback=True maps a code
point outside the vocabulary to <0xXX> tokens, and a Prepend(" ") normalizer is the dummy prefix (as Llama 2's
own tokenizer.json does, with "▁" for the space). Pieces keep their real spaces, so no pre-tokenizer splits the
text. BOS and EOS are named "<s>" and "</s>", as Llama's: like Llama's, the HF tokenizer reads those five
characters in a text as the special token (llama2.c's encodes them as text). tests/test_export_hf.py checks the
ids on the packaged held-out slice.
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn

from ..atomic import write_replacing, write_text_replacing
from ..llama.tokenizer import _NO_MERGE_AT_OR_BELOW, BOS, EOS, UNK, Tokenizer
from .chat_template import CHAT_TEMPLATE
from .hf import HFTokenizer, _layer_names, _to_pairs

SPECIALS = {UNK: "<unk>", BOS: "<s>", EOS: "</s>"}     # llama2.c's ids 0, 1, 2 under Llama's names
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json")
_ACTIVATIONS_QUANTIZED = {"Q80Linear": "q8_0", "W8A8Linear": "w8a8"}
_SCHEMES = {"Int8Linear": "int8", "Int4Linear": "int4", "AWQLinear": "awq", "Sparse24Linear": "2:4 sparse",
            **_ACTIVATIONS_QUANTIZED}
_BYTES = {"int8": 4, "q8_0": 4, "w8a8": 4, "int4": 8, "awq": 8}     # float32 bytes / the quantized weight's


@dataclass
class ExportReport:
    path: str
    files: list
    dtype: str                           # of model.safetensors
    dequantized: Optional[str] = None    # the quantization scheme whose weights were dequantized, if any
    notes: list = field(default_factory=list)


# ---------------------------------------------------------------------------- weights
def dense_weight(module: nn.Module) -> tuple[torch.Tensor, Optional[str]]:
    """The (N, K) matrix a linear layer multiplies by, and the scheme it was stored in (None: plain float)."""
    if isinstance(module, nn.Linear):
        return module.weight.detach(), None
    name = type(module).__name__
    if hasattr(module, "dequantize"):                                   # int8, int4, AWQ, Q8_0
        return module.dequantize(torch.float32), _SCHEMES.get(name, name)
    if hasattr(module, "w_scale"):                                      # W8A8 / SmoothQuant: W' diag(s)^-1
        w = module.w_q.float() * module.w_scale[:, None]                # (N, K)
        return (w / module.smooth[None, :] if module.smooth is not None else w), "w8a8"
    raise ValueError(f"cannot export a linear layer of type {name}: it has no dequantize()")


def hf_state_dict(model) -> tuple[dict, Optional[str]]:
    """Our Transformer's weights under HF's names (q/k rows in HF's RoPE layout). -> (state, scheme or None)."""
    cfg, state, schemes = model.config, {}, set()

    def put(module):
        w, scheme = dense_weight(module)
        schemes.add(scheme)
        return w

    state["model.embed_tokens.weight"] = model.tok_embeddings.weight.detach()
    state["model.norm.weight"] = model.norm.weight.detach()
    for i, layer in enumerate(model.layers):
        for theirs, ours in _layer_names(cfg).items():
            module = layer.get_submodule(ours.rsplit(".", 1)[0])
            plain = ours.endswith(("norm.weight", ".bias"))       # norms and Qwen2's biases: their own tensors
            w = getattr(module, ours.rsplit(".", 1)[1]).detach() if plain else put(module)
            state[f"model.layers.{i}.{theirs}"] = _to_pairs(theirs, w, cfg, back=True)   # q, k: HF's RoPE rows
    if not cfg.shared_classifier or not isinstance(model.output, nn.Linear):   # a quantized classifier is untied
        state["lm_head.weight"] = put(model.output)
    schemes.discard(None)
    dtype = model.tok_embeddings.weight.dtype
    state = {k: v.to(torch.float32 if schemes else dtype).contiguous().clone() for k, v in state.items()}
    return state, ("+".join(sorted(schemes)) if schemes else None)


ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hf_config(model, tied: bool, dtype: torch.dtype, bos_id: int, stop_ids: list, provenance: dict) -> dict:
    cfg = model.config
    rope = dict(cfg.rope_scaling) if cfg.rope_scaling else None
    if rope and "original_max_position_embeddings" in rope:
        rope["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
    return {
        "architectures": [ARCHITECTURES[cfg.family]], "model_type": cfg.family,
        "hidden_size": cfg.dim, "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": rope, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": tied, "bos_token_id": bos_id, "eos_token_id": stop_ids[0],
        "torch_dtype": str(dtype).removeprefix("torch."), "initializer_range": 0.02, "use_cache": True,
        "minillm_export": provenance,
    }


# ---------------------------------------------------------------------------- tokenizer
def llama2c_to_tokenizers(tok: Tokenizer):
    """A llama2.c Tokenizer as a `tokenizers.Tokenizer` that encodes text to the same ids (see the module doc)."""
    from tokenizers import AddedToken, decoders, models, normalizers, processors
    from tokenizers import Tokenizer as HFTok

    strings = []
    for i, p in enumerate(tok.pieces):
        if i in SPECIALS:
            strings.append(SPECIALS[i])
            continue
        try:
            strings.append(p.decode("utf-8"))
        except UnicodeDecodeError:        # a piece no text can produce (run.c groups bytes into code points)
            strings.append(f"<minillm:piece {i}>")
    vocab = {}
    for i, s in enumerate(strings):
        if s in vocab:
            raise ValueError(f"tokenizer: tokens {vocab[s]} and {i} are both {s!r}; a tokenizer.json vocabulary "
                             f"needs unique strings")
        vocab[s] = i
    merges = []                                                          # (-score, id, left, right)
    for i, p in enumerate(tok.pieces):
        if i in SPECIALS or len(p) < 2 or not tok.scores[i] > _NO_MERGE_AT_OR_BELOW:
            continue
        for k in range(1, len(p)):
            a, b = tok.lookup.get(p[:k]), tok.lookup.get(p[k:])
            if a is not None and b is not None and a not in SPECIALS and b not in SPECIALS \
                    and strings[a] + strings[b] == strings[i]:
                merges.append((-float(tok.scores[i]), i, k, strings[a], strings[b]))
    merges.sort()
    model = models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], unk_token=SPECIALS[UNK],
                       byte_fallback=True, fuse_unk=False)
    out = HFTok(model)
    out.normalizer = normalizers.Prepend(" ")                            # run.c's dummy prefix (not on "")
    out.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    out.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS.values()])
    out.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", BOS)])
    return out


def tokenizer_files(tokenizer) -> tuple[object, dict, list]:
    """-> (tokenizers.Tokenizer, tokenizer_config.json, stop ids, the first being EOS) for a llama2.c Tokenizer or
    an HFTokenizer."""
    if isinstance(tokenizer, Tokenizer):
        hf, stops = llama2c_to_tokenizers(tokenizer), [EOS, BOS]     # run.c stops on BOS too (detokenizer.py)
        bos, eos = SPECIALS[BOS], SPECIALS[EOS]
    elif isinstance(tokenizer, HFTokenizer):
        hf, stops = tokenizer._tok, sorted(tokenizer.stop_ids, key=lambda t: t != tokenizer.eos_id)
        bos, eos = hf.id_to_token(tokenizer.bos_id), hf.id_to_token(tokenizer.eos_id)
    else:
        raise ValueError(f"cannot export a tokenizer of type {type(tokenizer).__name__}: export_hf writes "
                         "llama2.c Tokenizers and tokenizer.json ones (minillm.load's two kinds)")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "unk_token": SPECIALS[UNK] if isinstance(tokenizer, Tokenizer) else None,
              "add_bos_token": getattr(tokenizer, "adds_bos", True),
              "add_eos_token": False, "clean_up_tokenization_spaces": False,
              "chat_template": getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE}
    return hf, config, stops


# ---------------------------------------------------------------------------- the directory
def check_dir(path, force: bool) -> list:
    """A directory export_hf may write: absent, empty, or (force=True) not empty. -> what is in it."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"export_hf: {path} exists and is not a directory")
    present = sorted(os.listdir(path)) if os.path.isdir(path) else []
    if present and not force:
        raise ValueError(f"export_hf: {path} is not empty ({len(present)} entries: {', '.join(present[:5])}); "
                         f"pass force=True (--force) to write into it")
    return present


def _clear_stale(path: str, present: list):
    for name in present:                     # weights that would shadow or mix with ours
        if name.startswith(("model-", "pytorch_model")) or name in ("model.safetensors.index.json",
                                                                     "tokenizer.model"):
            os.remove(os.path.join(path, name))


def _resolve(model, tokenizer):
    """export_hf's model argument -> (Transformer, tokenizer, source name)."""
    from .loader import load
    if hasattr(model, "engine") and hasattr(model, "tokenizer"):        # an LLM: the model its engine runs
        return model.engine.model, tokenizer or model.tokenizer, "LLM"
    if isinstance(model, (str, os.PathLike)):
        net, tok = load(model, tokenizer)
        return net, tok, os.fspath(model)
    if tokenizer is None:
        raise ValueError("export_hf(model, dir): a Transformer needs tokenizer= (tokenizer files are part of "
                         "the export); or pass a model name, a path or an LLM")
    if isinstance(tokenizer, (str, os.PathLike)):
        _, tokenizer = load(model, tokenizer)
    return model, tokenizer, type(model).__name__


def export_hf(model, path, tokenizer=None, *, force: bool = False) -> ExportReport:
    """Write `model` as a Hugging Face Llama directory at `path`; see the module doc.
    model: a Transformer (with tokenizer=), a model name or path (minillm.load), or an LLM (its engine's model,
    quantized if the LLM quantized it). A non-empty `path` needs force=True. -> ExportReport."""
    from safetensors.torch import save_file
    net, tok, source = _resolve(model, tokenizer)
    path = os.fspath(path)
    present = check_dir(path, force)
    state, scheme = hf_state_dict(net)
    hf_tok, tok_config, stops = tokenizer_files(tok)
    if hf_tok.get_vocab_size(with_added_tokens=True) != net.config.vocab_size:
        raise ValueError(f"the tokenizer has {hf_tok.get_vocab_size()} tokens but the model's vocab_size is "
                         f"{net.config.vocab_size}")
    dtype = next(iter(state.values())).dtype
    notes = []
    if scheme:
        ratio = f"; about {_BYTES[scheme]}x the bytes of the quantized weights" if scheme in _BYTES else ""
        notes.append(f"the model's {scheme} weights were exported dequantized to float32 (the matrices its linear "
                     f"layers multiply by{ratio})")
        if any(s in scheme for s in _ACTIVATIONS_QUANTIZED.values()):
            notes.append(f"{scheme} also quantizes activations at run time, which a plain Llama does not: "
                         f"the export computes in float, so its logits differ slightly from the quantized model's")
        warnings.warn("export_hf: " + "; ".join(notes), stacklevel=2)
    provenance = {"source": source, "dequantized_from": scheme, "notes": notes}
    tied = "lm_head.weight" not in state
    os.makedirs(path, exist_ok=True)
    _clear_stale(path, present)
    write_replacing(os.path.join(path, "model.safetensors"), lambda f: save_file(state, f, metadata={"format": "pt"}))
    _write_json(path, "config.json", hf_config(net, tied, dtype, tok.bos_id, stops, provenance))
    _write_json(path, "generation_config.json", {"bos_token_id": tok.bos_id,
                                                 "eos_token_id": stops if len(stops) > 1 else stops[0]})
    write_replacing(os.path.join(path, "tokenizer.json"), hf_tok.save)
    _write_json(path, "tokenizer_config.json", tok_config)
    _write_json(path, "special_tokens_map.json", {k: tok_config[k] for k in ("bos_token", "eos_token", "unk_token")
                                                  if tok_config[k] is not None})
    return ExportReport(path, list(FILES), str(dtype).removeprefix("torch."), scheme, notes)


def _write_json(path: str, name: str, value: dict):
    write_text_replacing(os.path.join(path, name), json.dumps(value, indent=2, ensure_ascii=False) + "\n")
