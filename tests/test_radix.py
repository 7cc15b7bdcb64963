"""The radix tree of cached prefixes (minillm.scheduling.radix, SGLang's RadixAttention) against brute force: match is
the longest common prefix with anything stored, insert stores shared prefixes once, eviction drops the least
recently used leaves and never what was just inserted, and the size count is the sum of the edges."""
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.scheduling.radix import RadixTree

seqs = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=12)


def lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def edge_tokens(tree) -> int:
    return sum(len(t) for *_, t in tree.edges())


@settings(deadline=None, derandomize=True, max_examples=300)
@given(stored=seqs, queries=seqs)
def test_match_is_the_longest_common_prefix_with_anything_stored(stored, queries):
    tree = RadixTree()
    for s in stored:
        tree.insert(s)
    for q in queries + stored:
        assert tree.match(q) == max(lcp(q, s) for s in stored)
    # shared prefixes are stored once: the size is the number of distinct non-empty prefixes
    assert tree.size == len({tuple(s[:i]) for s in stored for i in range(1, len(s) + 1)}) == edge_tokens(tree)
    maximal = {tuple(s) for s in stored if not any(len(o) > len(s) and o[:len(s)] == s for o in stored)}
    assert set(tree.sequences()) == maximal


@settings(deadline=None, derandomize=True, max_examples=300)
@given(stored=seqs, capacity=st.integers(1, 30), queries=seqs)
def test_eviction_keeps_the_capacity_and_only_stored_prefixes(stored, capacity, queries):
    tree = RadixTree(capacity)
    for s in stored:
        added = tree.insert(s)
        assert added >= 0 and tree.size == edge_tokens(tree)
        assert tree.size <= max(capacity, len(s))            # only the path just inserted may exceed it
        assert tree.match(s) == len(s)                       # never evicted right after its insert
    for q in queries:                                        # whatever is left is a prefix of something inserted
        assert tree.match(q) <= max(lcp(q, s) for s in stored)
    for path in tree.sequences():
        assert any(list(path) == s[:len(path)] for s in stored)


def test_eviction_drops_the_least_recently_used_leaf_first():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    tree.insert([1, 2, 5, 6])
    tree.insert([7, 8])
    tree.match([1, 2, 3])                 # [3, 4] is now the most recent leaf, [5, 6] the least
    assert tree.evict(2) == 2
    assert sorted(tree.sequences()) == [(1, 2, 3, 4), (7, 8)] and tree.size == 6
    assert sorted(t for *_, t in tree.edges()) == [(1, 2, 3, 4), (7, 8)]   # [1, 2] merged back with its only child
    assert tree.evict(1) == 2 and tree.sequences() == [(1, 2, 3, 4)]       # a whole leaf run at a time: [7, 8]


def test_a_split_edge_keeps_both_branches():
    tree = RadixTree()
    assert tree.insert([1, 2, 3, 4]) == 4
    assert tree.insert([1, 2, 9]) == 1                     # splits [1, 2, 3, 4] at 2
    assert sorted(tree.sequences()) == [(1, 2, 3, 4), (1, 2, 9)]
    assert tree.insert([1, 2]) == 0 and tree.size == 5
    assert sorted(t for *_, t in tree.edges()) == [(1, 2), (3, 4), (9,)]
