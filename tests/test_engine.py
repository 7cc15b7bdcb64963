"""The engine end to end: equalities (batched == sequential, paged == contiguous, preempted == not),
sampling semantics, stop conditions, and bad input that leaves everything else running."""
import pytest
import torch

from minillm import LLM, SamplingParams

PROMPTS = ["To be, or not to be", "Hamlet", "Who's there?", "O, what a rogue and peasant slave am I!"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tiny64):
    return tiny64


def make(tiny, **kw):
    model, tok = tiny
    return LLM(model, tokenizer=tok, dtype="float64", **kw)


def manual_greedy(model, ids, n):
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids


def test_generate_equals_plain_greedy_loop(tiny):
    """float64, so the cached engine and the cache-free loop agree exactly on argmax."""
    model, tok = tiny
    out = make(tiny).generate(PROMPTS[0], GREEDY)[0]
    assert out.prompt_token_ids + out.token_ids == manual_greedy(model, tok.encode(PROMPTS[0]), 24)
    assert len(out.token_ids) == 24 and out.outputs[0].finish_reason == "length"


MODES = [dict(), dict(batching="static"), dict(batching="dynamic"),
         dict(enable_chunked_prefill=True, max_num_batched_tokens=7), dict(max_num_seqs=2)]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: ",".join(f"{k}={v}" for k, v in m.items()) or "continuous")
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_batched_equals_sequential_and_block_size_free(tiny, block_size, mode):
    llm = make(tiny, block_size=block_size, **mode)
    together = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    alone = [make(tiny).generate(p, GREEDY)[0].token_ids for p in PROMPTS]
    assert together == alone
    assert llm.engine.block_manager.num_free == llm.engine.block_manager.num_blocks  # nothing leaked


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_recomputes_or_swaps_to_the_same_tokens(tiny, mode):
    """A pool of 96 tokens for 4 sequences that grow to ~40 each forces preemptions."""
    model, _ = tiny
    per_block = 8 * model.config.kv_bytes_per_token(8)
    small = make(tiny, block_size=8, max_model_len=64, kv_cache_bytes=12 * per_block, preemption_mode=mode,
                 swap_bytes=12 * per_block if mode == "swap" else 0)
    outs = small.generate(PROMPTS, GREEDY)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in make(tiny).generate(PROMPTS, GREEDY)]
    bm = small.engine.block_manager
    assert bm.num_free == bm.num_blocks and len(bm.swap_free) == bm.swap_blocks
    if mode == "swap":
        assert bm.swap_blocks == 12


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny):
    sp = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=123, max_tokens=20, ignore_eos=True)
    alone = make(tiny).generate(PROMPTS[1], sp)[0].token_ids
    mixed = make(tiny).generate(PROMPTS, [GREEDY, sp, GREEDY, sp])
    assert mixed[1].token_ids == alone
    other = make(tiny).generate(PROMPTS[1], SamplingParams(temperature=1.0, seed=124, max_tokens=20, ignore_eos=True))
    assert other[0].token_ids != alone


def test_n_samples_differ_and_share_the_prompt(tiny):
    out = make(tiny).generate(PROMPTS[0],
                              SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True))[0]
    assert len(out.outputs) == 3 and [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3


def test_top_k_one_is_greedy(tiny):
    a = make(tiny).generate(PROMPTS[2],
                            SamplingParams(temperature=0.7, top_k=1, seed=1, max_tokens=16, ignore_eos=True))
    b = make(tiny).generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert a[0].token_ids == b[0].token_ids


def test_stop_string_truncates_text(tiny):
    llm = make(tiny)
    full = llm.generate(PROMPTS[0], GREEDY)[0].text
    stop = full[5:8]
    assert stop and full.find(stop) >= 0
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, stop=[stop], ignore_eos=True))[0]
    assert out.text == full[:full.find(stop)]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop


def test_stop_token_ids_and_eos(tiny):
    llm = make(tiny)
    ids = llm.generate(PROMPTS[0], GREEDY)[0].token_ids
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[ids[3]]))[0]
    assert out.token_ids == ids[:ids.index(ids[3]) + 1] and out.outputs[0].stop_reason == ids[3]


