"""A radix tree of cached prefixes (SGLang's RadixAttention, Zheng et al. 2024): the prefix cache as a tree whose
edges are runs of token ids, so any two cached sequences share the path of their longest common prefix.

minillm's prefix cache proper is the block manager's (minillm.core.block_manager): a full block is named by a
hash chaining its parent's, so a prompt reuses whole leading blocks only, and a prefix shorter than a block, or
the partial block at its end, is never found. A radix tree matches at token granularity, and answers "how much
of this prompt is cached?" in one walk, without hashing. That answer is what SGLang's cache-aware scheduling
order ranks waiting requests by (longest prefix match first: minillm.scheduling.orders.LongestPrefix). Here the tree
is that order's model of the cache, sized like the KV pool and evicted least-recently-used, leaf first, as
SGLang evicts; minillm.bench.sched compares the two structures' hit rates on one multi-turn chat trace.

    tree = RadixTree(capacity=4096)          # tokens
    tree.insert([1, 5, 6, 7])                # -> tokens newly stored
    tree.match([1, 5, 6, 9])                 # -> 3, the longest cached prefix
    tree.evict(2)                            # -> tokens dropped (least recently used leaves first)
"""
from __future__ import annotations

from typing import Optional


class Node:
    """One edge's run of tokens (the path from the root spells a cached prefix) and its children by first token."""
    __slots__ = ("tokens", "children", "parent", "last_use")

    def __init__(self, tokens: tuple, parent: Optional["Node"], last_use: int):
        self.tokens = tokens                      # the run of token ids on the edge into this node
        self.children: dict[int, Node] = {}       # first token of a child's run -> child
        self.parent = parent
        self.last_use = last_use                  # the tree's clock at the last match or insert through it

    def __repr__(self):
        return f"Node({list(self.tokens)[:8]}{'...' if len(self.tokens) > 8 else ''}, {len(self.children)} children)"


def _common(a: tuple, b, start: int) -> int:
    """Length of the common prefix of run a and b[start:]."""
    n = min(len(a), len(b) - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


class RadixTree:
    """Token runs in a tree; capacity in tokens (None: unbounded). Insert evicts least-recently-used leaves when
    the tree would outgrow its capacity."""

    def __init__(self, capacity: Optional[int] = None):
        self.root = Node((), None, 0)
        self.capacity = capacity
        self.size = 0                             # tokens stored (the sum of every edge's run)
        self.clock = 0                            # advances at every match and insert (LRU order)

    # ------------------------------------------------------------------ lookups
    def match(self, tokens) -> int:
        """Length of the longest prefix of tokens stored in the tree; touches the path (LRU)."""
        self.clock += 1
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = _common(child.tokens, tokens, i)
            child.last_use = self.clock
            i += k
            if k < len(child.tokens):
                break
            node = child
        return i

    def insert(self, tokens) -> int:
        """Store tokens (a path from the root); -> how many tokens were new. An edge that diverges part way is
        split in two, so shared prefixes are stored once."""
        tokens = tuple(tokens)
        self.clock += 1
        node, i, added = self.root, 0, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:                     # a new leaf holds the rest
                node.children[tokens[i]] = node = Node(tokens[i:], node, self.clock)
                added = len(tokens) - i
                break
            k = _common(child.tokens, tokens, i)
            if k < len(child.tokens):             # split: child becomes a node for the shared part + the rest
                mid = Node(child.tokens[:k], node, self.clock)
                node.children[tokens[i]] = mid
                child.tokens, child.parent = child.tokens[k:], mid
                mid.children[child.tokens[0]] = child
                child = mid
            child.last_use = self.clock
            node, i = child, i + k
        self.size += added
        if self.capacity is not None and self.size > self.capacity:
            self.evict(self.size - self.capacity, protect=node)
        return added

    # ------------------------------------------------------------------ eviction
    def leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if not n.children and n is not self.root:
                out.append(n)
            stack.extend(n.children.values())
        return out

    def evict(self, num_tokens: int, protect: Optional[Node] = None) -> int:
        """Drop at least num_tokens tokens, least recently used leaf first (a whole leaf run at a time, as SGLang
        does); protect: a node whose path must stay (the one just inserted). -> tokens dropped."""
        keep = set()
        while protect is not None:
            keep.add(id(protect))
            protect = protect.parent
        dropped = 0
        while dropped < num_tokens:
            leaves = [n for n in self.leaves() if id(n) not in keep]
            if not leaves:
                break
            leaf = min(leaves, key=lambda n: n.last_use)
            del leaf.parent.children[leaf.tokens[0]]
            dropped += len(leaf.tokens)
            parent = leaf.parent
            if parent is not self.root and len(parent.children) == 1 and id(parent) not in keep:
                (only,) = parent.children.values()            # a node with one child merges with it
                only.tokens, only.parent = parent.tokens + only.tokens, parent.parent
                only.last_use = max(only.last_use, parent.last_use)
                parent.parent.children[only.tokens[0]] = only
        self.size -= dropped
        return dropped

    # ------------------------------------------------------------------ for drawing and tests
    def sequences(self) -> list[tuple]:
        """Every root-to-leaf path, as token tuples (what the tree stores)."""
        out = []

        def walk(node, prefix):
            if not node.children and node is not self.root:
                out.append(prefix)
            for child in node.children.values():
                walk(child, prefix + child.tokens)
        walk(self.root, ())
        return out

    def edges(self) -> list[tuple]:
        """(depth in tokens at the edge's start, parent id, child id, tokens) per edge, depth first: plain data for
        minillm.viz's tree drawing."""
        out, stack = [], [(self.root, 0)]
        while stack:
            node, depth = stack.pop()
            for child in sorted(node.children.values(), key=lambda n: n.tokens[0], reverse=True):
                out.append((depth, id(node), id(child), child.tokens))
                stack.append((child, depth + len(child.tokens)))
        return out

    def __len__(self) -> int:
        return self.size
