"""The block manager alone (no model): ownership, copy-on-write, prefix caching, swap, and invariants."""
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.core.block_manager import BlockManager
from minillm.core.sampling import SamplingParams
from minillm.core.sequence import Sequence

_ids = iter(range(10**9))


def seq(tokens):
    return Sequence(next(_ids), "r", 0, list(tokens), SamplingParams(), 0, 0.0)


def test_allocate_and_free_return_every_block():
    bm = BlockManager(8, 4)
    a, b = seq(range(9)), seq(range(3))
    bm.allocate_prompt(a), bm.allocate_prompt(b)
    assert len(a.block_table) == 3 and len(b.block_table) == 1 and bm.num_free == 4
    bm.check([a, b])
    bm.free_seq(a), bm.free_seq(b)
    assert bm.num_free == 8 and bm.ref_count == [0] * 8
    bm.check([])


def test_fork_shares_then_copy_on_write_splits():
    bm = BlockManager(8, 4)
    parent = seq(range(6))                   # blocks: [0..3] full, [4, 5] partial
    bm.allocate_prompt(parent)
    parent.num_computed = 6
    child = seq(range(6))
    bm.fork(parent, child)
    assert child.block_table == parent.block_table and bm.ref_count[parent.block_table[1]] == 2
    child.output_ids.append(99)              # the child writes position 6, in the shared partial block
    copies = bm.prepare_write(child, 6, 7)
    assert copies == [(parent.block_table[1], child.block_table[1])] and child.block_table[0] == parent.block_table[0]
    assert bm.ref_count[parent.block_table[1]] == 1 and bm.ref_count[child.block_table[1]] == 1
    assert bm.prepare_write(child, 7, 8) == []  # now private: no second copy
    bm.check([parent, child])


def test_prefix_cache_reuses_full_blocks_and_evicts_lru():
    bm = BlockManager(6, 4, enable_prefix_caching=True)
    a = seq(list(range(10)))                 # 2 full blocks + 2 tokens
    assert bm.allocate_prompt(a) == 0
    a.num_computed = 10
    bm.mark_computed(a)
    shared = a.block_table[:2]
    b = seq(list(range(8)) + [50, 51, 52])   # same first 8 tokens
    assert bm.allocate_prompt(b) == 8 and b.block_table[:2] == shared and b.num_computed == 8
    bm.check([a, b])
    bm.free_seq(a), bm.free_seq(b)
    assert bm.num_cached == 2 and bm.num_free == 6  # cached blocks count as free: they can be evicted
    c = seq(list(range(8)) + [7])            # a hit after everyone left
    assert bm.allocate_prompt(c) == 8
    bm.free_seq(c)
    d = seq([9] * 24)                        # needs all 6 blocks: evicts the cached ones
    assert bm.allocate_prompt(d) == 0 and bm.num_cached == 0 and not bm.cached
    bm.check([d])


def test_whole_prompt_cached_still_computes_its_last_token():
    bm = BlockManager(6, 4, enable_prefix_caching=True)
    a = seq(range(8))
    bm.allocate_prompt(a)
    a.num_computed = 8
    bm.mark_computed(a)
    b = seq(range(8))
    assert bm.allocate_prompt(b) == 4        # block 2 holds the last token: recomputed, not shared
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_swap_out_and_in():
    bm = BlockManager(4, 4, swap_blocks=3)
    a = seq(range(10))
    bm.allocate_prompt(a)
    a.num_computed = 10
    out = bm.swap_out(a)
    assert len(out) == 3 and bm.num_free == 4 and a.block_table == [] and a.num_computed == 10
    bm.check([a])
    back = bm.swap_in(a)
    assert [s for s, _ in back] == [s for _, s in out] and len(a.block_table) == 3
    bm.check([a])


@settings(deadline=None, derandomize=True, max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["new", "grow", "fork", "free", "swap"]), st.integers(0, 30)), max_size=60),
       st.booleans(), st.sampled_from([1, 2, 4, 16]))
def test_random_operations_keep_every_invariant(ops, caching, block_size):
    bm = BlockManager(24, block_size, enable_prefix_caching=caching, swap_blocks=12)
    live, swapped = [], []
    for op, x in ops:
        if op == "new":
            s = seq([x % 5] * (x % 13 + 1))  # few distinct prefixes, so cache hits happen
            if bm.blocks_needed(s, len(s)) <= bm.num_free:
                bm.allocate_prompt(s)
                s.num_computed = len(s)
                bm.mark_computed(s)
                live.append(s)
        elif op == "grow" and live:
            s = live[x % len(live)]
            if bm.blocks_needed(s, len(s) + 1) + 1 <= bm.num_free:
                s.output_ids.append(x)
                bm.prepare_write(s, len(s) - 1, len(s))
                s.num_computed = len(s)
                bm.mark_computed(s)
        elif op == "fork" and live:
            p = live[x % len(live)]
            c = seq(p.token_ids)
            bm.fork(p, c)
            live.append(c)
        elif op == "free" and live:
            bm.free_seq(live.pop(x % len(live)))
        elif op == "swap":
            if swapped and bm.can_swap_in(swapped[0]):
                s = swapped.pop(0)
                bm.swap_in(s)
                live.append(s)
            elif live and bm.can_swap_out(live[x % len(live)]):
                s = live.pop(x % len(live))
                bm.swap_out(s)
                swapped.append(s)
        bm.check(live + swapped)
    for s in live:
        bm.free_seq(s)
    for s in swapped:
        bm.swap_in(s)
        bm.free_seq(s)
    bm.check([])
    assert bm.num_free == 24 and sum(bm.ref_count) == 0 and len(bm.swap_free) == 12


def test_kv_copy_and_swap_move_the_data():
    import torch

    from minillm.config import ModelConfig
    from minillm.llama.kv_cache import KVCache, SwapSpace
    kv = KVCache(ModelConfig.from_name("tiny"), num_blocks=4, block_size=2)
    kv.k.normal_(), kv.v.normal_()
    before = kv.k[:, 1].clone()
    kv.copy_blocks([(1, 3)])
    assert torch.equal(kv.k[:, 3], before) and torch.equal(kv.v[:, 3], kv.v[:, 1])
    sw = SwapSpace(kv, 2)
    sw.swap_out(kv, [(1, 0)])
    kv.k[:, 1] = 0
    sw.swap_in(kv, [(0, 2)])
    assert torch.equal(kv.k[:, 2], before)


def test_a_block_name_depends_on_its_parent_and_is_a_cryptographic_hash():
    """Equal tokens after different prefixes are different blocks: a prompt [A, X] must not hit the cached [B, X]
    (a hash of the block's own tokens alone would serve another prefix's K/V). SHA-256 of the chain, as vLLM
    (CVE-2025-25183: Python's hash() collides on purpose-built inputs)."""
    h = BlockManager.chain_hash
    assert h(None, [1, 2]) == h(None, [1, 2]) and h(h(None, [1, 2]), [3, 4]) != h(h(None, [5, 6]), [3, 4])
    assert isinstance(h(None, [1]), bytes) and len(h(None, [1])) == 32
    bm = BlockManager(8, 2, enable_prefix_caching=True)
    first = seq([7, 8, 3, 4, 9])
    bm.allocate_prompt(first)
    first.num_computed = 5
    bm.mark_computed(first)
    other = seq([5, 6, 3, 4, 9])                  # second block equal, first not
    assert bm.allocate_prompt(other) == 0 and set(other.block_table).isdisjoint(first.block_table)
    same = seq([7, 8, 3, 4, 1])
    assert bm.allocate_prompt(same) == 4          # both full blocks hit
