"""Options are checked where they are written down: SamplingParams and EngineConfig refuse a value of the
wrong type, an impossible number, or two options that contradict each other, with a ValueError that names
the field and the value (DESIGN.md "Naming and style" rule 12), before any engine is built."""
import math
import os
import re

import numpy as np
import pytest
import torch

from minillm.config import EngineConfig
from minillm.core.sampling import SamplingParams


# ---------------------------------------------------------------- SamplingParams: types
@pytest.mark.parametrize("field,value", [
    ("n", True), ("n", 2.0), ("n", "2"),
    ("top_k", True), ("top_k", 3.0), ("top_k", None),
    ("max_tokens", True), ("max_tokens", 8.0), ("max_tokens", None),
    ("seed", True), ("seed", False), ("seed", 1.0), ("seed", "7"),
    ("temperature", "0.5"), ("temperature", None), ("temperature", True), ("temperature", float("nan")),
    ("temperature", float("inf")), ("temperature", -1e-3), ("temperature", [1.0]),
    ("top_p", "0.9"), ("top_p", None), ("top_p", True), ("top_p", float("nan")), ("top_p", float("inf")),
    ("top_p", 0), ("top_p", 1.0001),
    ("stop", 5), ("stop", [5]), ("stop", [""]), ("stop", ""), ("stop", {"a"}), ("stop", b"x"), ("stop", ["a", None]),
    ("stop_token_ids", 5), ("stop_token_ids", [True]), ("stop_token_ids", [-1]), ("stop_token_ids", [1.0]),
    ("stop_token_ids", "12"), ("stop_token_ids", {1, 2}),
    ("ignore_eos", 1), ("ignore_eos", "false"), ("ignore_eos", None),
    ("logits_processors", len), ("logits_processors", [1]), ("logits_processors", "fn"), ("logits_processors", [None]),
])
def test_sampling_params_refuse_wrong_types_naming_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"^SamplingParams\.{field}\b") as e:
        SamplingParams(**{field: value})
    assert repr(value)[:20] in str(e.value)


def test_sampling_params_accept_numpy_numbers_and_store_plain_python_values():
    p = SamplingParams(n=np.int64(2), top_k=np.int32(5), max_tokens=np.int64(7), seed=np.uint32(3),
                       temperature=np.float32(0.5), top_p=np.float64(0.9), stop_token_ids=(np.int64(4), 9),
                       stop=("x", "yz"))
    assert (p.n, p.top_k, p.max_tokens, p.seed, p.stop_token_ids, p.stop) == (2, 5, 7, 3, [4, 9], ["x", "yz"])
    assert all(type(v) is int for v in (p.n, p.top_k, p.max_tokens, p.seed, *p.stop_token_ids))
    assert type(p.temperature) is float and type(p.top_p) is float and p.temperature == 0.5
    assert SamplingParams(temperature=0, top_p=1).greedy and SamplingParams(stop="ab").stop == ["ab"]


def test_sampling_params_defaults_and_positional_order_are_unchanged():
    p = SamplingParams(2, 0.7, 5, 0.9, 11, 20, ["\n"], [3], True)
    assert (p.n, p.temperature, p.top_k, p.top_p, p.seed, p.max_tokens, p.stop, p.stop_token_ids, p.ignore_eos) == \
        (2, 0.7, 5, 0.9, 11, 20, ["\n"], [3], True)
    d = SamplingParams()
    assert (d.stop, d.stop_token_ids, d.logits_processors, d.seed, d.ignore_eos) == ([], [], [], None, False)


