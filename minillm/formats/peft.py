"""LoRA adapters in PEFT's format, the one Hugging Face's `peft` library saves and loads for a Llama:

    adapter_config.json           {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", ...],
                                   "base_model_name_or_path": ..., "task_type": "CAUSAL_LM", ...}
    adapter_model.safetensors     base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   (r, K)
                                  base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   (N, r)
                                  ... mlp.gate_proj / up_proj / down_proj

The names are those of minillm.formats.hf_export's Llama (q_proj = wq, gate_proj = w1, up_proj = w3, down_proj = w2),
and so is the row order: hf_export permutes wq's and wk's rows from llama2.c's interleaved RoPE pairs to HF's
half-split layout (minillm.formats.hf), so an adapter's lora_B rows for q_proj and k_proj are permuted the same way
on save and back on load (lora_A, and every other module, need nothing: their rows are not RoPE pairs). So
`PeftModel.from_pretrained(<the HF export>, <this directory>)` computes what minillm's adapter does
(tests/test_lora_peft.py checks the logits).

Names: `lora="comedies"` is a shipped adapter, minillm/models/lora/comedies/; any directory holding an
adapter_config.json works too. PEFT options that change the computation in ways this engine does not implement
(DoRA, biases, modules_to_save, per-layer ranks, fan_in_fan_out) are refused by name; rsLoRA's scaling is supported.
"""
from __future__ import annotations

import json
import os
import re
from typing import Optional

import torch

from ..atomic import open_replacing, write_replacing
from ..config import ModelConfig
from ..lora.adapters import MODULES, LoRAAdapter, check_adapter
from ..paths import MODELS_DIR
from .hf import _NAMES, hf_to_pairs, pairs_to_hf

LORA_DIR = os.path.join(MODELS_DIR, "lora")              # shipped adapters, one folder each
CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
HF_MODULES = {theirs: ours for theirs, ours in _NAMES.items() if ours in MODULES}   # "self_attn.q_proj" -> ours
SHORT = {theirs.split(".")[1]: ours for theirs, ours in HF_MODULES.items()}          # "q_proj" -> "attention.wq"
HF_NAME = {ours: short for short, ours in SHORT.items()}                              # "attention.wq" -> "q_proj"
_KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")
# PEFT settings whose non-default value changes the computation: refused (name -> the value this engine runs)
_UNSUPPORTED = {"use_dora": False, "bias": "none", "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
                "layers_to_transform": None, "fan_in_fan_out": False, "lora_bias": False}


def shipped_adapters() -> list:
    """Names of the adapters shipped in minillm/models/lora/."""
    if not os.path.isdir(LORA_DIR):
        return []
    return sorted(d for d in os.listdir(LORA_DIR) if os.path.isfile(os.path.join(LORA_DIR, d, CONFIG)))


def resolve_adapter(spec) -> str:
    """A shipped adapter's name or a directory with adapter_config.json -> that directory. ValueError naming the
    shipped ones otherwise."""
    if not isinstance(spec, (str, os.PathLike)):
        raise ValueError(f"lora= takes an adapter's name, a directory with {CONFIG}, or a LoRAAdapter; "
                         f"got {type(spec).__name__}")
    path = os.fspath(spec)
    if os.path.isfile(os.path.join(path, CONFIG)):
        return path
    if os.sep not in path and os.path.isfile(os.path.join(LORA_DIR, path, CONFIG)):
        return os.path.join(LORA_DIR, path)
    shipped = ", ".join(shipped_adapters()) or "none"
    raise ValueError(f"unknown LoRA adapter {path!r}: not a shipped adapter ({shipped}) nor a directory holding "
                     f"{CONFIG}")


def _config(path: str) -> dict:
    try:
        with open(os.path.join(path, CONFIG), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}/{CONFIG}: not readable JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise ValueError(f"{path}/{CONFIG}: peft_type must be 'LORA', got {cfg.get('peft_type')!r}"
                         if isinstance(cfg, dict) else f"{path}/{CONFIG}: not a JSON object")
    for name, ok in _UNSUPPORTED.items():
        value = cfg.get(name, ok)
        if value != ok and value not in (None, {}, [], False):      # absent, null or empty: PEFT's default
            raise ValueError(f"{path}/{CONFIG}: {name}={cfg[name]!r} is not supported by minillm's LoRA "
                             f"(it runs {name}={ok!r})")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"{path}/{CONFIG}: r must be a positive integer, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"{path}/{CONFIG}: lora_alpha must be a number, got {alpha!r}")
    targets = cfg.get("target_modules")
    targets = [targets] if isinstance(targets, str) else targets
    if not isinstance(targets, list) or not targets or set(targets) - set(SHORT):
        raise ValueError(f"{path}/{CONFIG}: target_modules must list some of {sorted(SHORT)}, got "
                         f"{cfg.get('target_modules')!r}")
    return dict(cfg, target_modules=targets)


