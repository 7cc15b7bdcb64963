"""Regex AST -> a DFA over UTF-8 BYTES: Thompson's NFA (Thompson 1968), then the subset construction (Rabin &
Scott 1959), dead states trimmed, then minimised by partition refinement (Moore 1956). Bytes, not characters,
because tokens are byte strings: a token may end in the middle of a multi-byte character (byte-fallback tokens
<0xE2> ...), and the token masks walk each token's bytes through this DFA (minillm.guided.token_index).

A character class becomes UTF-8 byte-range sequences (utf8_sequences: the split RE2 and Rust's regex-syntax use),
so the DFA accepts exactly the UTF-8 encodings of the strings the pattern matches: every accepted byte string
decodes, and the engine's text (minillm.core.detokenizer decodes the output's bytes) is the matched string.

    dfa.trans (S, 256) int32: the next state on each byte, -1 = no way on (dead);  dfa.accepting (S,) bool;
    state 0 is the start, states are numbered in breadth-first order from it.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from .budget import MAX_DFA_STATES, NO_BUDGET, CompileBudget
from .regex import Alt, Chars, Concat, RegexError, Repeat, parse

MAX_NFA_STATES = 200_000


# ---------------------------------------------------------------------------- code points -> UTF-8 byte ranges
def utf8_sequences(lo: int, hi: int) -> list:
    """The code points lo..hi (surrogates left out) as UTF-8: a list of byte-range sequences [(b_lo, b_hi), ...]
    whose concatenated cross products are exactly their encodings. Split first by encoded length, then until
    every continuation byte spans a whole 6-bit block or the range shares a prefix (RE2 / regex-syntax utf8.rs)."""
    if lo > hi:
        return []
    if lo <= 0xDFFF and hi >= 0xD800:                  # surrogates have no UTF-8 encoding
        return utf8_sequences(lo, min(hi, 0xD7FF)) + utf8_sequences(max(lo, 0xE000), hi)
    for top in (0x7F, 0x7FF, 0xFFFF):                  # 1, 2, 3, 4 bytes
        if lo <= top < hi:
            return utf8_sequences(lo, top) + utf8_sequences(top + 1, hi)
    if hi <= 0x7F:
        return [[(lo, hi)]]
    n = len(chr(lo).encode())
    for i in range(1, n):
        m = (1 << (6 * i)) - 1                         # the low i continuation bytes
        if lo & ~m != hi & ~m:
            if lo & m:
                return utf8_sequences(lo, lo | m) + utf8_sequences((lo | m) + 1, hi)
            if hi & m != m:
                return utf8_sequences(lo, (hi & ~m) - 1) + utf8_sequences(hi & ~m, hi)
    return [list(zip(chr(lo).encode(), chr(hi).encode()))]


# ---------------------------------------------------------------------------- Thompson's NFA
class _NFA:
    def __init__(self):
        self.eps: list[list[int]] = []                 # per state: epsilon targets
        self.edges: list[list[tuple]] = []             # per state: (byte lo, byte hi, target)

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise RegexError(f"guided_regex: pattern too large (its NFA passes {MAX_NFA_STATES} states: "
                             "a large counted repeat {n,m} or a big class repeated many times)")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node) -> tuple[int, int]:
        """A fragment for node: (entry state, exit state)."""
        s, e = self.new(), self.new()
        if isinstance(node, Chars):
            for lo, hi in node.ranges:
                for seq in utf8_sequences(lo, hi):
                    at = s
                    for j, (blo, bhi) in enumerate(seq):
                        nxt = e if j == len(seq) - 1 else self.new()
                        self.edges[at].append((blo, bhi, nxt))
                        at = nxt
        elif isinstance(node, Concat):
            at = s
            for part in node.parts:
                ps, pe = self.build(part)
                self.eps[at].append(ps)
                at = pe
            self.eps[at].append(e)
        elif isinstance(node, Alt):
            for opt in node.options:
                os_, oe = self.build(opt)
                self.eps[s].append(os_)
                self.eps[oe].append(e)
        elif isinstance(node, Repeat):
            at = s
            for _ in range(node.lo):                   # the required copies
                ps, pe = self.build(node.item)
                self.eps[at].append(ps)
                at = pe
            if node.hi is None:                        # then a star
                ps, pe = self.build(node.item)
                self.eps[at] += [ps, e]
                self.eps[pe] += [ps, e]
            else:                                      # then hi - lo optional copies, each may stop
                for _ in range(node.hi - node.lo):
                    ps, pe = self.build(node.item)
                    self.eps[at] += [ps, e]
                    at = pe
                self.eps[at].append(e)
        else:
            raise TypeError(f"not a regex AST node: {node!r}")
        return s, e

    def closure(self, states) -> frozenset:
        seen, stack = set(states), list(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)


def distances_to_accept(preds: list, accepting: np.ndarray, unreachable: int) -> np.ndarray:
    """(S,) fewest edges from each state to an accepting one (unreachable where none): a breadth-first search
    backwards from the accepting states. preds[t]: the states with an edge into t (bytes here, tokens in
    token_index)."""
    dist = np.where(accepting, 0, unreachable).astype(np.int64)
    queue = deque(np.flatnonzero(accepting).tolist())
    while queue:
        t = queue.popleft()
        for s in preds[t]:
            if dist[s] > dist[t] + 1:
                dist[s] = dist[t] + 1
                queue.append(s)
    return dist


# ---------------------------------------------------------------------------- the DFA
class DFA:
    """trans (S, 256) int32 (-1: dead), accepting (S,) bool, start state 0."""

    def __init__(self, trans: np.ndarray, accepting: np.ndarray):
        self.trans, self.accepting = trans, accepting
        self.start = 0
        self._byte_dist = None

    @property
    def num_states(self) -> int:
        return len(self.accepting)

    def walk(self, state: int, data: bytes) -> int:
        """The state after data from state, or -1."""
        for b in data:
            if state < 0:
                return -1
            state = int(self.trans[state, b])
        return state

    def match(self, data) -> bool:
        """Does the whole of data (bytes or str, as UTF-8) match?"""
        s = self.walk(self.start, data.encode() if isinstance(data, str) else data)
        return s >= 0 and bool(self.accepting[s])

    def edges(self) -> list[tuple]:
        """(from, to, [(byte lo, byte hi), ...]) for every pair of states with a transition: for drawing."""
        out = []
        for s in range(self.num_states):
            runs: dict[int, list] = {}
            for b in range(256):
                t = int(self.trans[s, b])
                if t < 0:
                    continue
                r = runs.setdefault(t, [])
                if r and r[-1][1] == b - 1:
                    r[-1] = (r[-1][0], b)
                else:
                    r.append((b, b))
            out += [(s, t, r) for t, r in runs.items()]
        return out

    def forced(self, state: int, limit: int = 4096) -> bytes:
        """The bytes that must come next from state: followed while the state does not accept and has exactly
        one byte with a way on (SGLang's jump-forward, at the byte level)."""
        out = bytearray()
        while state >= 0 and not self.accepting[state] and len(out) < limit:
            ways = np.flatnonzero(self.trans[state] >= 0)
            if len(ways) != 1:
                break
            out.append(int(ways[0]))
            state = int(self.trans[state, ways[0]])
        return bytes(out)

    def byte_distance(self) -> np.ndarray:
        """(S,) the fewest bytes from each state to an accepting one (computed once)."""
        if self._byte_dist is not None:
            return self._byte_dist
        self._byte_dist = distances_to_accept(_preds(self.trans), self.accepting, np.iinfo(np.int32).max)
        return self._byte_dist

    def sample(self, rng: np.random.Generator, stop: float = 0.3, max_len: int = 64) -> bytes:
        """A random accepted byte string: random bytes, stopping at an accepting state with probability `stop`,
        then the shortest way to acceptance once max_len bytes are out (tests and drawings)."""
        dist, state, out = self.byte_distance(), self.start, bytearray()
        while True:
            ways = np.flatnonzero(self.trans[state] >= 0)
            if self.accepting[state] and (not len(ways) or len(out) >= max_len or rng.random() < stop):
                return bytes(out)
            if len(out) >= max_len:                        # head for the nearest acceptance
                ways = [b for b in ways if dist[self.trans[state, b]] < dist[state]]
            b = int(rng.choice(ways))
            out.append(b)
            state = int(self.trans[state, b])


def compile_dfa(pattern, minimize: bool = True, max_states: int = MAX_DFA_STATES,
                budget: CompileBudget = NO_BUDGET) -> DFA:
    """A pattern (text, or a parsed AST) -> its DFA over UTF-8 bytes. Raises RegexError for an unsupported
    construct, a pattern that matches no string, one whose DFA passes max_states (4x before minimisation: the
    subset construction stops there), or one whose compile passes the budget's time (minillm.guided.budget)."""
    ast = parse(pattern) if isinstance(pattern, str) else pattern
    nfa = _NFA()
    s0, final = nfa.build(ast)
    # byte classes: bytes no edge tells apart behave alike, so the subset construction runs once per class
    cuts = sorted({0, 256} | {b for es in nfa.edges for lo, hi, _ in es for b in (lo, hi + 1)})
    class_of = np.zeros(256, dtype=np.int64)
    for c, (a, b) in enumerate(zip(cuts, cuts[1:])):
        class_of[a:b] = c
    C = len(cuts) - 1
    moves = [[(int(class_of[lo]), int(class_of[hi]), t) for lo, hi, t in es] for es in nfa.edges]
    start = nfa.closure([s0])
    ids, order, rows = {start: 0}, [start], []
    closures: dict[frozenset, frozenset] = {}
    while len(rows) < len(order):
        if len(rows) % 256 == 0:
            budget.check_time(f"building the DFA ({len(rows)} states so far)")
        targets = [set() for _ in range(C)]
        for s in order[len(rows)]:
            for clo, chi, t in moves[s]:
                for c in range(clo, chi + 1):
                    targets[c].add(t)
        row = np.full(C, -1, dtype=np.int32)
        for c, tg in enumerate(targets):
            if not tg:
                continue
            key = frozenset(tg)
            d = closures.get(key)
            if d is None:
                d = closures[key] = nfa.closure(tg)
            if d not in ids:
                if len(order) >= max_states * 4:
                    raise RegexError(f"guided_regex: pattern too large (its DFA passes {max_states * 4} states "
                                     f"before minimisation{_why(max_states)})")
                ids[d] = len(order)
                order.append(d)
            row[c] = ids[d]
        rows.append(row)
    trans = np.stack(rows)[:, class_of].astype(np.int32)            # (S, 256)
    accepting = np.array([final in d for d in order])
    trans, accepting = _trim(trans, accepting)
    if minimize:
        trans, accepting = _minimize(trans, accepting, budget)
    trans, accepting = _bfs_order(trans, accepting)
    if len(accepting) > max_states:
        raise RegexError(f"guided_regex: pattern too large (its DFA has {len(accepting)} states, more than "
                         f"{max_states}{_why(max_states)})")
    return DFA(trans, accepting)


def _why(max_states: int) -> str:
    return "" if max_states == MAX_DFA_STATES else ": the most whose token masks over this vocabulary fit in memory"


def _preds(trans: np.ndarray) -> list:
    """preds[t]: the states with a byte edge into t, each once. trans (S, 256)."""
    S = len(trans)
    src, b = np.nonzero(trans >= 0)
    pairs = np.unique(trans[src, b].astype(np.int64) * S + src)    # (E,) edges, sorted by target
    bounds = np.searchsorted(pairs // S, np.arange(S + 1))
    sources = (pairs % S).tolist()
    return [sources[bounds[t]:bounds[t + 1]] for t in range(S)]


def _trim(trans: np.ndarray, accepting: np.ndarray):
    """Drop the states from which no accepting state can be reached (their transitions become -1): one search
    backwards from the accepting states."""
    alive = distances_to_accept(_preds(trans), accepting, -1 + 2**62) < 2**62 - 1
    if not alive[0]:
        raise RegexError("guided_regex: the pattern matches no string (an empty class such as [^\\s\\S]?)")
    return _renumber(trans, accepting, np.where(alive, np.cumsum(alive) - 1, -1))


def _renumber(trans: np.ndarray, accepting: np.ndarray, new_id: np.ndarray):
    """Keep the states with new_id >= 0 (several old states may share one new id: their rows agree)."""
    n = int(new_id.max()) + 1
    first = np.full(n, -1)
    for s in range(len(new_id) - 1, -1, -1):
        if new_id[s] >= 0:
            first[new_id[s]] = s
    t = trans[first]                                                 # (n, 256) old targets
    t = np.where(t >= 0, new_id[np.maximum(t, 0)], -1).astype(np.int32)
    return t, accepting[first]


ROW_HASH = np.random.default_rng(0).integers(1, 2**62, size=257, dtype=np.int64) | 1   # odd 64-bit multipliers


def _minimize(trans: np.ndarray, accepting: np.ndarray, budget: CompileBudget = NO_BUDGET):
    """Moore's partition refinement: split blocks by (block, blocks of the 256 successors) until the count of
    blocks stops growing. A round numbers the rows by a 64-bit hash of them (one 1-D unique, where the exact rows
    need a sort of (S, C + 1) rows: a long chain of states takes a round per state); the final partition is then
    checked exactly, and the rounds run again on the exact rows if a collision left it unstable."""
    cols = np.unique(trans, axis=1)                                   # (S, C): bytes no state tells apart, once
    mult = ROW_HASH[:cols.shape[1] + 1]
    for exact in (False, True):
        block, count = accepting.astype(np.int64), len(np.unique(accepting))
        while True:
            budget.check_time(f"minimising the DFA ({len(block)} states)")
            rows = np.column_stack([block, np.where(cols >= 0, block[np.maximum(cols, 0)], -1)])   # (S, C + 1)
            if exact:
                _, first, inv = np.unique(rows, axis=0, return_index=True, return_inverse=True)
            else:                                                     # (S,) int64, wrapping
                _, first, inv = np.unique(rows @ mult, return_index=True, return_inverse=True)
            block = np.argsort(np.argsort(first))[inv.reshape(-1)]    # numbered by first state: the start's is 0
            grew, count = len(first) > count, len(first)
            if not grew:                        # stable (or a collision merged blocks: then the count may fall, and
                break                           # waiting for it to repeat could cycle; the check below catches it)
        rows = np.column_stack([accepting, np.where(cols >= 0, block[np.maximum(cols, 0)], -1)])
        rep = np.zeros(count, dtype=np.int64)
        rep[block] = np.arange(len(block))                            # a state of each block
        if (rows == rows[rep[block]]).all():        # each block's states agree on acceptance and successors' blocks:
            return _renumber(trans, accepting, block)   # a congruence, so its states are equivalent; a collision only
                                                        # ever merges, so it is also no finer than Moore's: the same
    raise AssertionError("Moore's refinement ended unstable")         # the exact round cannot


def _bfs_order(trans: np.ndarray, accepting: np.ndarray):
    """Number the states breadth-first from the start (state 0 first), bytes in order."""
    new_id, queue, n = np.full(len(accepting), -1), deque([0]), 1
    new_id[0] = 0
    while queue:
        s = queue.popleft()
        for t in trans[s][trans[s] >= 0]:
            if new_id[t] < 0:
                new_id[t], n = n, n + 1
                queue.append(int(t))
    return _renumber(trans, accepting, new_id)
