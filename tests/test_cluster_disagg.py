"""Prefill/decode disaggregation (minillm.cluster): a prefill engine hands each sequence's KV blocks to a decode
engine. Output equals one colocated engine's (float64, DESIGN rule 7: exact greedy tokens; seeded samples too,
since the sampling generator travels with the sequence); the bytes handed over equal blocks x block bytes; a
handover the decode pool has no room for waits and loses nothing; mismatched engines are refused by name; on the
simulated clock (fixed StepCost: deterministic) a trace where disaggregation wins on TPOT p99 and one where it
loses."""
import pytest
import torch

from minillm.bench.step_cost import StepCost
from minillm.cluster import DisaggregatedEngine, Link, replay_disagg, replay_routed, timelines
from minillm.cluster.kv_transfer import block_bytes, export_sequence, import_sequence
from minillm.config import EngineConfig
from minillm.core.sampling import SamplingParams
from minillm.engine.engine import LLMEngine
from minillm.formats.loader import random_model
from minillm.llama.kv_cache import KVCache
from minillm.workload import Request

OPTS = dict(backend="torch", dtype="float64", max_model_len=128, block_size=8, max_num_seqs=8)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def engine(model, tok, **options):
    return LLMEngine.from_model(model, tok, EngineConfig(**{**OPTS, **options}))


def colocated(model, tok, prompts, params, **options):
    """One engine, every prompt at once: the reference output."""
    e = engine(model, tok, **options)
    ids = [e.add_request(p, params) for p in prompts]
    done = {}
    while e.has_unfinished_requests():
        e.step()
        done.update((o.request_id, o) for o in e.pop_finished())
    return [done[i] for i in ids]


# prompt lengths around block boundaries (block_size 8): a partial last block, exactly full blocks, one token
PROMPTS = [[1] + [300 + (7 * i + j) % 200 for j in range(n)] for i, n in enumerate((0, 6, 7, 8, 15, 16, 40))]