def test_logits_processors_are_callables_stored_as_a_list():
    def ban_token_7(output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()                                           # (V,)
        logits[7] = float("-inf")
        return logits
    p = SamplingParams(logits_processors=(ban_token_7,))
    assert p.logits_processors == [ban_token_7]
    assert p.logits_processors[0]([], torch.zeros(10))[7] == float("-inf")
    assert SamplingParams(logits_processors=[]).logits_processors == []


# ---------------------------------------------------------------- EngineConfig: types
@pytest.mark.parametrize("field", ["enable_chunked_prefill", "enable_prefix_caching", "trace"])
@pytest.mark.parametrize("value", ["false", "true", 0, 1, None, np.float64(0.0)])
def test_bool_options_take_only_true_or_false(field, value):
    with pytest.raises(ValueError,
                       match=rf"^EngineConfig\.{field} must be True or False, got {re.escape(repr(value))}"):
        EngineConfig(**{field: value})


def test_block_size_none_names_the_field():
    with pytest.raises(ValueError, match=r"^EngineConfig.block_size must be a positive integer, got None$"):
        EngineConfig(block_size=None)


@pytest.mark.parametrize("field,value", [
    ("block_size", True), ("block_size", 16.0), ("max_num_seqs", True), ("max_num_seqs", None), ("max_num_seqs", "4"),
    ("max_model_len", True), ("max_model_len", 64.0), ("kv_cache_bytes", 1e6), ("kv_cache_bytes", True),
    ("max_num_batched_tokens", False), ("swap_bytes", 1e6), ("swap_bytes", True), ("swap_bytes", None),
    ("swap_bytes", -1), ("seed", True), ("seed", 1.5), ("seed", None), ("seed", "0"),
    ("batch_window_s", float("inf")), ("batch_window_s", 1e400), ("batch_window_s", float("nan")),
    ("batch_window_s", -0.1), ("batch_window_s", "0.1"), ("batch_window_s", True), ("batch_window_s", None),
    ("speculative", "ngram"), ("speculative", ["ngram"]), ("quant_config", "group_size=64"), ("quant_config", [64]),
    ("tokenizer", 3), ("tokenizer", b"tok.bin"),
])
def test_engine_config_refuses_wrong_types_naming_field_and_value(field, value):
    opts = dict(enable_chunked_prefill=True) if field == "max_num_batched_tokens" else {}
    opts.update(preemption_mode="swap") if field == "swap_bytes" else None
    with pytest.raises(ValueError, match=rf"^EngineConfig\.{field}\b") as e:
        EngineConfig(**opts, **{field: value})
    assert repr(value) in str(e.value)


def test_an_infinite_batch_window_asks_for_a_finite_number_of_seconds():
    with pytest.raises(ValueError,
                       match=r"EngineConfig.batch_window_s must be a finite number of seconds >= 0, got inf"):
        EngineConfig(batching="dynamic", batch_window_s=math.inf)


def test_engine_config_accepts_numpy_integers_and_stores_plain_ints():
    cfg = EngineConfig(block_size=np.int64(8), max_num_seqs=np.int32(4), max_model_len=np.int64(64), seed=np.int64(3),
                       batch_window_s=np.float32(0.25), batching="dynamic")
    assert (cfg.block_size, cfg.max_num_seqs, cfg.max_model_len, cfg.seed) == (8, 4, 64, 3)
    assert all(type(v) is int for v in (cfg.block_size, cfg.max_num_seqs, cfg.max_model_len, cfg.seed))
    assert type(cfg.batch_window_s) is float and cfg.batch_window_s == 0.25
    EngineConfig(speculative={"method": "ngram"}, quantization="int4", quant_config={"group_size": 64},
                 tokenizer="t.bin")


# ---------------------------------------------------------------- EngineConfig: contradictions
@pytest.mark.parametrize("opts,match", [
    (dict(batching="static", enable_chunked_prefill=True), r"enable_chunked_prefill=True .*batching='static'"),
    (dict(batching="dynamic", enable_chunked_prefill=True), r"enable_chunked_prefill=True .*batching='dynamic'"),
    (dict(quant_config={"group_size": 64}), r"^EngineConfig.quant_config=\{'group_size': 64\} .*quantization=None"),
    (dict(swap_bytes=2**20), r"^EngineConfig.swap_bytes=1048576 .*preemption_mode='recompute'"),
    (dict(swap_bytes=2**20, preemption_mode="recompute"), r"^EngineConfig.swap_bytes=.*preemption_mode='recompute'"),
    (dict(max_num_batched_tokens=64), r"^EngineConfig.max_num_batched_tokens=64 .*enable_chunked_prefill=True"),
    (dict(max_num_batched_tokens=64, batching="static"),
     r"^EngineConfig.max_num_batched_tokens=64 .*enable_chunked_prefill"),
])
def test_contradicting_options_are_refused_naming_both(opts, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**opts)


def test_the_consistent_combinations_still_build():
    EngineConfig(enable_chunked_prefill=True, max_num_batched_tokens=64)
    EngineConfig(batching="dynamic", batch_window_s=0.05)
    EngineConfig(preemption_mode="swap", swap_bytes=2**20)
    EngineConfig(quantization="int4", quant_config={"group_size": 32})
    EngineConfig(batching="static", max_num_seqs=2)


def test_swap_preemption_without_swap_bytes_is_still_refused_when_the_engine_is_built():
    from minillm import LLM
    EngineConfig(preemption_mode="swap")      # the block size in bytes is known only with the model
    with pytest.raises(ValueError, match="preemption_mode='swap' needs swap_bytes"):
        LLM("random:tiny", preemption_mode="swap")


# ---------------------------------------------------------------- EngineConfig: the machine
def test_kv_cache_bytes_beyond_physical_memory_names_both_numbers():
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pytest.skip("os.sysconf cannot report physical memory here")
    with pytest.raises(ValueError, match=rf"^EngineConfig.kv_cache_bytes={total + 1} .*{total}"):
        EngineConfig(kv_cache_bytes=total + 1)
    EngineConfig(kv_cache_bytes=min(total, 2**20))


def test_kv_cache_bytes_check_is_skipped_without_sysconf(monkeypatch):
    def no_sysconf(name):
        raise ValueError(f"unrecognized configuration name {name!r}")
    monkeypatch.setattr(os, "sysconf", no_sysconf)
    assert EngineConfig(kv_cache_bytes=2**70).kv_cache_bytes == 2**70
