"""kv_eviction (minillm.kv_eviction): StreamingLLM and H2O as a setting of the one engine, on the torch backend.

Checks: bad options refused naming the value; numba refuses it (auto picks torch); keys stored before RoPE and
rotated on read give the same tokens as the usual cache when nothing is evicted; RoPE scores depend only on the
distance (why compacting cache indices keeps the window exact); the block policies pick the right blocks; blocks are
freed and the pool stays flat generating past max_model_len; H2O's scores are the real probabilities (they sum to
layers x heads per query)."""
import math
from functools import partial

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.backends.capabilities import choose_backend
from minillm.config import EngineConfig
from minillm.core.sequence import Sequence
from minillm.kv_eviction import H2OPolicy, StreamingPolicy, check_kv_eviction
from minillm.llama.attention import AttentionMetadata, paged_attention
from minillm.llama.transformer import apply_rope, rope_tables, rotate_keys

PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\n" * 3


@pytest.fixture(scope="module")
def full():
    return LLM("shakespeare", backend="torch")


@pytest.mark.parametrize("bad, word", [
    ({"method": "streaming", "sinks": 8, "window": 4}, "window=4"),
    ({"method": "lru"}, "'lru'"),
    ({"method": "streaming", "sinks": -1}, "-1"),
    ({"method": "h2o", "window": -5}, "-5"),
    ({"method": "streaming", "budget": 3}, "budget"),
    ("streaming", "streaming"),
])
def test_bad_options_name_the_value(bad, word):
    with pytest.raises(ValueError, match="kv_eviction") as e:
        EngineConfig(kv_eviction=bad)
    assert word in str(e.value)


def test_defaults_and_contradictions():
    assert check_kv_eviction({"method": "h2o"}) == {"method": "h2o", "sinks": 4, "window": 256}
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        EngineConfig(kv_eviction={"method": "streaming"}, enable_prefix_caching=True)
    with pytest.raises(ValueError, match="max_model_len=1024"):
        LLM("shakespeare", backend="torch", kv_eviction={"method": "streaming", "sinks": 4, "window": 1000})


def test_numba_refuses_and_auto_picks_torch():
    cfg = EngineConfig(kv_eviction={"method": "streaming"}, max_model_len=1024)
    backend, why = choose_backend(cfg)
    assert backend == "torch" and "kv_eviction" in why
    with pytest.raises(ValueError, match="backend='numba' does not run kv_eviction method='streaming'"):
        LLM("shakespeare", backend="numba", kv_eviction={"method": "streaming"})


@pytest.mark.parametrize("method", ["streaming", "h2o"])
def test_keys_before_rope_match_the_usual_cache_without_eviction(full, method):
    """A window larger than the sequence: nothing leaves, so rotating keys on read at their cache index (= their
    position) must give the same logprobs as keys rotated on write (float32 reordering: atol 1e-4)."""
    p = SamplingParams(temperature=0, max_tokens=24, logprobs=1)
    want = full.generate([PROMPT], p)[0].outputs[0]
    llm = LLM("shakespeare", backend="torch", kv_eviction={"method": method, "sinks": 4, "window": 512})
    got = llm.generate([PROMPT], p)[0].outputs[0]
    assert got.token_ids == want.token_ids
    for a, b in zip(got.logprobs, want.logprobs):
        t = next(iter(b))
        assert abs(a[t] - b[t]) < 1e-4
    assert llm.engine.block_manager.num_evicted == 0


def test_rope_scores_depend_on_distance_only():
    """q(p) . k(j) with RoPE depends on p - j: moving a query and its window keys down by the evicted count (cache
    indices) leaves their scores unchanged; only the sinks come closer (StreamingLLM's positions in the cache)."""
    g = torch.Generator().manual_seed(0)
    D = 64
    cos, sin = rope_tables(D, 2048)
    q, k = torch.randn(1, 1, 1, D, generator=g), torch.randn(1, 1, 1, D, generator=g)

    def score(p, j):
        rq = apply_rope(q.double(), cos[p].view(1, 1, -1), sin[p].view(1, 1, -1))
        rk = apply_rope(k.double(), cos[j].view(1, 1, -1), sin[j].view(1, 1, -1))
        return float((rq * rk).sum())

    for shift in (16, 512, 1000):       # rel 1e-4: the tables hold float32 angles (~1e-4 rad at position 1000)
        assert math.isclose(score(1030, 1000), score(1030 - shift, 1000 - shift), rel_tol=1e-4)