def test_greedy_output_equals_one_colocated_engine(tiny64):
    pair = DisaggregatedEngine(engine(*tiny64), engine(*tiny64))
    got, want = pair.generate(PROMPTS, GREEDY), colocated(*tiny64, PROMPTS, GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert len(pair.handovers) == len(PROMPTS)
    assert pair.prefill.block_manager.num_used == 0 and pair.decode.block_manager.num_used == 0   # all given back


def test_seeded_sampling_equals_one_colocated_engine(tiny64):
    """The generator's state travels in the handover: the decode engine draws the coins the colocated engine would."""
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=7, ignore_eos=True)
    pair = DisaggregatedEngine(engine(*tiny64), engine(*tiny64))
    got, want = pair.generate(PROMPTS[:4], params), colocated(*tiny64, PROMPTS[:4], params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_handover_bytes_equal_blocks_times_block_bytes(tiny64):
    """Counted from the tensors = blocks x block bytes = blocks x block_size x 2 x layers x Hkv x D x 8 (float64)."""
    pair = DisaggregatedEngine(engine(*tiny64), engine(*tiny64))
    pair.generate(PROMPTS, GREEDY)
    cfg = tiny64[0].config
    per_block = 8 * 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 8
    assert block_bytes(pair.prefill) == per_block == 8 * KVCache.bytes_per_token(cfg, torch.float64)
    for h, p in zip(pair.handovers, PROMPTS):
        assert h.blocks == -(-len(p) // 8)                       # only the blocks the prompt's K/V fill
        assert h.bytes == h.blocks * per_block


def test_int8_kv_handover_carries_the_scales(tiny64):
    """An int8 pool's handover is its int8 K/V plus the float32 scale per token and head: the formula counts both,
    and the tokens still equal one engine's with the same int8 pool."""
    pair = DisaggregatedEngine(engine(*tiny64, kv_cache_dtype="int8"), engine(*tiny64, kv_cache_dtype="int8"))
    got = pair.generate(PROMPTS[:3], GREEDY)
    want = colocated(*tiny64, PROMPTS[:3], GREEDY, kv_cache_dtype="int8")
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    cfg = tiny64[0].config
    for h in pair.handovers:
        assert h.bytes == h.blocks * 8 * 2 * cfg.n_layers * cfg.n_kv_heads * (cfg.head_dim + 4)


def test_a_handover_without_room_waits_and_loses_nothing(tiny64):
    """A decode pool of 6 blocks (48 tokens): the first handover (21 tokens + 1: 3 blocks) leaves too little for the
    second's (25 + 1: 4 blocks), which waits in the inbox (nothing else changes) and is taken in when the first
    finishes."""
    pair = DisaggregatedEngine(engine(*tiny64), engine(*tiny64, kv_cache_bytes=6 * block_bytes_of(tiny64),
                                                        max_model_len=48))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    a, b = [1] + list(range(300, 320)), [1] + list(range(320, 344))
    ids = [pair.add_request(a, params), pair.add_request(b, params)]
    waited = False
    done = {}
    while pair.has_unfinished_requests():
        pair.step()
        if pair.inbox:
            waited = True
            assert len(pair.decode.scheduler.running) <= 1 and not pair.decode.scheduler.waiting   # no preemption
        pair.decode.block_manager.check(pair.decode.scheduler.running)
        done.update((o.request_id, o) for o in pair.pop_finished())
    assert waited
    want = colocated(*tiny64, [a, b], params)
    assert [done[i].token_ids for i in ids] == [o.token_ids for o in want]


def test_a_handed_over_sequence_preempted_in_the_decode_engine_recomputes_the_same_tokens(tiny64):
    """Two handovers fit the decode pool (6 blocks) but outgrow it as they decode: the newer is preempted (recompute:
    the decode engine prefills its prompt and output again from its token ids) and still ends as one engine's."""
    pair = DisaggregatedEngine(engine(*tiny64), engine(*tiny64, kv_cache_bytes=6 * block_bytes_of(tiny64),
                                                        max_model_len=48))
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [[1] + list(range(300, 312)), [1] + list(range(320, 332))]
    got = pair.generate(prompts, params)
    assert sum(o.metrics.num_preemptions for o in got) >= 1
    assert [o.token_ids for o in got] == [o.token_ids for o in colocated(*tiny64, prompts, params)]


def block_bytes_of(model_tok):
    return 8 * KVCache.bytes_per_token(model_tok[0].config, torch.float64)


def test_import_refuses_without_room_and_changes_nothing(tiny64):
    pre, dec = engine(*tiny64), engine(*tiny64, kv_cache_bytes=16 * block_bytes_of(tiny64))   # 16 blocks: one seq
    pre.add_request([1] + list(range(300, 340)), GREEDY)
    pre.step()
    h = export_sequence(pre, pre.scheduler.running[0])
    assert pre.block_manager.num_used == 0 and not pre.requests
    filler = engine(*tiny64)
    filler.add_request([1] + list(range(300, 420)), GREEDY)   # 121 tokens: 16 blocks, the whole decode pool
    filler.step()
    h2 = export_sequence(filler, filler.scheduler.running[0])
    assert import_sequence(dec, h2) is not None
    before = (dec.block_manager.num_free, list(dec.requests))
    assert import_sequence(dec, h) is None                    # no room: refused, nothing changed
    assert (dec.block_manager.num_free, list(dec.requests)) == before


def test_first_token_finishes_in_the_prefill_engine(tiny64):
    pair = DisaggregatedEngine(engine(*tiny64), engine(*tiny64))
    out = pair.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [1, 1] and not pair.handovers


def test_abort_a_waiting_handover(tiny64):
    pair = DisaggregatedEngine(engine(*tiny64), engine(*tiny64), link=lambda nbytes: 3600.0)   # an hour's link
    rid = pair.add_request(PROMPTS[3], GREEDY)
    pair.step()
    assert len(pair.inbox) == 1 and not pair.decode.requests
    pair.abort(rid)
    assert not pair.has_unfinished_requests()
    with pytest.raises(ValueError, match="no request with id"):
        pair.abort(rid)


# ---------------------------------------------------------------------------- bad input
def test_mismatched_engines_are_refused_by_name(tiny64):
    pre = engine(*tiny64)
    with pytest.raises(ValueError, match="block_size=16 differs from the prefill engine's block_size=8"):
        DisaggregatedEngine(pre, engine(*tiny64, block_size=16))
    other = random_model("tiny", n_layers=1)[0].double()
    with pytest.raises(ValueError, match="model differs.*n_layers"):
        DisaggregatedEngine(pre, engine(other, tiny64[1]))
    reseeded = random_model("tiny", seed=1)[0].double()
    with pytest.raises(ValueError, match="different weights"):
        DisaggregatedEngine(pre, engine(reseeded, tiny64[1]))
    with pytest.raises(ValueError, match="KV dtype"):
        DisaggregatedEngine(pre, engine(*tiny64, kv_cache_dtype="int8"))


def test_requests_the_pair_cannot_serve_are_refused_before_queueing(tiny64):
    pair = DisaggregatedEngine(engine(*tiny64), engine(*tiny64, kv_cache_bytes=16 * block_bytes_of(tiny64),
                                                        max_model_len=100))
    with pytest.raises(ValueError, match="n=2"):
        pair.add_request(PROMPTS[1], SamplingParams(n=2, max_tokens=4))
    with pytest.raises(ValueError, match="max_model_len is 100"):
        pair.add_request([1] + [300] * 110, GREEDY)           # fits the prefill engine (128), not the decode one
    pair.add_request(PROMPTS[2], GREEDY)
    assert len(pair.prefill.requests) == 1                    # only the good one was queued
    with pytest.raises(ValueError, match="already in use"):
        pair.add_request(PROMPTS[2], GREEDY, request_id=next(iter(pair.prefill.requests)))


# ---------------------------------------------------------------------------- the simulated clock
COST = StepCost(0.0, 5e-4, 1e-3, "test")    # a CPU's shape: no fixed cost, a decode row 1.5 ms, a prompt token 1 ms


@pytest.fixture(scope="module")
def tiny1():
    return random_model("tiny", n_layers=1)


SIM = dict(backend="torch", max_model_len=256, block_size=8, max_num_seqs=16)


def tpot_p99(outputs):
    return float(torch.tensor([o.metrics.time_per_output_token or 0.0 for o in outputs]).quantile(0.99))


def test_disaggregation_wins_on_tpot_p99_when_long_prompts_interrupt_decodes(tiny1):
    """Two chats decoding, then a 200-token prompt: colocated, it lands on a replica with a chat (least loaded, ties
    to replica 0) and that chat waits out its 200 ms prefill; disaggregated, the decode engine never prefills."""
    trace = [Request(0.0, [1] + [300] * 7, 24), Request(0.0, [1] + [301] * 7, 24),
             Request(0.01, [1] + [302] * 199, 2)]
    colo = replay_routed(*tiny1, trace, "least_loaded", 2, COST, **SIM)
    dis = replay_disagg(*tiny1, trace, COST, Link(1e-4, 1e9), **SIM)
    assert tpot_p99(dis.outputs) < tpot_p99(colo.outputs)
    assert max(s.seconds for s in dis.engines["decode"].trace.steps) < 0.01     # no decode step held by a prompt
    assert len(dis.handovers) == 3


def test_disaggregation_loses_on_tpot_p99_when_decodes_dominate(tiny1):
    """Eight short prompts, long decodes: colocated, each engine decodes four (4 rows a step); disaggregated, the
    decode engine decodes all eight (8 rows: twice the step on this cost) while the prefill engine idles."""
    trace = [Request(0.0, [1] + [300 + i] * 7, 32) for i in range(8)]
    colo = replay_routed(*tiny1, trace, "round_robin", 2, COST, **SIM)
    dis = replay_disagg(*tiny1, trace, COST, Link(1e-4, 1e9), **SIM)
    assert tpot_p99(dis.outputs) > tpot_p99(colo.outputs)
    assert dis.busy_s["prefill"] < 0.25 * dis.busy_s["decode"]     # (8 prompts of 8 tokens: 68 ms against 372)


def test_timelines_put_each_handover_between_first_token_and_the_next(tiny1):
    trace = [Request(0.002 * i, [1] + [300 + i] * (10 + 20 * i), 6) for i in range(4)]
    link = Link(1e-3, 1e6)                                   # 1 ms + 1 us per byte: visible on the timeline
    dis = replay_disagg(*tiny1, trace, COST, link, **SIM)
    rows = timelines(dis.outputs, dis.handovers)
    assert [r["request_id"] for r in rows] == ["0", "1", "2", "3"]
    for r in rows:
        assert r["arrival"] <= r["first_scheduled"] < r["first_token"] == r["handover_sent"]
        assert r["handover_ready"] == pytest.approx(r["handover_sent"] + link(r["handover_bytes"]))
        assert r["handover_ready"] <= r["handover_received"] <= r["token_times"][1] <= r["finished"]
        assert len(r["token_times"]) == 6