def load_adapter(spec, model_config: ModelConfig, max_rank: Optional[int] = None) -> LoRAAdapter:
    """A PEFT LoRA directory (or a shipped adapter's name) -> LoRAAdapter in this model's layout, checked against
    model_config (shapes named in HF's terms) and max_rank."""
    from safetensors.torch import load_file
    path = resolve_adapter(spec)
    cfg = _config(path)
    try:
        tensors = load_file(os.path.join(path, WEIGHTS))
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path}/{WEIGHTS}: not a readable safetensors file ({e})") from None
    parts: dict = {}
    for key, t in tensors.items():
        m = _KEY.fullmatch(key)
        if m is None or m.group(3) not in SHORT or f"{m.group(2)}.{m.group(3)}" not in HF_MODULES:
            raise ValueError(f"{path}/{WEIGHTS}: tensor {key!r} is not a LoRA weight of a Llama linear "
                             "(expected base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight and alike)")
        if m.group(3) not in cfg["target_modules"]:
            raise ValueError(f"{path}/{WEIGHTS}: {key} is for {m.group(3)}, which target_modules "
                             f"{cfg['target_modules']} does not list")
        parts.setdefault((int(m.group(1)), SHORT[m.group(3)]), {})[m.group(4)] = t.float()
    weights = {}
    for (layer, module), ab in sorted(parts.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{path}/{WEIGHTS}: layer {layer} {HF_NAME[module]} has lora_{''.join(ab)} "
                             f"but not lora_{'B' if 'A' in ab else 'A'}")
        weights[(layer, module)] = (ab["A"], _rows(ab["B"], module, model_config, hf_to_pairs))
    if not weights:
        raise ValueError(f"{path}/{WEIGHTS}: holds no LoRA weights")
    name = os.path.basename(os.path.normpath(path))
    adapter = LoRAAdapter(name, cfg["r"], float(cfg.get("lora_alpha", cfg["r"])), weights,
                          bool(cfg.get("use_rslora", False)), str(cfg.get("base_model_name_or_path") or ""))
    check_adapter(adapter, model_config, max_rank, label=lambda m: HF_NAME[m])
    return adapter


def _rows(b: torch.Tensor, module: str, cfg: ModelConfig, permute) -> torch.Tensor:
    """lora_B's rows of q_proj / k_proj between the layouts (hf_to_pairs on load, pairs_to_hf on save); a B whose
    row count does not match is left for check_adapter to name."""
    heads = {"attention.wq": cfg.n_heads, "attention.wk": cfg.n_kv_heads}.get(module)
    if heads is None or b.shape[0] != heads * cfg.head_dim:
        return b
    return permute(b, heads).contiguous()


def save_adapter(adapter: LoRAAdapter, path, model_config: ModelConfig, dtype: torch.dtype = torch.float32,
                 base_model: Optional[str] = None) -> list:
    """Write `adapter` as a PEFT LoRA directory (PEFT's own file names, keys and config fields). dtype: of the
    stored tensors (float16 halves the file; loading reads them back as float32). -> the files written."""
    from safetensors.torch import save_file
    check_adapter(adapter, model_config)
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for (layer, module), (a, b) in sorted(adapter.weights.items()):
        theirs = next(t for t, o in HF_MODULES.items() if o == module)
        prefix = f"base_model.model.model.layers.{layer}.{theirs}"
        tensors[f"{prefix}.lora_A.weight"] = a.detach().to(dtype).contiguous()
        tensors[f"{prefix}.lora_B.weight"] = _rows(b.detach(), module, model_config, pairs_to_hf).to(dtype).contiguous()
    write_replacing(os.path.join(path, WEIGHTS), lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model or adapter.base_model,
           "r": adapter.rank, "lora_alpha": adapter.alpha, "lora_dropout": 0.0, "use_rslora": adapter.use_rslora,
           "target_modules": [HF_NAME[m] for m in adapter.target_modules], "bias": "none", "fan_in_fan_out": False,
           "inference_mode": True, "init_lora_weights": True, "modules_to_save": None, "use_dora": False,
           "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None, "layers_pattern": None,
           "revision": None}
    with open_replacing(os.path.join(path, CONFIG), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return [os.path.join(path, CONFIG), os.path.join(path, WEIGHTS)]
