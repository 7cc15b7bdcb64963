"""The open model families from their Hugging Face folders (issue 35): Llama 3.x (llama3 RoPE scaling), Qwen2.5
(q, k, v biases), Qwen3 (q/k norms, head_dim apart from hidden_size), SmolLM2 (9/3 heads), TinyLlama (a
SentencePiece-style tokenizer.json). Each is a tiny random-weight model written by transformers' own
save_pretrained (tests/families.py), compared with transformers itself."""
import json

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is in the dev extra")

import families  # noqa: E402
from close import assert_close  # noqa: E402

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.formats.hf import HFTokenizer, load_hf, read_config  # noqa: E402
from minillm.llama.transformer import Transformer  # noqa: E402

FAMILIES = list(families.STYLE)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """family -> (folder, the transformers model), built once for the module."""
    out = {}
    for family in FAMILIES:
        folder = tmp_path_factory.mktemp(family)
        out[family] = (str(folder), families.build(family, folder))
    return out


def tokens(n: int = 64, seed: int = 1):
    return torch.randint(0, families.VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers_at_every_position(built, family):
    folder, hf = built[family]
    ours = load_hf(folder)
    x = tokens()
    with torch.no_grad():
        want, got = hf(x).logits, ours(x)
    # 1e-4: both float32; the same sums in another order (pairs against rotate_half, fused norms), on logits of
    # size ~3 from N(0, 0.2) weights; measured within 2.1e-5 for every family
    assert_close(got, want, atol=1e-4, rtol=1e-4, name=f"{family} logits, 2 x 64 positions")


@pytest.mark.parametrize("family,without", [
    ("llama3", dict(rope_scaling=None)),           # plain RoPE: the scaled frequencies are what positions > 0 read
    ("qwen2", dict(qkv_bias=False)),               # the biases dropped (what a quantized linear once did)
    ("qwen3", dict(qk_norm=False)),                # no q/k norms
])
def test_each_family_setting_is_what_makes_them_agree(built, family, without):
    """The comparison above can fail: the same weights without the family's setting are off by far more."""
    folder, hf = built[family]
    ours = load_hf(folder)
    cfg = read_config(folder)
    for k, v in without.items():
        setattr(cfg, k, v)
    plain = Transformer(cfg)
    state = {k: v for k, v in ours.state_dict().items() if k in plain.state_dict()}
    plain.load_state_dict(state, strict=True)
    x = tokens()
    with torch.no_grad():
        assert (plain.eval()(x) - hf(x).logits).abs().max() > 1e-2


@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_32_tokens_equal_transformers_generate(built, family, backend):
    folder, hf = built[family]
    llm = LLM(folder, backend=backend)
    prompt = "ROMEO: But soft, what light"
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0]
    ids = out.prompt_token_ids
    assert ids == HFTokenizer(folder)._tok.encode(prompt).ids       # BOS where the family's tokenizer adds one
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=32, do_sample=False, eos_token_id=None,
                           pad_token_id=families.VOCAB - 1)[0, len(ids):].tolist()
        logits = hf(torch.tensor([ids + want])).logits[0, len(ids) - 1:-1]       # (32, V) at each step
    # float32 on both sides: compare up to the first step whose top-2 margin is under 1e-4 (DESIGN rule 7); with
    # these weights no margin is that small, so all 32 are compared
    top2 = logits.topk(2).values
    safe = next((i for i, m in enumerate((top2[:, 0] - top2[:, 1]).tolist()) if m < 1e-4), len(want))
    assert safe >= 24, f"only {safe} steps comparable"
    assert out.token_ids[:safe] == want[:safe]


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_ids_equal_tokenizers_and_autotokenizer_on_held_out_text(built, family):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    folder, _ = built[family]
    text = families.train_text()[1][:2000]
    ours = HFTokenizer(folder)
    ids = ours.encode(text)
    assert ids == Tokenizer.from_file(f"{folder}/tokenizer.json").encode(text).ids
    assert ids == AutoTokenizer.from_pretrained(folder)(text)["input_ids"]
    assert ours.decode(ids) == text
    assert ours.adds_bos == (families.STYLE[family][4] is not None)


