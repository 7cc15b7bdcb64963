"""Pipeline parallelism on two gloo ranks (minillm.parallel.pipeline): logits bit for bit those of one rank running
the same micro-batches (the stages run the model's own blocks: the summation order is unchanged), the engine's
output equal to one rank's (DESIGN.md rule 7), the payload bytes == the formula, and the ranks' timeline: every
micro-batch reaches stage 1 only after stage 0 computed it. One rank group for the module."""
import pytest
import torch
from parallel_helpers import assert_logprobs_close, compare_up_to_near_tie, engine, greedy, module_group

from minillm.formats.loader import load
from minillm.llama.attention import AttentionMetadata
from minillm.llama.kv_cache import KVCache
from minillm.parallel import PipelineParallelModel, bubble, gpipe_bubble, pp_step_bytes
from minillm.parallel.pipeline import micro_batches, stage_layers

group = module_group()
TOL64 = 1e-9     # float64 engine: the micro-batches change matmul shapes (summation blocking), ~1e-14 on the logits


@pytest.fixture(scope="module")
def model32():
    return load("shakespeare", None, "float32", 0)[0]


def _one_rank(model, tokens, m):
    """The reference: one rank running the same micro-batches, concatenated."""
    with torch.inference_mode():
        return torch.cat([model(tokens[b0:b1]) for b0, b1 in micro_batches(tokens.shape[0], m)])


@pytest.mark.parametrize("m", [1, 2, 3])
def test_pp_logits_are_bit_identical_to_one_rank(group, model32, m):
    tokens = torch.randint(0, 4096, (5, 9), generator=torch.Generator().manual_seed(m))
    pp = PipelineParallelModel(model32, group, micro_batches=m)
    assert torch.equal(pp(tokens), _one_rank(model32, tokens, m))
    if m == 1:
        with torch.inference_mode():
            assert torch.equal(pp(tokens), model32(tokens))                  # one micro-batch: the model's own call


def test_pp_through_the_paged_cache_is_bit_identical(group, model32):
    """A prefill then a decode step through each stage's KV pool (its layers, every KV head), rows selected."""
    B, bs = 4, 4
    pp = PipelineParallelModel(model32, group, micro_batches=2, kv_blocks=B * 2, block_size=bs)
    ref_kv = KVCache(model32.config, B * 2, bs, torch.float32)
    tables = torch.arange(B * 2).view(B, 2)                                   # (B, M)
    tokens = torch.randint(0, 4096, (B, 6), generator=torch.Generator().manual_seed(0))
    for start, chunk in ((0, tokens[:, :5]), (5, tokens[:, 5:])):            # prefill 5 tokens, then decode one
        T = chunk.shape[1]
        pos = torch.arange(start, start + T).expand(B, T)                     # (B, T)
        attn = AttentionMetadata.build(pos, tables, torch.full((B,), start + T), bs)
        rows = torch.arange(B) * T + T - 1
        got = pp(chunk, pos, pp.kv, attn, rows=rows)
        want = []
        with torch.inference_mode():
            for b0, b1 in micro_batches(B, 2):
                sub = AttentionMetadata(attn.slot_mapping[b0:b1], tables[b0:b1], attn.context_lens[b0:b1], pos[b0:b1])
                want.append(model32(chunk[b0:b1], pos[b0:b1], ref_kv, sub, rows=torch.arange(b1 - b0) * T + T - 1))
        assert torch.equal(got, torch.cat(want))


def test_pp_engine_equals_one_rank(group):
    """float64: tokens equal, logprobs within TOL64; float32: greedy tokens up to the first near-tie."""
    assert_logprobs_close(greedy(engine(dtype="float64")), greedy(engine(dtype="float64", pipeline_parallel_size=2)),
                          TOL64)
    compared = compare_up_to_near_tie(greedy(engine(backend="torch")), greedy(engine(pipeline_parallel_size=2)))
    assert compared >= 32, f"only {compared} of 64 steps compared: the prompts sit on near-ties"


def test_counted_payload_bytes_equal_the_formula(group, model32):
    B, T, m = 4, 6, 2
    pp = PipelineParallelModel(model32, group, micro_batches=m)
    rows = torch.tensor([5, 11, 17, 23])
    pp(torch.randint(0, 4096, (B, T)), rows=rows)
    got = {op: n for op, n in group.comm.steps[-1].items() if n}
    assert got == pp_step_bytes(model32.config, 2, B, T, N=4, elem=4)
    assert group.comm.calls["send"] >= m                                     # one send per micro-batch


def test_timeline_shows_the_pipeline_and_its_bubble(group, model32):
    m = 4
    pp = PipelineParallelModel(model32, group, micro_batches=m)
    with group.recording() as rec:
        pp(torch.randint(0, 4096, (8, 16)), rows=torch.arange(8) * 16 + 15)
    compute = {r: [e for e in rec.events if e.rank == r and e.kind == "compute"] for r in (0, 1)}
    assert [len(compute[r]) for r in (0, 1)] == [m, m]
    for i in range(m):                                   # stage 1 starts micro-batch i after stage 0 finished it
        assert compute[1][i].start >= compute[0][i].end
    assert any(e.kind == "send" for e in rec.events if e.rank == 0)
    fractions = bubble(rec.events)
    assert set(fractions) == {0, 1} and all(0 < f["idle_fraction"] < 1 for f in fractions.values())
    assert gpipe_bubble(2, 1) == 0.5 and gpipe_bubble(2, 4) == pytest.approx(0.2)


def test_bad_pipeline_sizes_are_refused_by_name():
    with pytest.raises(ValueError, match="pipeline_parallel_size=9 is more than the model's n_layers=8"):
        stage_layers(8, 9)
    assert stage_layers(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert micro_batches(5, 2) == [(0, 3), (3, 5)] and micro_batches(2, 8) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match="micro_batches must be a whole number >= 1, got 0"):
        PipelineParallelModel(None, 2, micro_batches=0)
