"""Checkers for notebook 14_long_context."""
from __future__ import annotations

from .common import checker

SINKS, WINDOW, BS = 4, 44, 16           # the engine run: tiny random model, 199-token prompt, 120 tokens generated


def _victims_policy(fn):
    """The student's fn(n_cache, n_blocks, block_size, sinks, window) as the engine's StreamingPolicy.victims."""
    from ..kv_eviction import StreamingPolicy

    class Student(StreamingPolicy):
        def victims(self, seq, n_cache, block_size):
            return [int(i) for i in fn(n_cache, len(seq.block_table), block_size, self.sinks, self.size)]
    return Student(SINKS, WINDOW)


def _states():
    """(n_cache, n_blocks, block_size, sinks, window) cases: odd sizes, sinks filling a block, nothing to evict."""
    out = []
    for bs, sinks, window in ((16, 4, 44), (8, 0, 20), (16, 16, 32), (4, 6, 9), (16, 20, 100)):
        for n in range(1, 3 * (sinks + window) + 2 * bs, 3):
            out.append((n, -(-n // bs), bs, sinks, window))
    return out


def _diagnose(fn):
    """Compare fn with the engine's StreamingPolicy on every state; assert with the mistake's name."""
    from ..core.sampling import SamplingParams
    from ..core.sequence import Sequence
    from ..kv_eviction import StreamingPolicy
    for n, nb, bs, sinks, window in _states():
        seq = Sequence(0, "r", 0, [1], SamplingParams(), 0, 0.0)
        seq.block_table = list(range(nb))
        want = StreamingPolicy(sinks, window).victims(seq, n, bs)
        got = fn(n, nb, bs, sinks, window)
        assert isinstance(got, (list, tuple, range)) and all(isinstance(i, int) for i in got), \
            f"returned {got!r}: it must be a list of block indices (ints)"
        got = sorted(got)
        case = f"(n_cache={n}, {nb} blocks of {bs}, sinks={sinks}, window={window})"
        assert len(set(got)) == len(got), f"returns block {got} twice {case}: a block is freed once"
        assert all(0 <= i < nb for i in got), f"returns an index outside the table {got} {case}"
        held = -(-sinks // bs)
        assert not any(i < held for i in got), \
            f"frees block {min(got)}, which holds an attention sink (tokens < {sinks} stay forever) {case}"
        assert nb - 1 not in got or nb - 1 in want, \
            f"frees the last block {nb - 1}, which the next token is written into {case}"
        early = [i for i in got if i not in want]
        if early:
            i = early[0]
            assert False, (f"frees block {i} (tokens {i * bs}..{i * bs + bs - 1}) while the next query (cache index "
                           f"{n}) still sees token {max(i * bs, n - window + 1)} in its window of {window} "
                           f"(off by one?) {case}")
        late = [i for i in want if i not in got]
        assert not late, (f"keeps block {late[0]} although every token of it left the window of every future "
                          f"query: the pool would grow with the sequence {case}")


@checker(kind="core", signature="n_cache, n_blocks, block_size, sinks, window")
def check_window_victims(fn):
    """fn(n_cache, n_blocks, block_size, sinks, window) -> the block indices a sliding window with attention sinks
    frees: blocks with no sink token whose every token is out of the window of every future query."""
    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    _diagnose(fn)
    spec = {"method": "streaming", "sinks": SINKS, "window": WINDOW}
    prompt, p = list(range(1, 200)), SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    ref = LLM("random:tiny", backend="torch", kv_eviction=spec)
    want = ref.generate([prompt], p)[0].outputs[0].token_ids
    llm = LLM("random:tiny", backend="torch", kv_eviction=spec, eviction=_victims_policy(fn))   # the student's frees
    got = llm.generate([prompt], p)[0].outputs[0].token_ids
    bm, used = llm.engine.block_manager, [s.blocks_used for s in llm.engine.trace.steps]
    bm.check([])
    assert got == want, "the engine's tokens differ from the reference streaming policy's"
    n = len(prompt) + len(got)
    return (f"plugged into the engine: {n} tokens (max_model_len {llm.engine.config.max_model_len}) with at most "
            f"{max(used)} blocks of {BS} in use, {bm.num_evicted} blocks freed; the same tokens as StreamingLLM's")


@checker(signature="positions, n_ctx, sinks, window")
def check_window_mask(fn):
    """fn(positions (T,) int64 cache indices of the queries, n_ctx, sinks, window) -> (T, n_ctx) bool: query p sees
    key j iff j <= p and (j < sinks or p - j < window): StreamingLLM's rule, as the engine's attention applies it."""
    import torch
    for T, n_ctx, sinks, window in ((1, 40, 4, 8), (5, 40, 4, 8), (3, 12, 0, 5), (4, 30, 6, 6), (2, 9, 2, 20)):
        p = torch.arange(n_ctx - T, n_ctx)                                          # (T,) the newest queries
        j = torch.arange(n_ctx)                                                     # (S,)
        want = (j[None] <= p[:, None]) & ((j[None] < sinks) | (p[:, None] - j[None] < window))   # (T, S)
        got = fn(p.clone(), n_ctx, sinks, window)
        case = f"(queries at {p.tolist()}, {n_ctx} keys, sinks={sinks}, window={window})"
        shape = tuple(getattr(got, "shape", ()))
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, \
            f"returned {type(got).__name__} {shape}, want a tensor of shape {tuple(want.shape)}"
        got = got.bool()
        if torch.equal(got, want):
            continue
        t, s = [int(v) for v in (got != want).nonzero()[0]]
        q = int(p[t])
        assert not (got[t, s] and s > q), f"query {q} sees key {s} after it: the causal rule j <= p is missing {case}"
        assert not (got[t, s] and q - s == window), \
            f"query {q} sees key {s}, {window} back: the window holds {window} tokens, the query included {case}"
        assert not (not got[t, s] and s < sinks), f"query {q} does not see sink {s}: keys j < sinks stay {case}"
        assert False, f"query {q}, key {s}: got {bool(got[t, s])}, want {bool(want[t, s])} {case}"
    return "each query sees the sinks and its window of recent tokens, itself included, and nothing after it"
