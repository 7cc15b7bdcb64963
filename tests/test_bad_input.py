"""A user's mistake ends in a clear error that names the value, and the engine keeps serving the others; and
the engine's own limits (trace size, RoPE tables, batching windows) do not depend on the user behaving."""
import time

import numpy as np
import pytest
import torch
from test_engine import make

from minillm import LLM, SamplingParams
from minillm.config import ModelConfig
from minillm.llama.transformer import ROPE_ROWS, Transformer

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("random:tiny")


PROMPTS = ["To be, or not to be", "Hamlet", "Who's there?", "O, what a rogue and peasant slave am I!"]


def test_bytes_prompts_are_refused_not_read_as_token_ids(llm):
    with pytest.raises(ValueError, match=r"prompt is bytes: pass text"):
        llm.generate(b"Hamlet", GREEDY)
    with pytest.raises(ValueError, match=r"prompt is bytes"):
        llm.generate(["Hamlet", b"Ophelia"], GREEDY)
    assert not llm.engine.has_unfinished_requests()


def test_text_after_a_nul_is_text_not_a_silent_end(llm):
    tok = llm.tokenizer
    out = llm.generate("Hamlet\0 and Ophelia", GREEDY)[0]
    assert len(out.prompt_token_ids) > len(tok.encode("Hamlet")) + 3
    assert out.prompt_token_ids == tok.encode("Hamlet\0 and Ophelia")


@pytest.mark.parametrize("ids", [np.array([1, 5, 6], dtype=np.int64), torch.tensor([1, 5, 6]),
                                 [np.int64(1), np.int32(5), 6], (1, 5, 6)],
                         ids=["numpy", "torch", "numpy-ints", "tuple"])
def test_integer_ids_from_numpy_and_torch_are_taken(llm, ids):
    assert llm.generate([ids], GREEDY)[0].prompt_token_ids == [1, 5, 6]


@pytest.mark.parametrize("ids,match", [([1, 5.0], r"integers in \[0, 512\), got \[5.0\]"),
                                       ([1, True], r"integers in \[0, 512\), got \[True\]"),
                                       (torch.tensor([1.0, 2.0]), r"integers in \[0, 512\)"),
                                       ([1, 512], r"got \[512\]"), ({"ids": [1]}, "prompt must be text or a list")])
