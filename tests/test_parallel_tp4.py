"""Tensor parallelism on four ranks with the tiny preset (4 query heads, 2 KV heads): fewer KV heads than ranks, so
each KV head is replicated on two ranks (vLLM's rule), not refused. On this 2-core machine four ranks take turns
(a warning, not a hang). float64 on large random weights (conftest's tiny64): logits within 1e-9 of one rank."""
import warnings

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.llama.attention import AttentionMetadata
from minillm.parallel import TensorParallelModel, start_group
from minillm.parallel.tensor import head_ranges
from minillm.threads import num_cores

TOL64 = 1e-9     # as tests/test_parallel_tp.py: another summation order, ~1e-15 in float64


@pytest.fixture(scope="module")
def group4():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = start_group(4)                  # the running group: LLM(..., tensor_parallel_size=4) reuses it
    if num_cores() < 4:
        assert any("ranks take turns" in str(w.message) for w in caught)
    yield g
    g.close()


def test_replicated_kv_heads(tiny64):
    cfg = tiny64[0].config
    assert [head_ranges(cfg, 4, r) for r in range(4)] == [(0, 1, 0, 1), (1, 2, 0, 1), (2, 3, 1, 2), (3, 4, 1, 2)]


def test_tp4_logits_and_replicated_kv_equal_one_rank(group4, tiny64):
    model, _ = tiny64
    B, T, bs = 2, 6, 4
    tp = TensorParallelModel(model, group4, kv_blocks=B * 2, block_size=bs)
    tokens = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(T).expand(B, T)                                        # (B, T)
    attn = AttentionMetadata.build(pos, torch.arange(B * 2).view(B, 2), torch.full((B,), T), bs)
    with torch.inference_mode():
        ref = model(tokens)                                                   # (B, T, V) without a cache
    got = tp(tokens, pos, tp.kv, attn)
    assert (got - ref).abs().max().item() < TOL64
    keys = group4.call(_keys, tp.id)                                          # (L, blocks, bs, 1, D) per rank
    assert torch.equal(keys[0], keys[1]) and torch.equal(keys[2], keys[3])    # a replicated head: the same cache
    assert not torch.equal(keys[0], keys[2])


def _keys(state, model_id):
    return state.objects[model_id].kv.k.clone()


def test_tp4_engine_greedy_equals_one_rank(group4, tiny64):
    model, tok = tiny64
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = [[1, 5, 9, 2], [1, 300, 7]]
    ref = LLM(model, tokenizer=tok, dtype="float64", max_model_len=64).generate(prompts, sp)
    llm = LLM(model, tokenizer=tok, dtype="float64", max_model_len=64, tensor_parallel_size=4)
    assert llm.engine.parts.forward.group is group4
    got = llm.generate(prompts, sp)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
