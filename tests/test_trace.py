"""The trace's KV accounting: without shared blocks it reads the sequences alone (their cached tokens), with shared
blocks it walks the block tables; both must give what a walk of every table gives, step by step."""
from minillm import LLM, SamplingParams
from minillm.core.block_manager import BlockManager


class Walked:
    """The same block manager, but without a shared-block count (as a student's may be): the trace walks every
    table."""

    def __init__(self, *args, **kwargs):
        self._bm = BlockManager(*args, **kwargs)

    def __getattr__(self, name):
        if name == "num_shared":
            raise AttributeError(name)
        return getattr(self._bm, name)


def accounting(block_manager, params):
    llm = LLM("random:tiny", backend="torch", block_size=4, enable_chunked_prefill=True, max_num_batched_tokens=24,
              block_manager=block_manager)
    llm.generate(["Hamlet", "Ophelia, in thy orisons", "Be all my sins remembered"] * 2, params)
    return [(s.kv_bytes_used, s.kv_bytes_filled, s.blocks_shared) for s in llm.engine.trace.steps]


def test_the_trace_counts_filled_and_shared_blocks_as_a_walk_of_every_table_does():
    for params in (SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),               # nothing shared
                   SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=9, ignore_eos=True)):   # forks share
        fast, walked = accounting(BlockManager, params), accounting(Walked, params)
        assert fast == walked
        assert any(f for _, f, _ in fast) and (params.n == 1) == (max(s for *_, s in fast) == 0)