def test_bad_token_ids_name_what_is_wrong(llm, ids, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([ids], GREEDY)


@pytest.mark.parametrize("params,match", [({"temperature": 0}, "params must be a SamplingParams, got dict"),
                                          ("greedy", "params must be a SamplingParams, got str")])
def test_params_of_the_wrong_type_are_named(llm, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate("Hamlet", params)
    assert llm.generate("Hamlet", GREEDY)[0].token_ids


def test_the_trace_is_bounded():
    llm = LLM("random:tiny")
    llm.engine.trace.max_steps = 50
    llm.generate(["Hamlet"] * 3, SamplingParams(temperature=0, max_tokens=120, ignore_eos=True))
    trace = llm.engine.trace
    assert len(trace.steps) <= 50 and trace.dropped > 0 and trace.count == len(trace.steps) + trace.dropped
    assert [s.step for s in trace.steps] == list(range(trace.dropped, trace.count))   # the newest steps, in order


def test_dynamic_batching_does_not_wait_out_its_window_when_every_request_is_known():
    """A one-hour window: generate() knows all its requests, so the batch forms at once."""
    llm = LLM("random:tiny", batching="dynamic", batch_window_s=3600.0, max_num_seqs=8)
    t0 = time.perf_counter()
    outs = llm.generate(["Hamlet", "Ophelia", "Horatio"], GREEDY)
    assert [len(o.token_ids) for o in outs] == [6, 6, 6] and time.perf_counter() - t0 < 600
    assert llm.engine.trace.steps[0].kind == "prefill" and len(llm.engine.trace.steps[0].seq_ids) == 3
    rid = llm.engine.add_request("Hamlet", GREEDY)            # step() by hand still honours the window
    assert llm.engine.step() == [] and llm.engine.has_unfinished_requests()
    llm.engine.abort(rid)
    with pytest.raises(ValueError, match=r"EngineConfig.batch_window_s must be a finite number"):
        LLM("random:tiny", batching="dynamic", batch_window_s=float("inf"))


def test_aborting_a_parallel_sampling_request_before_its_prefill_leaves_nothing_behind():
    engine = LLM("random:tiny").engine
    rid = engine.add_request("Hamlet", SamplingParams(n=3, max_tokens=5))
    engine.abort(rid)
    assert not engine.scheduler.pending_forks and not engine.has_unfinished_requests()
    assert [c.finish_reason for c in engine.pop_finished()[0].outputs] == ["abort"] * 3


def test_a_huge_claimed_context_builds_rope_tables_only_for_what_is_used():
    """A header may claim a context of 10^7 (full tables: 10^7 x D/2 x 2 float64 = 2.6 GB for D = 16): the model
    builds ROPE_ROWS rows, grows them to what a forward or max_model_len needs, and each row is the same as in a
    full table."""
    cfg = ModelConfig(dim=32, hidden_dim=32, n_layers=1, n_heads=2, vocab_size=300, max_seq_len=10**7)
    model = Transformer(cfg)
    assert model.rope_cos.shape[0] == ROPE_ROWS
    small = Transformer(ModelConfig(dim=32, hidden_dim=32, n_layers=1, n_heads=2, vocab_size=300, max_seq_len=5000))
    model.load_state_dict(small.state_dict())
    x = torch.tensor([[1, 2, 3]])
    pos = torch.tensor([[4000, 4001, 4002]])
    assert torch.equal(model(x, pos), small(x, pos)) and model.rope_cos.shape[0] == 4096
    full = Transformer(ModelConfig(dim=32, hidden_dim=32, n_layers=1, n_heads=2, vocab_size=300, max_seq_len=8192))
    full.ensure_rope(8192)
    assert torch.equal(model.rope_cos, full.rope_cos[:4096]) and torch.equal(model.rope_sin, full.rope_sin[:4096])


LONG = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("field,kw", [("temperature", dict(temperature=-0.1)), ("top_p", dict(top_p=0.0)),
                                      ("top_p", dict(top_p=1.5)), ("top_k", dict(top_k=-1)),
                                      ("max_tokens", dict(max_tokens=0)), ("n", dict(n=0))])
def test_bad_sampling_params_name_the_field(field, kw):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kw)


def test_prompt_too_long_names_both_lengths_and_keeps_others_running(tiny64):
    llm = make(tiny64, max_model_len=32)
    engine = llm.engine
    rid = engine.add_request(PROMPTS[0], LONG)
    engine.step()
    long = "word " * 40
    n = len(tiny64[1].encode(long))
    with pytest.raises(ValueError, match=rf"prompt has {n} tokens but max_model_len is 32"):
        engine.add_request(long, LONG)
    with pytest.raises(ValueError, match="max_model_len is 32"):
        llm.generate([PROMPTS[1], long], LONG)
    while engine.has_unfinished_requests():
        engine.step()
    done = {o.request_id: o for o in engine.pop_finished()}
    assert len(done[rid].prompt_token_ids) + len(done[rid].token_ids) == 32  # ran to max_model_len, untouched
    assert engine.block_manager.num_free == engine.block_manager.num_blocks


def test_abort_frees_blocks_and_others_finish(tiny64):
    engine = make(tiny64).engine
    a = engine.add_request(PROMPTS[0], LONG)
    b = engine.add_request(PROMPTS[1], LONG)
    engine.step(), engine.step()
    engine.abort(a)
    while engine.has_unfinished_requests():
        engine.step()
    done = {o.request_id: o for o in engine.pop_finished()}
    assert done[a].outputs[0].finish_reason == "abort" and len(done[b].token_ids) == 24
    assert engine.block_manager.num_free == engine.block_manager.num_blocks
    with pytest.raises(ValueError, match="abort: no request with id 'nope'"):
        engine.abort("nope")


def test_unknown_model_lists_available():
    with pytest.raises(ValueError, match=r"unknown model 'nope'.*Available: .*random:tiny"):
        LLM("nope")


def test_missing_tokenizer_says_where_it_looked(tmp_path, data_dir):
    import shutil
    shutil.copy(f"{data_dir}/golden.bin", tmp_path / "m.bin")
    with pytest.raises(FileNotFoundError, match=f"looked for {tmp_path}/tokenizer.bin"):
        LLM(str(tmp_path / "m.bin"))
    llm = LLM(str(tmp_path / "m.bin"), tokenizer=f"{data_dir}/golden_tok.bin")
    assert llm.generate("Hamlet", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0].token_ids


def test_unknown_option_and_bad_engine_values(tiny64):
    with pytest.raises(TypeError, match="unknown LLM option"):
        LLM("random:tiny", block_sise=16)
    with pytest.raises(ValueError, match="batching='sometimes'"):
        LLM("random:tiny", batching="sometimes")
    with pytest.raises(ValueError, match="max_model_len=999 exceeds the model's context max_seq_len=256"):
        LLM("random:tiny", max_model_len=999)
