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
import math
import os
from typing import Optional

import torch

from ..config import ModelConfig
from ..llama.transformer import Transformer
from .token_bytes import token_bytes

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


# ---------------------------------------------------------------------------- config.json
# Every check names the file, the field and the value: a hand-edited config fails here, not as a KeyError,
# a TypeError from "256" // 4 or a ZeroDivisionError deep in the model.
REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")
_JSON_TYPES = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def read_json(file) -> dict:
    """The JSON object in `file`; anything else (not JSON, a list, a number) is a ValueError naming the file."""
    try:
        with open(file, encoding="utf-8") as f:
            value = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{file} must hold a JSON object, found {_JSON_TYPES.get(type(value), type(value).__name__)}")
    return value


def _positive_int(file, name: str, value) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:  # bool is an int: true is not 1 here
        return value
    raise ValueError(f"{file}: {name}={value!r} must be a positive integer")


def _positive_float(file, name: str, value) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    raise ValueError(f"{file}: {name}={value!r} must be a positive number")


def _field(c: dict, file, name: str, check, default=None):
    """c[name] through check. A required field must be there; an optional one missing (or null) is `default`."""
    if name in REQUIRED:
        if name not in c:
            raise ValueError(f"{file}: required field {name!r} is missing "
                             f"(a Llama config.json has {', '.join(REQUIRED)})")
        return check(file, name, c[name])
    return default if c.get(name) is None else check(file, name, c[name])


FAMILIES = {  # model_type -> what it adds to the Llama block (SmolLM2, TinyLlama: plain "llama")
    "llama": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True},
}
ROPE_TYPES = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def _rope_scaling(c: dict, file) -> tuple[Optional[dict], Optional[float]]:
    """config.json's RoPE settings -> (rope_scaling for ModelConfig or None, rope_theta if given there).
    transformers 5 writes them as rope_parameters (theta inside), older files as rope_scaling."""
    key = "rope_parameters" if c.get("rope_parameters") else "rope_scaling"
    rope = c.get(key) or {}
    if not isinstance(rope, dict):
        raise ValueError(f"{file}: {key}={rope!r} must be a JSON object")
    kind = rope.get("rope_type", rope.get("type")) or "default"
    if kind not in ROPE_TYPES:
        why = (" (its frequencies depend on the current length, which a KV cache built at other lengths would "
               "mix)" if kind == "dynamic" else "")
        raise ValueError(f"{file}: {key}.rope_type={kind!r} is not supported{why}; supported: "
                         f"{', '.join(ROPE_TYPES)}")
    theta = _positive_float(file, f"{key}.rope_theta", rope["rope_theta"]) if "rope_theta" in rope else None
    if kind == "default":
        return None, theta
    scaling = {"rope_type": kind}
    for name in ROPE_TYPES[kind]:
        if name not in rope:
            raise ValueError(f"{file}: {key} of rope_type {kind!r} needs {name!r} ({', '.join(ROPE_TYPES[kind])})")
        scaling[name] = _positive_float(file, f"{key}.{name}", rope[name])
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ValueError(f"{file}: {key}.high_freq_factor={scaling['high_freq_factor']} must exceed "
                         f"low_freq_factor={scaling['low_freq_factor']}")
    return scaling, theta


