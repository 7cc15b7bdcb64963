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


# ---------------------------------------------------------------- core: the reader's block manager in the engine
# Fixed schedules run on the hash model (minillm.labs.hashmodel): its next token hashes the token ids it reads back
# from the KV pool, so a paging bug changes what it emits. Sampled (2 tokens allowed per step, seeded), so the
# n > 1 samples of a prompt diverge and write different K/V into the blocks they share.
_SHARED = list(range(10, 60))                        # a common prefix (the prefix-caching schedule)


def _prompt(n: int, shared: int = 0, salt: int = 0) -> list[int]:
    """BOS, `shared` tokens of the common prefix, then tokens of its own (n in all)."""
    return [1] + _SHARED[:shared] + [100 + (7 * salt + i) % 150 for i in range(n - 1 - shared)]


# (name, engine options, requests); a request is (prompt, max_tokens, arrival step, n)
SCHEDULES = [
    ("n > 1 samples (fork, copy-on-write)", dict(block_size=4, pool_tokens=256),
     [(_prompt(6, salt=1), 9, 0, 3), (_prompt(7, salt=2), 6, 1, 2), (_prompt(8, salt=3), 5, 2, 1)]),
    ("prefix caching", dict(block_size=4, pool_tokens=80, enable_prefix_caching=True),
     [(_prompt(14, 12, 1), 4, 0, 1), (_prompt(17, 12, 2), 5, 3, 2), (_prompt(13, 12, 3), 3, 6, 1),
      (_prompt(22, 20, 4), 4, 9, 1), (_prompt(21, 20, 5), 3, 12, 1)]),
    ("preemption in a small pool (recompute)", dict(block_size=2, pool_tokens=40),
     [(_prompt(9, salt=1), 16, 0, 2), (_prompt(5, salt=2), 14, 0, 1), (_prompt(11, salt=3), 12, 1, 2)]),
    ("preemption in a small pool (swap)", dict(block_size=2, pool_tokens=40, preemption_mode="swap", swap_tokens=64),
     [(_prompt(9, salt=4), 16, 0, 2), (_prompt(5, salt=5), 14, 0, 1), (_prompt(11, salt=6), 12, 1, 1)]),
]


def _random_schedules(count: int, seed: int = 6) -> list:
    """More schedules of the same kinds, drawn once from a fixed seed (the same every run)."""
    import random
    rng, out = random.Random(seed), []
    for j in range(count):
        bs, caching, mode = rng.choice([1, 2, 4]), rng.random() < 0.5, rng.choice(["recompute", "swap"])
        reqs = [(_prompt(rng.randint(2, 16), rng.choice([0, 0, 8]), rng.randint(0, 99)), rng.randint(1, 14),
                 rng.randint(0, 6), rng.choice([1, 1, 2, 3])) for _ in range(rng.randint(2, 5))]
        opts = dict(block_size=bs, pool_tokens=rng.choice([32, 48, 96]), enable_prefix_caching=caching,
                    preemption_mode=mode, swap_tokens=64 if mode == "swap" else 0)
        out.append((f"seeded {j}: block_size {bs}, {opts['pool_tokens']}-token pool, prefix caching "
                    f"{'on' if caching else 'off'}, {mode}", opts, reqs))
    return out


SCHEDULES += _random_schedules(6)


