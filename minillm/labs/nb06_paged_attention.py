"""Checkers for notebook 06_paged_attention."""
from __future__ import annotations

from .common import checker


@checker
def check_wasted_slots(fn):
    """fn(lengths: list[int], block_size) -> KV slots reserved but empty when each sequence holds whole blocks"""
    from ..core.block_manager import BlockManager
    from ..core.sampling import SamplingParams
    from ..core.sequence import Sequence
    for lengths, bs in [([5, 16, 17], 16), ([1, 2, 3], 1), ([100], 1024), ([7, 9], 4)]:
        bm = BlockManager(sum(-(-n // bs) for n in lengths) + 1, bs)
        for i, n in enumerate(lengths):                 # the block manager allocates; count its empty slots
            bm.allocate(Sequence(i, str(i), 0, list(range(n)), SamplingParams(), 0, 0.0), n)
        want = bm.num_used * bs - sum(lengths)
        got = fn(list(lengths), bs)
        assert got == want, f"lengths {lengths}, block_size {bs}: got {got}, expected {want}"
    return "whole blocks minus tokens: only each sequence's last block is partly empty"


@checker
def check_prefix_hit_tokens(fn):
    """fn(first_prompt, second_prompt, block_size) -> tokens of the second prompt served from the prefix cache
    after the first has run (ids lists)"""
    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    a = [1] + list(range(300, 337))                       # 38 tokens
    cases = [(a, a[:30] + [400, 401], 8), (a, a + [402], 8), (a, a[:5] + [403] * 20, 4), (a, a[:20], 16),
             (a, list(a), 4)]
    for first, second, bs in cases:
        llm = LLM("random:tiny", block_size=bs, enable_prefix_caching=True, max_model_len=64)
        one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        llm.generate([first], one)
        want = llm.generate([second], one)[0].metrics.num_cached_tokens
        got = fn(list(first), list(second), bs)
        assert got == want, \
            f"first {len(first)} tokens, second {len(second)}, block_size {bs}: got {got}, the engine reused {want}"
    return "whole blocks of the shared prefix, never the second prompt's last token"