def test_bfloat16_weights_load_widened_and_run_in_bfloat16(tmp_path):
    from transformers import AutoModelForCausalLM
    families.build("qwen3", tmp_path, dtype=torch.bfloat16)              # the file holds bfloat16 tensors
    ours = load_hf(tmp_path)
    assert next(ours.parameters()).dtype == torch.float32
    with open(tmp_path / "model.safetensors", "rb") as f:
        assert b'"dtype":"BF16"' in f.read(4096)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()   # the same values, widened
    x = tokens(32)
    with torch.no_grad():
        ref = hf(x).logits
        assert_close(ours(x), ref, atol=1e-4, rtol=1e-4, name="bfloat16 file, float32 compute")
        low = LLM(str(tmp_path), dtype="bfloat16", backend="torch").engine.runner.model
        assert next(low.parameters()).dtype == torch.bfloat16
        # bfloat16 compute: 8 bits of mantissa, relative error ~4e-3 per op over 2 layers; 0.15 absolute on
        # logits of size ~3 is ~5%
        assert_close(low(x).float(), ref, atol=0.15, rtol=0.05, name="bfloat16 compute")


def test_sharded_safetensors_with_an_index_load_as_one_file(built, tmp_path):
    import os
    hf = families.build("qwen2", tmp_path, max_shard_size="100KB")
    shards = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert len(shards) > 1 and os.path.exists(tmp_path / "model.safetensors.index.json")
    x = tokens(16)
    with torch.no_grad():
        assert_close(load_hf(tmp_path)(x), hf(x).logits, atol=1e-4, rtol=1e-4, name="sharded qwen2")


