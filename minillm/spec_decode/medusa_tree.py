"""Medusa's candidate tree: the heads' top guesses as paths of ranks (DEFAULT_CHOICES), built into nodes with
parents, depths (a node at depth d sits at RoPE position base + d) and a tree attention mask (each node sees only
its ancestors), and the greedy walk that keeps the longest path the target agrees with."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.batch import Draft


# ---------------------------------------------------------------------------- the candidate tree
@dataclass
class MedusaTree:
    tokens: list[int]        # (N,) node 0 is the root: the token the target just produced; nodes 1.. are candidates
    parents: list[int]       # (N,) parent node index, -1 for the root
    depths: list[int]        # (N,) 0 for the root; a node at depth d sits at position base + d (its RoPE position)
    mask: torch.Tensor       # (N, N) bool: mask[i, j] = node j is node i or one of its ancestors (tree attention)
    ranks: list[tuple]       # (N,) the path of top-k ranks that made each node, () for the root

    @property
    def draft(self) -> Draft:
        """The candidates (the root excluded) as the engine verifies them."""
        return _draft(self.tokens, self.parents)


# A path of top-k ranks per node: (0, 1) = head 0's best token, then head 1's second best after it.
# 14 candidates + the root. Measured for the shipped heads (32 val windows): head 0's rank-0..5 tokens
# are the target's greedy next-next token 24%, 8%, 5%, 4%, 3%, 2% of the time, head 1's rank 0 17%,
# head 2's 15%: the tree is widest at depth 1 and keeps a few paths down to depth 3 for the deeper heads.
DEFAULT_CHOICES: list[tuple[int, ...]] = [
    (0,), (1,), (2,), (3,), (4,), (5,),
    (0, 0), (0, 1), (1, 0), (0, 2), (2, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0),
]


def _check_choices(choices, num_heads: int, vocab_size: int) -> list[tuple[int, ...]]:
    seen: set[tuple[int, ...]] = set()
    out = []
    for c in choices:
        c = tuple(c)
        if not c or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < vocab_size for r in c):
            raise ValueError(f"tree choice {c!r} must be a non-empty path of ranks in [0, {vocab_size})")
        if len(c) > num_heads:
            raise ValueError(f"tree choice {c!r} is {len(c)} deep but there are only {num_heads} heads")
        if c in seen:
            raise ValueError(f"tree choice {c!r} appears twice")
        missing = [c[:i] for i in range(1, len(c)) if c[:i] not in seen]
        if missing:
            raise ValueError(f"tree choice {c!r} needs its prefix {missing[0]!r} to be a choice listed before it")
        seen.add(c)
        out.append(c)
    return out


def build_tree(root_token: int, head_logits: torch.Tensor, choices=DEFAULT_CHOICES) -> MedusaTree:
    """head_logits (K, V): the heads at the root's position, one sequence. One node per choice, in order;
    the node for choice c holds the c[-1]-th best token of head len(c) - 1, and its parent is c[:-1]."""
    K, V = head_logits.shape
    choices = _check_choices(choices, K, V)
    width = max((c[-1] for c in choices), default=0) + 1
    top = torch.topk(head_logits, min(width, V), dim=-1).indices.tolist()  # (K, width): best tokens first
    index = {(): 0}
    tokens, parents, depths, ranks = [int(root_token)], [-1], [0], [()]
    for c in choices:
        index[c] = len(tokens)
        tokens.append(top[len(c) - 1][c[-1]])
        parents.append(index[c[:-1]])
        depths.append(len(c))
        ranks.append(c)
    N = len(tokens)
    mask = torch.zeros(N, N, dtype=torch.bool)                         # (N, N)
    mask[:, 0] = True                                                  # the root is every node's ancestor
    mask[1:, 1:] = _draft(tokens, parents).mask()                      # the candidates' own tree (core.batch.Draft)
    return MedusaTree(tokens, parents, depths, mask, ranks)


def _draft(tokens: list, parents: list) -> Draft:
    """The candidates without the root, as the engine's Draft (their parent -1: the row's newest token)."""
    return Draft(tokens[1:], None, [p - 1 for p in parents[1:]])


def greedy_accept(tree: MedusaTree, target_next: list[int]) -> list[int]:
    """target_next[i]: the target's argmax at node i. Walk down from the root, each time into the child
    whose token is what the target predicted at the current node. -> accepted node indices (root excluded).
    The engine emits tree.tokens[path] + [target_next[path[-1] if path else 0]]."""
    if len(target_next) != len(tree.tokens):
        raise ValueError(f"target_next has {len(target_next)} entries, the tree has {len(tree.tokens)} nodes")
    children: list[list[int]] = [[] for _ in tree.tokens]
    for i, p in enumerate(tree.parents):
        if p >= 0:
            children[p].append(i)
    path, node = [], 0
    while True:
        nxt = next((c for c in children[node] if tree.tokens[c] == target_next[node]), None)
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt
