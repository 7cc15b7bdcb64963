"""Tiny random-weight models of the open families, built with transformers' own config classes and written with
save_pretrained (no hub), each with a tokenizer trained here in its family's style: tests/test_model_families.py.

    llama3     LlamaConfig, rope_type "llama3", tied; byte-level BPE, <|begin_of_text|> added (Llama 3.x)
    qwen2      Qwen2Config (q, k, v biases), tied, theta 1e6; byte-level BPE, nothing added (Qwen2.5)
    qwen3      Qwen3Config (q/k norms, head_dim 32 with 4 heads of a 64-wide model); byte-level BPE (Qwen3)
    smollm2    LlamaConfig with 9 query / 3 KV heads, tied; byte-level BPE (SmolLM2)
    tinyllama  LlamaConfig, 4 / 1 heads, untied; SentencePiece-style BPE (byte fallback, "▁"), <s> added
"""
from __future__ import annotations

import json
import os

import torch

TEXT = os.path.join(os.path.dirname(__file__), "..", "minillm", "data", "sample.txt")
VOCAB = 384
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3_CHAT = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
               "{{ m['content'] }}<|eot_id|>{% endfor %}"
               "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
STYLE = {  # family -> (tokenizer kind, special tokens, bos, eos, the token its post-processor prepends, template)
    "llama3": ("bytelevel", ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                             "<|end_header_id|>"], "<|begin_of_text|>", "<|end_of_text|>", "<|begin_of_text|>",
               LLAMA3_CHAT),
    "qwen2": ("bytelevel", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>", "<|im_end|>", None, CHAT),
    "qwen3": ("bytelevel", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>", "<|im_end|>", None, CHAT),
    "smollm2": ("bytelevel", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_start|>", "<|im_end|>", None,
                CHAT),
    "tinyllama": ("sentencepiece", ["<unk>", "<s>", "</s>"], "<s>", "</s>", "<s>", None),
}


def train_text() -> tuple[str, str]:
    """(training text, held-out text): the shipped sample, its last tenth held out."""
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    cut = len(text) * 9 // 10
    return text[:cut], text[cut:]


def tokenizer(family: str):
    """A `tokenizers.Tokenizer` of VOCAB ids in the family's style, trained on the sample text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    kind, specials, _, _, prepends, _ = STYLE[family]
    lines = train_text()[0].splitlines(keepends=True)
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(lines, trainer)
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:   # Llama 2 / TinyLlama's tokenizer.json: "▁" for spaces, bytes as <0xNN> tokens when no piece fits
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials + byte_tokens, show_progress=False)
        tok.train_from_iterator(lines, trainer)      # ids 3 .. 258 reserved for the bytes, then made plain vocabulary
        spec = json.loads(tok.to_str())              # entries, as in Llama 2's file (only <unk>, <s>, </s> added)
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in specials]
        tok = Tokenizer.from_str(json.dumps(spec))
    if prepends is not None:
        pid = tok.token_to_id(prepends)
        tok.post_processor = processors.TemplateProcessing(single=f"{prepends} $A", pair=f"{prepends} $A $B",
                                                           special_tokens=[(prepends, pid)])
    return tok


def config(family: str, **overrides):
    """transformers' config for a tiny model of the family."""
    import transformers
    tok_ids = {name: i for i, name in enumerate(STYLE[family][1])}
    bos, eos = tok_ids[STYLE[family][2]], tok_ids[STYLE[family][3]]
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  bos_token_id=bos, eos_token_id=eos)
    if family == "llama3":
        c = transformers.LlamaConfig(**{**common, "rope_theta": 500000.0, "tie_word_embeddings": True, "rope_scaling": {
            "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}, **overrides})
    elif family == "qwen2":
        c = transformers.Qwen2Config(**{**common, "rope_theta": 1e6, "tie_word_embeddings": True, **overrides})
    elif family == "qwen3":
        c = transformers.Qwen3Config(**{**common, "head_dim": 32, "rope_theta": 1e6, "tie_word_embeddings": False,
                                        **overrides})
    elif family == "smollm2":
        c = transformers.LlamaConfig(**{**common, "hidden_size": 144, "num_attention_heads": 9,
                                        "num_key_value_heads": 3, "rope_theta": 100000.0, "tie_word_embeddings": True,
                                        **overrides})
    else:
        c = transformers.LlamaConfig(**{**common, "num_key_value_heads": 1, "tie_word_embeddings": False,
                                        **overrides})
    return c


def build(family: str, folder, seed: int = 0, dtype=torch.float32, max_shard_size=None, **overrides):
    """Write a random-weight model of the family (+ its tokenizer files) into folder -> the transformers model
    (float32, eval). Weights are N(0, 0.2) and norms 1 +- 0.1, biases N(0, 0.5): far from init, so a wrong
    permutation, a missing bias or norm shows at every position. max_shard_size (e.g. "100KB"): shards and an index."""
    import transformers
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config(family, **overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.normal_(0, 0.2)
    os.makedirs(folder, exist_ok=True)
    model.to(dtype).save_pretrained(folder, safe_serialization=True,
                                    **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    tok = tokenizer(family)
    tok.save(os.path.join(folder, "tokenizer.json"))
    _, _, bos, eos, prepends, template = STYLE[family]
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
               "add_bos_token": prepends is not None, "model_max_length": 4096}
    if template:
        tok_cfg["chat_template"] = template
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f)
    return model.float().eval()