@pytest.mark.parametrize("edit,message", [
    ({"model_type": "gemma"}, "model_type='gemma' is not supported; supported: llama, qwen2, qwen3"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type='dynamic' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "needs 'low_freq_factor'"),
    ({"use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not supported"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.25}},
     "partial_rotary_factor=0.25 is not supported"),
    ({"attention_bias": True}, "attention_bias=True"),
])
def test_refusals_name_the_value(built, tmp_path, edit, message):
    import shutil
    folder, _ = built["llama3"]
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    c = json.load(open(tmp_path / "config.json"))
    c.pop("rope_parameters", None)
    json.dump({**c, **edit}, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_hf(tmp_path)


def test_generation_config_eos_list_stops_generation(built, tmp_path):
    import shutil
    folder, _ = built["qwen2"]
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    free = LLM(str(tmp_path)).generate("ROMEO:", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    stop = free.token_ids[3]                                             # a token the model emits 4th
    json.dump({"eos_token_id": [families.STYLE["qwen2"][1].index("<|im_end|>"), stop]},
              open(tmp_path / "generation_config.json", "w"))
    out = LLM(str(tmp_path)).generate("ROMEO:", SamplingParams(temperature=0, max_tokens=12))[0]
    assert out.outputs[0].finish_reason == "stop"
    assert out.token_ids == free.token_ids[:free.token_ids.index(stop) + 1]


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
def test_export_back_to_a_hugging_face_folder_that_transformers_reads(built, family, tmp_path):
    from transformers import AutoModelForCausalLM

    from minillm.formats.hf_export import export_hf
    folder, hf = built[family]
    export_hf(folder, tmp_path / "out")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert back.config.model_type == hf.config.model_type
    x = tokens(32)
    with torch.no_grad():
        assert_close(back(x).logits, hf(x).logits, atol=1e-5, rtol=1e-5, name=f"{family} exported and re-read")


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("option", [dict(quantization="int8"), dict(kv_cache_dtype="int8"),
                                    dict(enable_prefix_caching=True, enable_chunked_prefill=True,
                                                                      max_num_batched_tokens=8)])
def test_weight_and_cache_options_run_these_models_on_numba_as_on_torch(built, family, option):
    """Quantized weights (the biases stay beside the int8 linears), int8 KV and chunked prefill with prefix
    caching: numba's tokens equal torch's for the same option (the same arithmetic up to float order)."""
    folder, _ = built[family]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = ["ROMEO: But soft, what light", "ROMEO: But soft, what"]
    got = {b: [o.token_ids for o in LLM(folder, backend=b, **option).generate(prompts, params)]
           for b in ("torch", "numba")}
    assert got["numba"] == got["torch"]


def test_what_a_backend_or_option_cannot_run_is_refused_with_the_family(built):
    from minillm.backends.capabilities import check_model
    from minillm.parallel.tensor import check_tensor_parallel
    ours = load_hf(built["qwen3"][0])
    with pytest.raises(ValueError, match=r"backend='cuda' does not run a model of family \(model_type\)='qwen3' "
                                         r"yet; backends that do: torch, numba"):
        check_model(ours, "cuda")
    with pytest.raises(ValueError, match="tensor_parallel_size=2 splits Llama blocks; this model is 'qwen3'"):
        check_tensor_parallel(ours.config, 2)
    check_model(load_hf(built["llama3"][0]), "cuda")        # Llama 3's RoPE is in the tables the kernels read


@pytest.mark.parametrize("family", ["qwen2", "llama3", "tinyllama"])
def test_structured_output_on_byte_level_and_sentencepiece_vocabularies(built, family):
    """guided_regex and guided_json on tokenizer.json vocabularies: every output matches (sampled at T = 1, so
    the mask, not the model, is what keeps it valid)."""
    import re
    folder, _ = built[family]
    llm = LLM(folder)
    pattern = r"[a-z]+ (is|was) [0-9]{2}\."
    outs = llm.generate(["ROMEO:", "JULIET:", "Now is"],
                        SamplingParams(temperature=1.0, max_tokens=48, seed=1, guided_regex=pattern))
    for o in outs:      # a match that uses the last token allowed ends with "length", complete (length-aware mask)
        assert re.fullmatch(pattern, o.outputs[0].text), o.outputs[0].text
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    for seed in range(3):
        text = llm.generate("ROMEO:", SamplingParams(temperature=1.0, max_tokens=64, seed=seed,
                                                     guided_json=schema))[0].outputs[0].text
        value = json.loads(text)
        assert set(value) == {"name", "age"} and isinstance(value["age"], int) and len(value["name"]) <= 8


@pytest.mark.parametrize("family", ["qwen2", "tinyllama"])
def test_jump_forward_spells_the_forced_text_on_byte_level_and_sentencepiece_vocabularies(built, family):
    """The tokens jump-forward appends spell exactly the bytes the pattern forces: a SentencePiece-style tokenizer
    puts a "\u2581" space before a text's first word, which the pattern refuses (its jump would stop at once)."""
    from minillm.guided.token_index import vocab_of
    folder, _ = built[family]
    llm = LLM(folder)
    vocab = vocab_of(llm.tokenizer)
    for data in (b'{"name":"', b'","age":', b"is"):
        ids = vocab.encode_bytes(data)
        assert b"".join(vocab.bytes[i] for i in ids) == data, (family, data, ids)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=64, guided_json=schema))
    proc = next(iter(vocab.indexes.values()))       # the schema's compiled index: forced tokens were found
    assert any(len(f) > 2 for f in proc._forced.values()), family


def test_streamed_text_only_grows_while_a_character_s_bytes_arrive(built):
    """Byte-level BPE splits "é" (c3 a9) into two tokens when no merged token has it: after the first the text
    must not show a replacement character that the second would then take back."""
    folder, _ = built["qwen2"]
    llm = LLM(folder)
    engine = llm.engine
    engine.add_request("ROMEO:", SamplingParams(temperature=0, max_tokens=12, guided_regex="(é|ö){4}"))
    texts = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts.append(out.outputs[0].text)
    assert all("\ufffd" not in t for t in texts)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))          # each step's text extends the last
    assert len(texts[-1]) == 4 and set(texts[-1]) <= {"é", "ö"}


def test_a_model_too_large_for_memory_is_refused_before_any_tensor_is_read(built):
    from minillm.formats.hf import check_fits
    cfg = read_config(built["qwen2"][0])
    check_fits(cfg, "qwen2", free=10 ** 9)
    with pytest.raises(MemoryError, match=r"take 0.0 GiB in float32, and this machine has 0.0 GiB free; nothing "
                                          r"was loaded"):
        check_fits(cfg, "qwen2", free=1000)