def read_config(path) -> ModelConfig:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"no config.json in {path}")
    c = read_json(cfg_path)
    family = c.get("model_type", "llama")
    if family not in FAMILIES:
        raise ValueError(f"{cfg_path}: model_type={family!r} is not supported; supported: {', '.join(FAMILIES)} "
                         f"(SmolLM2 and TinyLlama are 'llama')")
    if c.get("hidden_act", "silu") != "silu" or c.get("attention_bias") or c.get("mlp_bias"):
        raise ValueError(f"{cfg_path}: hidden_act={c.get('hidden_act')!r}, attention_bias={c.get('attention_bias')}, "
                         f"mlp_bias={c.get('mlp_bias')}; this engine implements silu, with biases on q, k and v "
                         f"only (as Qwen2's)")
    if c.get("use_sliding_window"):
        raise ValueError(f"{cfg_path}: use_sliding_window=true is not supported (every layer attends to the whole "
                         f"context here)")
    partial = c.get("partial_rotary_factor", (c.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"{cfg_path}: partial_rotary_factor={partial!r} is not supported (RoPE rotates every "
                         f"dimension of a head here)")
    scaling, theta = _rope_scaling(c, cfg_path)
    if theta is None:
        theta = _field(c, cfg_path, "rope_theta", _positive_float, 10000.0)
    dim = _field(c, cfg_path, "hidden_size", _positive_int)
    heads = _field(c, cfg_path, "num_attention_heads", _positive_int)
    if c.get("head_dim") is None and dim % heads:
        raise ValueError(f"{cfg_path}: hidden_size={dim} is not divisible by num_attention_heads={heads}, and "
                         f"no head_dim is given")
    head_dim = _field(c, cfg_path, "head_dim", _positive_int, dim // heads)
    tie = c.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ValueError(f"{cfg_path}: tie_word_embeddings={tie!r} must be true or false")
    shape = dict(dim=dim, hidden_dim=_field(c, cfg_path, "intermediate_size", _positive_int),
                 n_layers=_field(c, cfg_path, "num_hidden_layers", _positive_int), n_heads=heads,
                 n_kv_heads=_field(c, cfg_path, "num_key_value_heads", _positive_int, heads),
                 vocab_size=_field(c, cfg_path, "vocab_size", _positive_int),
                 max_seq_len=_field(c, cfg_path, "max_position_embeddings", _positive_int, 2048),
                 rope_theta=theta, norm_eps=_field(c, cfg_path, "rms_norm_eps", _positive_float, 1e-6),
                 shared_classifier=tie, head_dim=None if head_dim * heads == dim else head_dim,
                 rope_scaling=scaling, **FAMILIES[family])
    try:
        return ModelConfig(**shape)
    except ValueError as e:  # what only the combination breaks, e.g. n_heads=4 is not divisible by n_kv_heads=3
        raise ValueError(f"{cfg_path}: {e}") from None


# ---------------------------------------------------------------------------- safetensors
def _load_safetensors(file) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    if not os.path.isfile(file):
        raise FileNotFoundError(f"safetensors file not found: {file}")
    try:
        return load_file(file)
    except SafetensorError as e:
        raise ValueError(f"{file}: not a readable safetensors file ({e})") from None


def _shards(path) -> tuple[list[str], dict]:
    """The shard files model.safetensors.index.json names, each checked to lie inside `path`: an index is data,
    and one naming /etc/... or ../.. must not make the loader read files outside the model directory."""
    index_file = os.path.join(path, "model.safetensors.index.json")
    weight_map = read_json(index_file).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_file}: weight_map must map tensor names to shard files, found {weight_map!r:.80}")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        norm = os.path.normpath(shard)
        if (os.path.isabs(shard) or os.path.splitdrive(shard)[0] or norm == os.pardir
                or norm.startswith(os.pardir + os.sep)):
            raise ValueError(f"{index_file}: shard {shard!r} is outside the model directory {path}; "
                             f"shards must be files inside it")
    return [os.path.join(path, shard) for shard in shards], {k: os.path.join(path, v) for k, v in weight_map.items()}


def _read_tensors(path) -> tuple[dict, dict]:
    """-> ({tensor name: tensor}, {tensor name: the file it came from})."""
    single, index = os.path.join(path, "model.safetensors"), os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(single):
        files, named = [single], None
    elif os.path.exists(index):
        files, named = _shards(path)
    else:
        raise FileNotFoundError(f"no model.safetensors (or model.safetensors.index.json) in {path}")
    gone = [f for f in files if not os.path.exists(f)]
    if gone:
        raise FileNotFoundError(f"{index} names shard {os.path.basename(gone[0])}, which is not in {path}")
    tensors, where = {}, {}
    for file in files:
        for name, t in _load_safetensors(file).items():
            if named is not None and named.get(name) != file:     # the index decides where each tensor is
                raise ValueError(f"{file} holds {name}, which {index} puts "
                                 f"{'in ' + os.path.basename(named[name]) if name in named else 'in no shard'}: "
                                 "a shard index must name each tensor's one file")
            # a NaN or an inf makes the sum nonfinite: one fast pass, 10x cheaper than isfinite().all(); summed in
            # float32 so that an fp16 tensor's sum cannot overflow (real weights never sum past 3e38)
            if t.is_floating_point() and not math.isfinite(float(t.sum(dtype=torch.float32))):
                raise ValueError(f"{file}: tensor {name} holds NaN or infinite values: refused (a corrupt file)")
            tensors[name], where[name] = t, file
    missing = sorted(set(named or ()) - set(tensors))
    if missing:
        raise ValueError(f"{index} names {len(missing)} tensors its shards do not hold, e.g. {missing[0]} in "
                         f"{os.path.basename(named[missing[0]])}")
    return tensors, where


def _hf_shapes(cfg: ModelConfig) -> dict:
    """HF name (without "model.") -> the shape config.json implies, per layer for the layer tensors."""
    C, Hd, V, HD, D = cfg.dim, cfg.hidden_dim, cfg.vocab_size, cfg.q_dim, cfg.head_dim
    return {"embed_tokens": (V, C), "norm": (C,), "lm_head": (V, C), "input_layernorm": (C,),
            "self_attn.q_proj": (HD, C), "self_attn.k_proj": (cfg.kv_dim, C), "self_attn.v_proj": (cfg.kv_dim, C),
            "self_attn.o_proj": (C, HD), "post_attention_layernorm": (C,), "mlp.gate_proj": (Hd, C),
            "mlp.down_proj": (C, Hd), "mlp.up_proj": (Hd, C), "self_attn.q_proj.bias": (HD,),
            "self_attn.k_proj.bias": (cfg.kv_dim,), "self_attn.v_proj.bias": (cfg.kv_dim,),
            "self_attn.q_norm": (D,), "self_attn.k_norm": (D,)}


def _layer_names(cfg: ModelConfig) -> dict:
    """HF tensor name in a layer -> ours, for this model's family."""
    names = {f"{theirs}.weight": f"{ours}.weight" for theirs, ours in _NAMES.items()}
    if cfg.qkv_bias:
        names.update({f"self_attn.{p}_proj.bias": f"attention.{p}_bias.bias" for p in "qkv"})
    if cfg.qk_norm:
        names.update({f"self_attn.{p}_norm.weight": f"attention.{p}_norm.weight" for p in "qk"})
    return names


def _to_pairs(theirs: str, w, cfg: ModelConfig, back: bool = False):
    """q's and k's rows (weights, biases) and the q/k norms' per-dimension weights into llama2.c's RoPE pairs
    (back=True: from them, for minillm.formats.hf_export)."""
    move = pairs_to_hf if back else hf_to_pairs
    if theirs.startswith(("self_attn.q_norm", "self_attn.k_norm")):
        return move(w[:, None], 1)[:, 0]                                   # (D,): one head
    heads = cfg.n_heads if theirs.startswith("self_attn.q_proj") else cfg.n_kv_heads  # GQA: k has n_kv_heads
    if theirs.startswith(("self_attn.q_proj", "self_attn.k_proj")):
        return move(w, heads) if w.dim() == 2 else move(w[:, None], heads)[:, 0]
    return w


def available_memory() -> Optional[int]:
    """Bytes this machine can still give (Linux's MemAvailable), or None where it cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(cfg: ModelConfig, path, free: Optional[int] = None):
    """Refuse, before reading a tensor, a model whose float32 weights (what load_hf builds) do not fit in the
    memory this machine has free; the message says the size, the free memory and what to try."""
    _check_memory(cfg.num_params() * 4, free, lambda need, have: (
        f"{path}: the model's {cfg.num_params() / 1e9:.2f} B weights take {need} GiB in float32, and this machine "
        f"has {have} GiB free; nothing was loaded. Try a smaller model, free memory, or (after loading elsewhere) "
        f"dtype='bfloat16' or quantization='int8' / 'int4', and a smaller max_model_len for the KV pool"))


def check_pool_fits(nbytes: int, config, free: Optional[int] = None):
    """Refuse, before allocating it, a KV pool bigger than the memory this machine has free: a Hugging Face
    model's context makes max_model_len large by default (Llama 3.2: 131,072 positions, 8 GiB at float32 for
    one sequence of the 1B model), which would end in the kernel's out-of-memory kill instead of a message."""
    _check_memory(nbytes, free, lambda need, have: (
        f"the KV pool needs {need} GiB (max_model_len={config.max_model_len}, max_num_seqs={config.max_num_seqs}, "
        f"kv_cache_bytes={config.kv_cache_bytes}) and this machine has {have} GiB free: lower max_model_len, or "
        f"set kv_cache_bytes (kv_cache_dtype='int8' quarters the pool)"))