def _probe_allocate(cls):
    """allocate alone: a sequence of n tokens holds ceil(n / block_size) blocks, never one more or one fewer."""
    from ..core.sampling import SamplingParams
    from ..core.sequence import Sequence
    bm, bs = cls(16, 4), 4
    seq = Sequence(0, "0", 0, [1] * 9, SamplingParams(), 0, 0.0)
    for n in (1, 3, 4, 5, 8, 9):                          # grows one table: it must count the blocks already held
        bm.allocate(seq, n)
        got, want = len(seq.block_table), -(-n // bs)
        assert got <= want, (f"allocate(seq, {n}) with block_size {bs} left {got} blocks in the table; {n} token(s) "
                             f"need {want} (ceil(n / block_size)): a new block is taken one token early")
        assert got >= want, (f"allocate(seq, {n}) with block_size {bs} left {got} blocks in the table; {n} token(s) "
                             f"need {want} (ceil(n / block_size)): a new block is taken one token late")


def _holders(sched) -> dict:
    """block -> ids of the live sequences whose block table holds it (once per occurrence)."""
    found = {}
    for s in sched.running + sched.padding:
        for b in s.block_table:
            found.setdefault(b, []).append(s.seq_id)
    return found


def _check_pool(engine, where: str):
    """After a step: the free list, the reference counts and the K/V each running sequence reads back."""
    bm, sched, bs = engine.block_manager, engine.scheduler, engine.block_manager.block_size
    holders, free = _holders(sched), list(bm.free)
    for b in free + list(bm.evictable):
        assert b not in holders, (f"{where}: block {b} is free while sequence(s) {holders.get(b)} still hold it: "
                                  f"a block freed while a fork still references it (free_seq must decrement "
                                  f"ref_count and free a block only when it reaches 0)")
    twice = sorted({b for b in free if free.count(b) > 1})
    assert not twice, (f"{where}: block(s) {twice} are on the free list twice: each sample sharing a block freed it "
                       f"(free_seq must decrement ref_count and free a block only when it reaches 0)")
    for b in free:
        assert bm.block_hash[b] is None, (f"{where}: block {b} holds a cached prefix (block_hash set) but went to "
                                          f"the free list: a freed block with a prefix hash goes to self.evictable")
    for b in range(bm.num_blocks):
        n, r = len(holders.get(b, [])), bm.ref_count[b]
        assert r >= n, (f"{where}: block {b} is in {n} block tables but its ref_count is {r}: fork must add a "
                        f"reference to every block it shares (self._ref(b))")
        assert r == n, (f"{where}: block {b} has ref_count {r} but {n} block table(s) hold it: a reference was "
                        f"never dropped (free_seq, or the shared block's count when copy-on-write replaces it)")
    kv = engine.kv.k[0, :, :, 0, :].tolist()              # (num_blocks, block_size, 2): (token id, position)
    for s in sched.running:
        ids = s.token_ids
        assert len(s.block_table) * bs >= s.num_computed, (f"{where}: sequence {s.seq_id} holds {len(s.block_table)} "
                                                           f"blocks for its {s.num_computed} computed tokens")
        for p in range(s.num_computed):
            b = s.block_table[p // bs]
            tok, pos = kv[b][p % bs]
            if (tok, pos) == (ids[p], p):
                continue
            others = [i for i in holders[b] if i != s.seq_id]
            assert not others, (f"{where}: sequence {s.seq_id} reads another sample's token at position {p}: block "
                                f"{b} is shared with sequence(s) {others} and was written without copy-on-write "
                                f"(prepare_write must copy a block with ref_count > 1 before it is written)")
            raise AssertionError(f"{where}: sequence {s.seq_id} reads token {tok:.0f} (position {pos:.0f}) at position "
                                 f"{p} from block {b}, not its own token {ids[p]}")
    for b in range(bm.num_blocks):
        named = bm.block_tokens[b]
        if named is not None:
            held = [int(t) for t, _ in kv[b]]
            assert held == list(named), (f"{where}: block {b} is named in the prefix cache but holds other tokens: "
                                         f"it was handed out while still cached (only _take_block may evict it)")


def _run_schedule(cls, name: str, opts: dict, reqs: list):
    """One schedule through an engine whose block manager is cls; the pool is checked after every step."""
    from ..config import EngineConfig
    from ..core.sampling import SamplingParams
    from ..engine.engine import LLMEngine
    from .hashmodel import HashModel, IdTokenizer, allowed
    model = HashModel(choices=2)
    per_token = model.config.kv_bytes_per_token(8)
    opts = dict(opts)
    swap_tokens = opts.pop("swap_tokens", 0)
    cfg = EngineConfig(dtype="float64", max_model_len=32, max_num_seqs=4, kv_cache_bytes=opts.pop("pool_tokens")
                       * per_token, swap_bytes=swap_tokens * per_token, **opts)
    engine = LLMEngine.from_model(model, IdTokenizer(), cfg, block_manager=cls)
    pending, asked, outs, step = sorted(enumerate(reqs), key=lambda r: r[1][2]), {}, {}, 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][1][2] <= step:
            i, (prompt, max_tokens, _, n) = pending.pop(0)
            sp = SamplingParams(n=n, temperature=1.0, seed=i, max_tokens=max_tokens, ignore_eos=True)
            asked[engine.add_request(prompt, sp)] = (prompt, max_tokens)
        where = f"schedule '{name}', step {step}"
        try:
            engine.step()
        except NotImplementedError:
            raise
        except Exception as e:
            _check_pool(engine, where)                    # a named mistake, if the pool shows one
            raise AssertionError(f"{where}: the engine raised {type(e).__name__}: {e}") from None
        _check_pool(engine, where)
        outs.update((o.request_id, o) for o in engine.pop_finished())
        step += 1
        assert step < 400, f"schedule '{name}': no progress after {step} steps"
    for rid, (prompt, max_tokens) in asked.items():
        for c in outs[rid].outputs:
            ids = list(prompt)
            assert len(c.token_ids) == max_tokens, \
                f"schedule '{name}': request {rid} sample {c.index} has {len(c.token_ids)} tokens, not {max_tokens}"
            for t in c.token_ids:
                assert t in allowed(ids, 2), (f"schedule '{name}': request {rid} sample {c.index}: token {t} at "
                                              f"position {len(ids)} is not what its own tokens lead to")
                ids.append(t)
    bm = engine.block_manager
    kept = [b for b in range(bm.num_blocks) if bm.ref_count[b] > 0]
    lost = [b for b in range(bm.num_blocks) if not bm.ref_count[b] and b not in bm.free and b not in bm.evictable]
    assert not kept, (f"schedule '{name}': after every request finished, blocks {kept[:8]} still have a reference: "
                      f"leaking blocks (the pool is not full again)")
    assert not lost, (f"schedule '{name}': after every request finished, blocks {lost[:8]} have no reference but are "
                      f"neither free nor evictable: leaking blocks (the pool is not full again)")
    assert bm.num_free == bm.num_blocks, f"schedule '{name}': {bm.num_free} of {bm.num_blocks} blocks free at the end"


@checker(kind="core", allow=("minillm.core.block_manager.BlockManager",))
def check_block_manager(cls):
    """cls: a BlockManager subclass with allocate, prepare_write, fork and free_seq of its own. Plugged into the
    engine (block_manager=cls) and run on fixed seeded schedules of the hash model: n > 1 samples that fork and
    copy on write, prefix caching, preemption (recompute and swap) in a small pool."""
    from ..core.block_manager import BlockManager
    assert isinstance(cls, type) and issubclass(cls, BlockManager), \
        f"expected a subclass of minillm.core.block_manager.BlockManager, got {cls!r:.80}"
    _probe_allocate(cls)
    for name, opts, reqs in SCHEDULES:
        _run_schedule(cls, name, opts, reqs)
    return (f"{len(SCHEDULES)} seeded schedules on the hash model (n > 1 samples with copy-on-write, prefix caching, "
            f"preemption by recompute and by swap in small pools): every sample read back its own K/V, reference "
            f"counts matched the block tables, and the pool was full again at the end")