def test_a_kv_pool_too_large_for_memory_is_refused_before_it_is_allocated(built, monkeypatch):
    """The pool for max_model_len sequences is checked against the free memory before allocating it; the
    message names the options that shrink it, and a smaller max_model_len then fits."""
    import minillm.engine.parts as parts
    import minillm.formats.hf as hf
    from minillm import EngineConfig
    from minillm.llama.kv_cache import KVCache
    folder, _ = built["llama3"]
    free = KVCache.engine_bytes(read_config(folder), EngineConfig(max_model_len=64, max_num_seqs=1))
    monkeypatch.setattr(parts, "check_pool_fits", lambda n, config: hf.check_pool_fits(n, config, free=free))
    with pytest.raises(MemoryError, match=r"the KV pool needs .* GiB \(max_model_len=128, max_num_seqs=1, "
                                          r"kv_cache_bytes=None\) and this machine has .* free: lower max_model_len"):
        LLM(folder, max_model_len=128, max_num_seqs=1, backend="torch")
    assert LLM(folder, max_model_len=64, max_num_seqs=1, backend="torch").generate("ROMEO:", SamplingParams(
        max_tokens=2))[0].outputs[0].token_ids


@pytest.mark.parametrize("family", ["llama3", "qwen2"])
def test_chat_prompt_ids_equal_transformers_apply_chat_template(built, family):
    """The server's chat prompt (the model's own template, rendered as transformers renders it, BOS once) has the
    ids transformers' apply_chat_template gives."""
    from transformers import AutoTokenizer

    from minillm.serve.app import chat_text
    folder, _ = built[family]
    tok = HFTokenizer(folder)
    messages = [{"role": "system", "content": "Speak as a player."}, {"role": "user", "content": "Who art thou?"}]
    text = chat_text(messages, tok.chat_template, tok)
    want = AutoTokenizer.from_pretrained(folder).apply_chat_template(messages, add_generation_prompt=True,
                                                                     tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert tok.encode(text) == list(want)


def test_draft_model_speculation_and_preemption_on_a_qwen3_pair(built, tmp_path):
    """A smaller Qwen3 shape with the same tokenizer drafts for the other: greedy speculative output equals plain
    decoding; a KV pool too small for the batch preempts (recompute and swap) and still gives the same tokens."""
    folder, _ = built["qwen3"]
    families.build("qwen3", tmp_path, seed=3, num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["ROMEO: But soft", "JULIET: O Romeo", "Now is the winter", "To be, or not"]
    plain = [o.token_ids for o in LLM(folder).generate(prompts, params)]
    spec = LLM(folder, speculative={"method": "draft", "gamma": 3, "model": str(tmp_path)})
    assert [o.token_ids for o in spec.generate(prompts, params)] == plain
    assert spec.engine.spec_stats["drafted"] > 0
    per_block = 4 * read_config(folder).kv_bytes_per_token(4)            # block_size 4, float32
    for mode in ("recompute", "swap"):                                    # 48 tokens of KV for 4 x ~32
        small = LLM(folder, block_size=4, max_model_len=48, kv_cache_bytes=12 * per_block, preemption_mode=mode,
                    swap_bytes=12 * per_block if mode == "swap" else 0)
        outs = small.generate(prompts, params)
        assert sum(o.metrics.num_preemptions for o in outs) > 0
        assert [o.token_ids for o in outs] == plain


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_peft_lora_made_by_peft_itself_serves_as_peft_computes(built, family, tmp_path):
    """An adapter written by the `peft` library on the family's transformers model (q, k, v, o, MLP, these module
    names): loaded into minillm's LoRA slots, its logits are peft's (the biases and q/k norms beside them)."""
    import copy

    from peft import LoraConfig, get_peft_model

    from minillm.formats.peft import load_adapter
    from minillm.lora.adapters import attach_lora, load_slot
    folder, hf = built[family]
    torch.manual_seed(2)
    peft_model = get_peft_model(copy.deepcopy(hf), LoraConfig(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], lora_dropout=0.0))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)                           # peft starts B at zero: make the adapter do something
    peft_model.save_pretrained(tmp_path / "adapter")
    x = tokens(24)
    with torch.no_grad():
        theirs = peft_model.eval()(x).logits
        base = peft_model.get_base_model()
    ours = load_hf(folder)
    adapter = load_adapter(str(tmp_path / "adapter"), ours.config)
    lm = attach_lora(ours, 2, 4)
    load_slot(lm, 1, adapter)
    with torch.no_grad():
        with lm.lora_context.use([1, 1], x.shape[1]):
            got = lm(x)
        with peft_model.disable_adapter():
            assert (base(x).logits - theirs).abs().max() > 1e-2         # the adapter changes the logits
    assert_close(got, theirs, atol=1e-4, rtol=1e-4, name=f"{family} + PEFT LoRA: minillm slots vs peft")