def test_bos_ends_a_llama2c_text_unless_ignore_eos(tiny):
    """run.c stops at BOS, and so does the engine: a model that always prefers BOS stops at once."""
    from minillm.llama.transformer import Transformer

    class LovesBOS(Transformer):
        def forward(self, *args, **kw):
            logits = super().forward(*args, **kw)
            logits[..., 1] += 1e3
            return logits

    model, tok = tiny
    biased = LovesBOS(model.config).double()
    biased.load_state_dict(model.state_dict())
    llm = LLM(biased.eval(), tokenizer=tok, dtype="float64")
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=8))[0]
    assert out.token_ids == [1] and out.text == "" and out.outputs[0].finish_reason == "stop"
    forced = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert forced.token_ids == [1] * 8 and forced.outputs[0].finish_reason == "length"


def test_max_tokens_and_ignore_eos_give_exact_lengths(tiny):
    outs = make(tiny).generate(PROMPTS, SamplingParams(temperature=1.0, seed=0, max_tokens=17, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [17] * 4


def test_max_model_len_caps_generation(tiny):
    out = make(tiny, max_model_len=16).generate(PROMPTS[0],
                                                SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert len(out.prompt_token_ids) + len(out.token_ids) == 16 and out.outputs[0].finish_reason == "length"


def test_trace_records_prefill_then_decodes(tiny):
    llm = make(tiny)
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    steps = llm.engine.trace.steps
    assert (steps[0].kind == "prefill"
            and steps[0].num_prefill_tokens == sum(len(tiny[1].encode(p)) for p in PROMPTS[:2]))
    assert [s.kind for s in steps[1:]] == ["decode"] * 4 and all(s.num_decode_tokens == 2 for s in steps[1:])
    assert all(s.kv_bytes_filled <= s.kv_bytes_used for s in steps)


# ---------------------------------------------------------------- found in review
@pytest.mark.parametrize("kw,match", [(dict(stop=[5]), "stop must be non-empty strings"),
                                      (dict(stop_token_ids=["x"]), "stop_token_ids"), (dict(seed=-1), "seed"),
                                      (dict(block_size=16.5), None)])
def test_bad_values_are_caught_before_the_engine(tiny, kw, match):
    if match:
        with pytest.raises(ValueError, match=match):
            SamplingParams(**kw)
    else:
        with pytest.raises(ValueError, match="EngineConfig.block_size must be a positive integer"):
            make(tiny, **kw)


def test_tiny_temperature_is_greedy(tiny):
    a = make(tiny).generate(PROMPTS[0], SamplingParams(temperature=1e-40, max_tokens=8, ignore_eos=True))
    b = make(tiny).generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert a[0].token_ids == b[0].token_ids


def test_a_bad_prompt_anywhere_queues_nothing(tiny):
    llm = make(tiny)
    for bad in ([1, 5, 99999], [], "word " * 400):
        with pytest.raises(ValueError):
            llm.generate([PROMPTS[0], bad], GREEDY)
        assert not llm.engine.has_unfinished_requests()
    assert llm.generate(PROMPTS[1], GREEDY)[0].token_ids == make(tiny).generate(PROMPTS[1], GREEDY)[0].token_ids


def test_stop_and_special_tokens_never_reach_the_text(tiny):
    model, tok = tiny
    llm = make(tiny)
    ids = llm.generate(PROMPTS[0], GREEDY)[0].token_ids
    out = llm.generate(PROMPTS[0],
                       SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[ids[3]], ignore_eos=True))[0]
    assert out.text == tok.decode(out.token_ids[:-1], prev_token=out.prompt_token_ids[-1])
    assert "<s>" not in tok.decode([5, 1, 6, 2, 7], prev_token=4)  # BOS/EOS mid-text are not text


def test_default_pool_is_capped_and_a_too_small_one_names_the_bytes(tiny):
    from minillm.config import EngineConfig, ModelConfig
    from minillm.engine.engine import LLMEngine
    from minillm.formats.loader import sample_tokenizer
    from minillm.llama.kv_cache import DEFAULT_KV_CAP
    from minillm.llama.transformer import Transformer
    big = Transformer(ModelConfig.from_name("stories110M", vocab_size=300, n_layers=1))
    # 512 x 1024 tokens would be 1.5 GB
    e = LLMEngine.from_model(big, sample_tokenizer(300), EngineConfig(max_num_seqs=512))
    assert e.kv.nbytes <= DEFAULT_KV_CAP
    with pytest.raises(ValueError, match=r"the KV cache gets 1,000 bytes but one sequence of max_model_len=256 needs"):
        make(tiny, kv_cache_bytes=1000)


def test_hf_style_decoding_keeps_the_leading_space():
    """SentencePiece decoders strip a leading space at the start of a text; generated text is not a start."""
    from minillm.core.detokenizer import Detokenizer
    from minillm.core.sequence import Sequence

    class StripTok:  # decodes each id as " w<id>", then strips one leading space, as Llama's tokenizer.json does
        stop_ids = {2}

        def decode(self, ids):
            return "".join(f" w{i}" for i in ids)[1:]

    seq = Sequence(0, "r", 0, [1, 7], SamplingParams(), 0, 0.0)
    seq.output_ids = [8, 9]
    assert Detokenizer(StripTok(), 64).append_text(seq) == " w8 w9"


def test_llm_does_not_convert_the_callers_model(tiny):
    model, tok = tiny
    assert next(model.parameters()).dtype == torch.float64
    LLM(model, tokenizer=tok, dtype="float32")
    assert next(model.parameters()).dtype == torch.float64


def test_missing_model_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        LLM(str(tmp_path / "nope.bin"))


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_prefix_cache_hits_do_not_change_outputs(tiny, block_size):
    """float64, so reusing K/V computed in another batch is exactly what recomputing would give."""
    model, tok = tiny
    shared = "ACT I. Scene I. Elsinore. A platform before the Castle. Enter Bernardo and Francisco."
    prompts = [shared + " Who's there?", shared + " Nay, answer me", shared + " Long live the king!"]
    plain = [o.token_ids for o in make(tiny, block_size=block_size).generate(prompts, GREEDY)]
    llm = make(tiny, block_size=block_size, enable_prefix_caching=True)
    first = llm.generate(prompts[:1], GREEDY)             # fills the cache
    rest = llm.generate(prompts[1:], GREEDY)              # reuses the shared prefix
    assert [o.token_ids for o in first + rest] == plain
    n_shared = len(tok.encode(shared)) - 1                # the last shared token may merge with what follows
    hits = [o.metrics.num_cached_tokens for o in rest]
    assert all(h >= (n_shared // block_size - 1) * block_size and h % block_size == 0 for h in hits), hits
    again = llm.generate(prompts[:1], GREEDY)[0]          # all of it cached but the last token
    assert again.token_ids == plain[0] and again.metrics.num_cached_tokens >= len(again.prompt_token_ids) - block_size
    bm = llm.engine.block_manager
    assert bm.num_free == bm.num_blocks and bm.num_cached > 0  # nothing held, the prefixes kept


def test_n_samples_share_prompt_blocks_copy_on_write_and_equal_separate_requests(tiny):
    """n = 3 with seed s gives the samples that three n = 1 requests with seeds s, s+1, s+2 give (float64),
    while the prompt's full blocks are held once, not three times."""

    def sp(n, seed):
        return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=10, ignore_eos=True)
    prompt = PROMPTS[3]
    llm = make(tiny, block_size=4)
    engine = llm.engine
    rid = engine.add_request(prompt, sp(3, 40))
    engine.step()                                            # the prefill, then the fork
    seqs = engine.requests[rid].seqs
    n_prompt = len(seqs[0].prompt_ids)
    full = n_prompt // 4
    assert n_prompt % 4, "the prompt must end inside a block, so that block is shared and then copied"
    assert all(s.block_table == seqs[0].block_table for s in seqs)  # all shared until the first write
    assert all(s.block_table[:full] == seqs[0].block_table[:full] for s in seqs)
    assert all(engine.block_manager.ref_count[b] == 3 for b in seqs[0].block_table[:full])
    while engine.has_unfinished_requests():
        engine.step()
    out = engine.pop_finished()[0]
    alone = [make(tiny).generate(prompt, sp(1, 40 + i))[0].token_ids for i in range(3)]
    assert [c.token_ids for c in out.outputs] == alone
    assert engine.block_manager.num_free == engine.block_manager.num_blocks


def test_abort_before_the_fork(tiny):
    engine = make(tiny).engine
    rid = engine.add_request(PROMPTS[0], SamplingParams(n=3, max_tokens=5))
    engine.abort(rid)
    assert not engine.has_unfinished_requests()
    out = engine.pop_finished()[0]
    assert [c.finish_reason for c in out.outputs] == ["abort"] * 3


def test_static_batching_admits_only_into_an_empty_batch_and_pads(tiny):
    llm = make(tiny, batching="static", max_num_seqs=2)
    sps = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (2, 6, 3)]
    outs = llm.generate(PROMPTS[:3], sps)
    assert [len(o.token_ids) for o in outs] == [2, 6, 3]
    steps = llm.engine.trace.steps
    kinds = [s.kind for s in steps]
    # batch 1 (two requests): prefill + 5 decodes (the short one pads after its 2nd token); batch 2: prefill + 2
    assert kinds == ["prefill"] + ["decode"] * 5 + ["prefill"] + ["decode"] * 2
    assert [s.num_padding for s in steps[1:6]] == [0, 1, 1, 1, 1]
    assert steps[6].seq_ids == [2]  # the third request waited for the whole first batch
    assert llm.engine.block_manager.num_free == llm.engine.block_manager.num_blocks


def test_dynamic_batching_waits_for_the_window_or_a_full_batch(tiny):
    model, tok = tiny
    from minillm.config import EngineConfig
    from minillm.engine.engine import LLMEngine
    now = [0.0]
    engine = LLMEngine.from_model(model, tok,
                                  EngineConfig(batching="dynamic", batch_window_s=1.0, max_num_seqs=3, dtype="float64"),
                                  clock=lambda: now[0])
    engine.add_request(PROMPTS[0], GREEDY)
    assert engine.step() == [] and not engine.trace.steps     # window open, batch not full: wait
    now[0] = 0.5
    engine.add_request(PROMPTS[1], GREEDY)
    assert engine.step() == []
    now[0] = 1.0                                              # the oldest has waited the window
    engine.step()
    assert engine.trace.steps[-1].kind == "prefill" and len(engine.trace.steps[-1].seq_ids) == 2
    for p in PROMPTS[:3]:
        engine.add_request(p, GREEDY)                         # three wait: a full batch forms at once...
    while engine.trace.steps[-1].kind != "prefill" or len(engine.trace.steps[-1].seq_ids) != 3:
        engine.step()                                         # ...as soon as the running batch ends
    assert engine.trace.steps[-1].start == now[0]


def test_chunked_prefill_keeps_decodes_going_within_the_budget(tiny):
    llm = make(tiny, enable_chunked_prefill=True, max_num_batched_tokens=8)
    engine = llm.engine
    engine.add_request(PROMPTS[1], GREEDY)                   # short: prefilled in one step
    engine.step()
    engine.add_request("word " * 30, GREEDY)                  # long: arrives while the first decodes
    for _ in range(3):
        engine.step()
    for s in engine.trace.steps[1:]:
        assert s.num_prefill_tokens + s.num_decode_tokens <= 8
        assert s.num_decode_tokens == 1                       # the first request decoded every step
    assert all(s.kind == "mixed" for s in engine.trace.steps)


@pytest.mark.parametrize("max_tokens", [23, 40])
def test_n_samples_bigger_than_the_pool_together_are_served_by_preemption(tiny, max_tokens):
    """The hostile-user case: 5 blocks of 16, n = 2, a 10-token prompt, max_tokens 23 (the old check counted
    3 blocks a sample, 6 > 5, and refused it), and max_tokens 40, where the two samples (4 blocks each) do not
    fit together and one waits (preemption). Each sample equals the same seed run alone (float64)."""
    model, tok = tiny
    per_block = 16 * model.config.kv_bytes_per_token(8)
    llm = make(tiny, block_size=16, max_model_len=64, kv_cache_bytes=5 * per_block)
    prompt = tok.encode(PROMPTS[3])[:10]

    def sp(n, seed):
        return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True)
    engine = llm.engine
    rid = engine.add_request(prompt, sp(2, 11))
    while engine.has_unfinished_requests():
        engine.step()
    preempted = sum(s.metrics.num_preemptions for s in engine.requests[rid].seqs)
    assert (preempted > 0) == (max_tokens == 40)                                      # 2 x 4 blocks > 5
    out = engine.pop_finished()[0]
    assert [len(c.token_ids) for c in out.outputs] == [max_tokens] * 2
    alone = [make(tiny).generate([prompt], sp(1, 11 + i))[0].token_ids for i in range(2)]
    assert [c.token_ids for c in out.outputs] == alone
    steps = llm.engine.trace.steps
    assert max(s.blocks_used for s in steps) <= 5
    assert llm.engine.block_manager.num_free == llm.engine.block_manager.num_blocks


def test_trace_off_records_nothing_and_changes_nothing(tiny):
    on, off = make(tiny), make(tiny, trace=False)
    assert [o.token_ids for o in off.generate(PROMPTS, GREEDY)] == [o.token_ids for o in on.generate(PROMPTS, GREEDY)]
    assert off.engine.trace.steps == [] and len(on.engine.trace.steps) > 0