def _check_memory(need: int, free: Optional[int], message):
    """MemoryError(message(need GiB, free GiB)) when need bytes exceed free (default: what the machine has free)."""
    free = available_memory() if free is None else free
    if free is not None and need > free:
        raise MemoryError(message(f"{need / 2 ** 30:.1f}", f"{free / 2 ** 30:.1f}"))

def load_hf(path) -> Transformer:
    cfg = read_config(path)
    check_fits(cfg, path)
    raw, where = _read_tensors(path)
    names = {k.removeprefix("model."): k for k in raw}                     # ours -> the file's own name
    hf = {k.removeprefix("model."): v for k, v in raw.items()}
    del raw
    shapes = _hf_shapes(cfg)
    dims = (f"hidden_size={cfg.dim}, intermediate_size={cfg.hidden_dim}, num_attention_heads={cfg.n_heads}, "
            f"num_key_value_heads={cfg.n_kv_heads}, head_dim={cfg.head_dim}, vocab_size={cfg.vocab_size}")

    def take(key: str, kind: str):
        """The tensor, checked against config.json's shape before any reshape or load_state_dict sees it."""
        if key not in hf:
            raise ValueError(f"{path}: tensor {key!r} missing from the safetensors files")
        w = hf.pop(key)
        if tuple(w.shape) != shapes[kind]:
            raise ValueError(f"{where[names[key]]}: tensor {names[key]!r} has shape {tuple(w.shape)}, config.json "
                             f"implies {shapes[kind]} ({dims})")
        return w.to(torch.float32)     # a no-op for float32 files; bfloat16/float16 are widened one tensor at a time

    if "lm_head.weight" not in hf:
        cfg.shared_classifier = True
    state = {"tok_embeddings.weight": take("embed_tokens.weight", "embed_tokens"),
             "norm.weight": take("norm.weight", "norm")}
    for i in range(cfg.n_layers):
        for theirs, ours in _layer_names(cfg).items():
            kind = theirs.removesuffix(".weight")
            state[f"layers.{i}.{ours}"] = _to_pairs(theirs, take(f"layers.{i}.{theirs}", kind), cfg)
    head = take("lm_head.weight", "lm_head") if "lm_head.weight" in hf else None
    leftover = sorted(k for k in hf if "rotary_emb" not in k)
    if leftover:
        raise ValueError(f"{path}: tensors this engine does not use for a {cfg.family} model: {leftover[:6]}")
    state["output.weight"] = state["tok_embeddings.weight"] if cfg.shared_classifier else head
    with torch.device("meta"):          # no random weights to overwrite: the file's tensors become the parameters
        model = Transformer(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.shared_classifier:
        model.output.weight = model.tok_embeddings.weight               # assign=True made two parameters: tie again
    return model.eval()


class HFTokenizer:
    """tokenizer.json through the `tokenizers` library, with the engine's Tokenizer interface."""

    def __init__(self, path):
        from tokenizers import Tokenizer as _T
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.exists(file):
            raise FileNotFoundError(f"tokenizer.json not found: looked for {file}")
        try:
            self._tok = _T.from_file(file)
        except Exception as e:                       # the tokenizers library's bare Exception names no file
            raise ValueError(f"{file}: not a tokenizer.json the tokenizers library can read ({e})") from None
        cfg_file = os.path.join(os.path.dirname(file), "config.json")
        c = read_json(cfg_file) if os.path.exists(cfg_file) else {}
        self.bos_id = c.get("bos_token_id", 1)
        if not isinstance(self.bos_id, int):
            raise ValueError(f"{cfg_file}: bos_token_id={self.bos_id!r}; prompts here start with a BOS token id")
        eos = c.get("eos_token_id", 2)
        self.stop_ids = set(eos) if isinstance(eos, list) else {eos}  # newer configs list several
        if not self.stop_ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in self.stop_ids):
            raise ValueError(f"{cfg_file}: eos_token_id={eos!r} must be a token id or a list of them")
        self.eos_id = min(self.stop_ids)
        gen_file = os.path.join(os.path.dirname(file), "generation_config.json")   # more stop ids, as vLLM reads
        more = read_json(gen_file).get("eos_token_id") if os.path.exists(gen_file) else None
        more = [more] if isinstance(more, int) else more if isinstance(more, list) else []
        self.stop_ids |= {i for i in more if isinstance(i, int) and not isinstance(i, bool)}
        tok_cfg = os.path.join(os.path.dirname(file), "tokenizer_config.json")      # the chat template, if any
        tc = read_json(tok_cfg) if os.path.exists(tok_cfg) else {}
        template = tc.get("chat_template")
        self.chat_template = template if isinstance(template, str) else None
        self.vocab_size = self._tok.get_vocab_size()
        self.adds_bos = self._adds_bos(tc.get("add_bos_token"))

    def _adds_bos(self, flag) -> bool:
        """Does a prompt start with BOS, as transformers' tokenizer(prompt) gives it? tokenizer_config.json's
        add_bos_token when it says; else what the tokenizer's post-processor prepends (Llama 3 and TinyLlama's
        template adds one, Qwen's byte-level post-processor none); a tokenizer.json without one: BOS, as before."""
        if isinstance(flag, bool):
            return flag
        if self._tok.post_processor is None:
            return True
        probe = self._tok.encode("a", add_special_tokens=True).ids
        return bool(probe) and probe[0] == self.bos_id and probe != self._tok.encode("a", add_special_tokens=False).ids

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """bos=True: BOS first where this model's tokenizer adds one (adds_bos)."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if bos and self.adds_bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids, prev_token=None) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_bytes(self) -> tuple[list, list, list]:
        """Each token's bytes as the detokenizer appends them, the same right after BOS, and whether it is text
        (structured output's token index: minillm.formats.token_bytes)."""
        return token_bytes(self._tok, self.vocab_size)