def test_a_model_vocabulary_padded_past_the_tokenizer_s_and_every_stop_id_under_guidance(tmp_path):
    """Qwen2.5 pads its 151,665 tokenizer ids to 151,936 rows: guided masks span the model's rows (the padding
    is never text). A stop id other than eos (Qwen's <|im_end|> here, eos being <|endoftext|>) ends a guided
    output where the pattern is complete, as it ends a free one."""
    import re
    families.build("qwen2", tmp_path, vocab_size=families.VOCAB + 16, eos_token_id=0)   # eos <|endoftext|>
    json.dump({"eos_token_id": [0, families.STYLE["qwen2"][1].index("<|im_end|>")]},
              open(tmp_path / "generation_config.json", "w"))
    llm = LLM(str(tmp_path))
    assert llm.tokenizer.vocab_size == families.VOCAB + 16
    outs = llm.generate(["ROMEO:", "JULIET:"], SamplingParams(temperature=1.0, max_tokens=40, seed=0,
                                                               guided_regex=r"[a-z]+ (is|was) [0-9]{2}\."))
    for o in outs:
        assert re.fullmatch(r"[a-z]+ (is|was) [0-9]{2}\.", o.outputs[0].text)
        assert all(t < families.VOCAB for t in o.token_ids)
    from minillm.guided.processor import attach
    params = attach(SamplingParams(max_tokens=40, guided_regex="ab"), llm.tokenizer, [5], 256)
    assert params.logits_processors[-1].stop_ids == [families.STYLE["qwen2"][1].index("<|im_end|>")]


def test_a_finished_text_keeps_a_character_it_never_completed(built):
    """Held back only while the sequence runs: at max_tokens the half character is in the text, as decode has it."""
    from minillm.core.detokenizer import Detokenizer
    from minillm.core.sequence import Sequence
    tok = HFTokenizer(built["qwen2"][0])
    half, rest = tok.encode("é", bos=False)                          # two byte tokens, c3 and a9
    seen = []
    for max_tokens in (2, 1):
        seq = Sequence(0, "r", 0, tok.encode("ROMEO:"), SamplingParams(max_tokens=max_tokens), 0, 0.0)
        detok = Detokenizer(tok, 256)
        seq.output_ids.append(half)
        done = detok.check(seq)
        seen.append((done, seq.text))
    assert seen == [(False, ""), (True, "\ufffd")]                   # running: held back; finished: kept


def test_a_llama2c_file_refuses_what_it_cannot_hold(built, tmp_path):
    from minillm.formats.llama2c import save_bin
    from minillm.formats.runq import save_runq
    for family in ("qwen2", "qwen3", "llama3"):
        model = load_hf(built[family][0])
        with pytest.raises(ValueError, match="holds a Llama 2 block; this model is"):
            save_bin(model, tmp_path / "m.bin")
        with pytest.raises(ValueError, match="a runq.c file holds a Llama 2 block"):
            save_runq(model, tmp_path / "q.bin")
    with pytest.raises(ValueError, match="rope_scaling=.*rope_type must be one of linear, llama3"):
        read_config(built["llama3"][0]).__class__(rope_scaling={"rope_type": "yarn", "factor": 2.0})