def _pool(B=1, S=40, Hkv=2, D=8, bs=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B * (-(-S // bs)), bs, Hkv, D, generator=g)
    v = torch.randn(B * (-(-S // bs)), bs, Hkv, D, generator=g)
    return k, v


def test_rotate_on_read_and_window_mask_match_reference():
    """paged_attention over keys stored before RoPE with the streaming rule = a plain softmax over keys rotated at
    their cache index, with j < sinks or p - j < window (atol 1e-5)."""
    S, T, H, Hkv, D, bs, sinks, window = 40, 5, 4, 2, 8, 8, 3, 12
    kp, vp = _pool(S=S, Hkv=Hkv, D=D, bs=bs)
    q = torch.randn(1, T, H, D, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(S - T, S)[None]                                      # (1, T) the last T cache indices
    attn = AttentionMetadata.build(pos, torch.arange(S // bs)[None], torch.tensor([S]), bs)
    cos, sin = rope_tables(D, 64)
    attn.rope_on_read, attn.rope, attn.window = True, partial(rotate_keys, cos.float(), sin.float()), (sinks, window)
    got = paged_attention(q, kp, vp, attn)                                  # (1, T, H, D)
    k = kp.flatten(0, 1)[None]                                              # (1, S, Hkv, D)
    v = vp.flatten(0, 1)[None]
    k = apply_rope(k, cos[:S].float()[None], sin[:S].float()[None]).repeat_interleave(H // Hkv, 2)
    v = v.repeat_interleave(H // Hkv, 2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)                # (1, H, T, S)
    j, p = torch.arange(S), pos[0][:, None]
    ok = (j <= p) & ((j < sinks) | (p - j < window))                        # (T, S)
    want = torch.einsum("bhts,bshd->bthd", torch.softmax(s.masked_fill(~ok, float("-inf")), -1), v)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_h2o_received_are_the_softmax_probabilities():
    """Each real query hands out probability 1 per head: received sums to H x real queries; padding adds none."""
    S, T, H, D, bs = 24, 3, 4, 8, 8
    kp, vp = _pool(B=2, S=S, D=D, bs=bs)
    q = torch.randn(2, T, H, D, generator=torch.Generator().manual_seed(2))
    pos = torch.arange(S - T, S).expand(2, T)
    valid = torch.tensor([[True] * T, [True, False, False]])
    attn = AttentionMetadata.build(pos, torch.arange(6).view(2, 3), torch.tensor([S, S]), bs, valid)
    attn.received = torch.zeros(2, S)
    y = paged_attention(q, kp, vp, attn)
    torch.testing.assert_close(attn.received.sum(1), torch.tensor([H * 3.0, H * 1.0]))
    attn2 = AttentionMetadata.build(pos, torch.arange(6).view(2, 3), torch.tensor([S, S]), bs, valid)
    torch.testing.assert_close(y[0], paged_attention(q, kp, vp, attn2)[0], atol=1e-5, rtol=1e-5)


def _seq(n_blocks):
    s = Sequence(0, "r", 0, [1], SamplingParams(), 0, 0.0)
    s.block_table = list(range(n_blocks))
    return s


def test_streaming_victims():
    pol = StreamingPolicy(sinks=4, window=32)
    # bs 16, 100 tokens cached: a future query p >= 100 sees j >= 69 only (plus sinks): blocks 1..3 end by 63
    assert pol.victims(_seq(7), 100, 16) == [1, 2, 3]
    assert pol.victims(_seq(3), 40, 16) == []                     # everything still in view
    assert StreamingPolicy(sinks=20, window=32).victims(_seq(7), 100, 16) == [2, 3]   # blocks 0, 1 hold sinks


def test_h2o_victims_are_the_lightest_old_blocks():
    pol = H2OPolicy(sinks=4, window=64)                           # budget 68, recent 32
    s = _seq(8)
    s.kv_scores = torch.ones(110)
    s.kv_scores[16:32] = 0.1                                      # block 1 light
    s.kv_scores[48:64] = 0.2                                      # block 3 next lightest
    s.kv_scores[0:16] = 0.0                                       # block 0 holds the sinks: kept anyway
    # (110 - 68) // 16 = 2 whole blocks over budget; candidates: blocks 1..3 (block 4 on holds the 32 recent tokens)
    assert pol.victims(s, 110, 16) == [1, 3]
    s.kv_scores[48:64] = 5.0                                      # block 3 now heavy: block 2 goes instead
    assert pol.victims(s, 110, 16) == [1, 2]


def test_streaming_generates_past_the_context_with_flat_blocks():
    """1000-token prompt + 100 generated > max_model_len 1024: runs, frees blocks, keeps the pool's use flat."""
    llm = LLM("shakespeare", backend="torch", kv_eviction={"method": "streaming", "sinks": 4, "window": 124})
    prompt = (PROMPT * 40)[:20000]
    ids = llm.tokenizer.encode(prompt)[:1000]
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert len(ids) + len(out.outputs[0].token_ids) == 1100 > llm.engine.config.max_model_len
    bm = llm.engine.block_manager
    used = [s.blocks_used for s in llm.engine.trace.steps]
    assert bm.num_evicted >= (1100 - 128 - 64) // 16 - 2
    # sinks block + window (8 blocks) + a chunk of 64 (4 blocks) + 2 partial blocks
    assert max(used) <= 1 + 8 + 4 + 2
    assert max(used[-50:]) - min(used[-50:]) <= 1                  # decoding: flat (one block comes and goes)
    bm.check([])                                                   # everything given back, nothing doubled


def test_h2o_keeps_its_budget_and_generates(full):
    llm = LLM("shakespeare", backend="torch", kv_eviction={"method": "h2o", "sinks": 4, "window": 92})
    ids = llm.tokenizer.encode(PROMPT * 6)[:300]
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 30
    used = [s.blocks_used for s in llm.engine.trace.steps]
    assert llm.engine.block_manager.num_evicted > 0
    assert max(used[-20:]) <= -(-(96 + 16) // 16) + 1              # budget + a block over, + the one being written


def test_freeing_a_sequence_forgets_its_evictions():
    """A preempted (recomputed) sequence's K/V are gone: its eviction count restarts at 0, so the scheduler's room
    check counts its whole first chunk again (a stale count made it under-ask and crash)."""
    import torch

    from minillm.core.block_manager import BlockManager
    from minillm.core.sampling import SamplingParams
    from minillm.core.sequence import Sequence
    bm = BlockManager(16, 4)
    seq = Sequence(0, "r", 0, list(range(1, 30)), SamplingParams(), 0, 0.0)
    bm.allocate(seq, len(seq))
    seq.evicted, seq.kv_scores = 8, torch.ones(21)
    bm.free_seq(seq)
    assert seq.evicted == 0 and bm.num_free == 16
    assert seq.kv_scores is not None                  # a finished sequence's H2O record stays readable (notebook 14)
    bm.allocate_prompt(seq)                           # a recompute starts its scores afresh
    assert seq.kv_scores is None and seq.evicted == 0
