"""Per-DFA-state token masks over a tokenizer's vocabulary, precomputed (Outlines' index: Willard & Louf 2023).

A token is allowed in DFA state s if its bytes walk from s to a live state s' from which an accepting state can
still be reached; the end token (EOS) only where s accepts. Every state's row is computed at once, one byte
position at a time over all tokens (numpy gathers over a (S, V) table), so a mask at decode time is a lookup:

    next     (S + 1, V) int32   the state after each token, -1 if the token is not allowed
    allowed  (S + 1, V) bool    allowed tokens (EOS included where s accepts), a torch tensor
    dist     (S + 1,)           the fewest TOKENS from each state to an accepting one (backward BFS over `next`)
The engine adds bias(s) = 0 / -inf (a (V,) float32, built once per visited state and need level) to a row's logits.

Length-aware masks: with L tokens left a token t is allowed only if 1 + dist[next[s, t]] <= L, so the output
can always still complete within max_tokens (precomputed max_need[s] says when the static mask already is;
below it the mask is computed for that step).
Row S is a virtual start state for a request whose prompt ends in BOS: llama2.c's decoder drops a token's
leading space right after BOS (Tokenizer.piece_bytes), so the first token's bytes differ there.

The token -> bytes map is the detokenizer's own (minillm.core.detokenizer appends piece_bytes for each output
token and decodes the whole buffer as UTF-8), so the returned text is exactly the bytes the DFA walked:
byte tokens <0xXX> are one byte, <unk> / BOS / EOS are not text, and a token with no bytes (<0x00>: run.c prints
C strings) is never allowed (it would let a sample spin without moving the DFA).
"""
from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict

import numpy as np
import torch

from ..llama.tokenizer import BOS, EOS, UNK, Tokenizer
from .budget import NO_BUDGET, CompileBudget, max_states
from .fsm import DFA, compile_dfa, distances_to_accept
from .regex import Alt, RegexError, literal, parse

UNREACHABLE = np.iinfo(np.int32).max
MAX_BIASES = 2048         # (V,) float32 biases cached per index: 32 MiB at V = 4096
_VOCABS: "weakref.WeakKeyDictionary[object, Vocab]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()     # the vocabularies and their caches, shared by the threads that build requests


class Vocab:
    """A tokenizer's tokens as bytes, exactly as the engine's detokenizer turns them into text: a llama2.c
    tokenizer's pieces (run.c's rules), or a tokenizer.json's (HFTokenizer.token_bytes: byte-level or
    SentencePiece-style)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        if isinstance(tokenizer, Tokenizer):
            V = tokenizer.vocab_size
            self.eos = EOS
            self.bytes = [tokenizer.piece_bytes(UNK, t) for t in range(V)]      # after any token but BOS
            self.bytes_after_bos = [tokenizer.piece_bytes(BOS, t) for t in range(V)]
            text = [t not in (UNK, BOS, EOS) for t in range(V)]
        elif hasattr(tokenizer, "token_bytes"):
            self.eos = tokenizer.eos_id
            self.bytes, self.bytes_after_bos, text = tokenizer.token_bytes()
        else:
            raise ValueError(f"structured output (guided_regex / guided_json / guided_choice) needs a tokenizer "
                             f"whose tokens' bytes it knows (llama2.c's, or a tokenizer.json); got "
                             f"{type(tokenizer).__name__}")
        self.text = np.array([ok and len(b) > 0 for ok, b in zip(text, self.bytes)])    # (V,)
        self.longest = max((len(b) for b, ok in zip(self.bytes, self.text) if ok), default=0)  # bytes, a text token
        self.indexes: OrderedDict = OrderedDict()                                # compiled constraints, LRU

    @property
    def size(self) -> int:
        return len(self.bytes)

    def matrix(self, after_bos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(V, L) uint8 token bytes, zero-padded, and (V,) lengths."""
        src = self.bytes_after_bos if after_bos else self.bytes
        lengths = np.array([len(b) for b in src])
        out = np.zeros((len(src), max(1, lengths.max())), dtype=np.uint8)
        for t, b in enumerate(src):
            out[t, :len(b)] = np.frombuffer(b, dtype=np.uint8)
        return out, lengths

    def encode_bytes(self, data: bytes) -> list[int]:
        """The tokenizer's own tokens for data, without BOS or the dummy-prefix space (run.c's merges). A
        tokenizer.json whose tokens would not spell data exactly (a SentencePiece-style one puts a "\u2581" space
        before a text's first word) gets the longest tokens that do, left to right."""
        tok = self.tokenizer
        if isinstance(tok, Tokenizer):
            return tok._merge(tok._initial_tokens(data))
        ids = tok.encode(data.decode("utf-8", errors="replace"), bos=False)
        return ids if b"".join(self.bytes[i] for i in ids) == data else self.longest_tokens(data)

    def longest_tokens(self, data: bytes) -> list[int]:
        """data as the longest text tokens that spell it, left to right (stops where no token fits)."""
        if not hasattr(self, "_ids"):
            self._ids = {b: t for t, b in reversed(list(enumerate(self.bytes))) if self.text[t]}   # lowest id wins
            self._longest = max(map(len, self._ids))
        out, at = [], 0
        while at < len(data):
            n = next((n for n in range(min(self._longest, len(data) - at), 0, -1) if data[at:at + n] in self._ids), 0)
            if n == 0:
                break
            out.append(self._ids[data[at:at + n]])
            at += n
        return out


def vocab_of(tokenizer) -> Vocab:
    """One Vocab per tokenizer object, kept as long as the tokenizer lives."""
    with _LOCK:
        v = _VOCABS.get(tokenizer)
        if v is None:
            v = Vocab(tokenizer)
            _VOCABS[tokenizer] = v
        return v


def walk_tokens(trans: np.ndarray, states: np.ndarray, tok_bytes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every token's bytes from every given state: -> (len(states), V) end states, -1 where the walk dies."""
    S = trans.shape[0]
    sink = np.vstack([np.where(trans >= 0, trans, S), np.full((1, 256), S, dtype=trans.dtype)])  # (S + 1, 256)
    cur = np.repeat(states.astype(np.int32)[:, None], len(lengths), axis=1)    # (n, V)
    for j in range(tok_bytes.shape[1]):
        cols = np.flatnonzero(lengths > j)                                    # tokens at least j + 1 bytes long
        cur[:, cols] = sink[cur[:, cols], tok_bytes[cols, j]]
    return np.where(cur == S, -1, cur).astype(np.int32)


class TokenIndex:
    """A compiled constraint: its DFA and every state's token mask over one vocabulary (see the module docstring).
    States 0 .. S - 1 are the DFA's; S is the start state as seen right after BOS."""

    def __init__(self, dfa: DFA, vocab: Vocab, source: str = "regex", budget: CompileBudget = NO_BUDGET):
        self.dfa, self.vocab, self.source = dfa, vocab, source
        S, V = dfa.num_states, vocab.size
        self.num_states, self.start, self.start_after_bos = S, dfa.start, S
        self.accepting = np.append(dfa.accepting, dfa.accepting[dfa.start])       # (S + 1,)
        nxt = np.empty((S + 1, V), dtype=np.int32)
        tb, lens = vocab.matrix()
        step = max(8, (1 << 20) // V)        # states per chunk: (step, V) int32 temporaries of ~4 MiB at any V
                                             # (each numpy call holds the GIL: a few ms, not a stall of the server)
        for lo in range(0, S, step):                                             # chunks bound the temporaries
            budget.check_time(f"walking the vocabulary's tokens from {S} states ({lo} done)")
            nxt[lo:min(S, lo + step)] = walk_tokens(dfa.trans, np.arange(lo, min(S, lo + step)), tb, lens)
        tb, lens = vocab.matrix(after_bos=True)
        nxt[S] = np.where(lens > 0, walk_tokens(dfa.trans, np.array([dfa.start]), tb, lens)[0], -1)
        nxt[:, ~vocab.text] = -1
        self.dist = self._distances(nxt, budget)
        self._dist_of = np.append(self.dist, UNREACHABLE)                         # index -1: unreachable
        self.max_need = np.zeros(S + 1, dtype=np.int64)                           # (S + 1,) see tokens_needed
        for lo in range(0, S + 1, step):
            rows = nxt[lo:lo + step]
            rows[self._dist_of[rows] >= UNREACHABLE] = -1                         # tokens into dead ends
            self.max_need[lo:lo + step] = np.where(rows >= 0, 1 + self._dist_of[rows], 0).max(1)
        self.next = nxt
        allowed = nxt >= 0
        allowed[:, vocab.eos] = self.accepting
        self.allowed = torch.from_numpy(allowed)                                  # (S + 1, V) bool
        self._bias: dict[tuple, torch.Tensor] = {}                                # (state, level) -> (V,) float32
        self._levels: dict[int, np.ndarray] = {}                                  # state -> its distinct needs
        self._forced: dict[int, list] = {}

    def _distances(self, nxt: np.ndarray, budget: CompileBudget) -> np.ndarray:
        """(S + 1,) fewest tokens to an accepting state: BFS backwards over the distinct (s -> s') token edges."""
        n = nxt.shape[0]
        preds = [[] for _ in range(n)]
        for s in range(n):
            if s % 64 == 0:
                budget.check_time(f"measuring token distances ({s} of {n} states)")
            for t in np.unique(nxt[s][nxt[s] >= 0]):
                preds[t].append(s)
        return distances_to_accept(preds, self.accepting, UNREACHABLE)

    # ------------------------------------------------------------------ per step
    def next_state(self, state: int, token: int) -> int:
        """The state after token (-1: not allowed; EOS leaves the state as it is)."""
        if state < 0:
            return -1
        if token == self.vocab.eos:
            return state if self.accepting[state] else -1
        return int(self.next[state, token])

    def walk(self, state: int, tokens) -> int:
        for t in tokens:
            state = self.next_state(state, t)
        return state

    def is_accepting(self, state: int) -> bool:
        return state >= 0 and bool(self.accepting[state])

    def tokens_needed(self, state: int) -> np.ndarray:
        """(V,) for each token allowed in state, 1 + the fewest tokens after it to a complete match; 0 if not allowed.
        max_need[state] is its maximum: with at least that many tokens left, the static mask is length-aware too."""
        row = self.next[state]
        return np.where(row >= 0, 1 + self._dist_of[row], 0)

    def mask(self, state: int, tokens_left: int | None = None) -> torch.Tensor:
        """(V,) bool: the tokens allowed in state with tokens_left left (None: no limit)."""
        if tokens_left is None or tokens_left >= self.max_need[state]:
            return self.allowed[state]
        need = self.tokens_needed(state)
        ok = (need > 0) & (need <= tokens_left)                                  # (V,)
        ok[self.vocab.eos] = self.accepting[state] and tokens_left >= 1
        return torch.from_numpy(ok)

    def bias(self, state: int, tokens_left: int | None = None) -> torch.Tensor:
        """(V,) float32: 0 where mask(state, tokens_left) allows, -inf elsewhere: what the engine adds to a row's
        logits (an add is about twice as fast as masked_fill on CPU). Built once per state and per level: a
        length-aware mask changes only where tokens_left crosses one of the state's few distinct need values."""
        level = None
        if tokens_left is not None and tokens_left < self.max_need[state]:
            levels = self._levels.get(state)
            if levels is None:
                levels = self._levels[state] = np.unique(self.tokens_needed(state))     # sorted, 0 first
            level = max(1, int(levels[np.searchsorted(levels, tokens_left, side="right") - 1]))  # a call has >= 1 left
        b = self._bias.get((state, level))
        if b is None:
            if len(self._bias) >= MAX_BIASES:                                   # bounded: start the cache over
                self._bias.clear()
            b = torch.zeros(self.vocab.size).masked_fill(~self.mask(state, level), float("-inf"))   # (V,)
            self._bias[(state, level)] = b
        return b

    @property
    def nbytes(self) -> int:
        biases = list(self._bias.values())              # one atomic copy: a step in another thread may add one
        return self.next.nbytes + self.allowed.numel() + sum(b.numel() * 4 for b in biases)

    def min_tokens(self, after_bos: bool = False) -> int:
        """The fewest tokens of a complete match (from the start state)."""
        return int(self.dist[self.start_after_bos if after_bos else self.start])

    def forced_tokens(self, state: int) -> list[int]:
        """Jump-forward (SGLang, Zheng et al. 2024): the bytes the DFA forces from state, as the tokenizer's own
        tokens (cached per state). The caller checks each against the tokens left."""
        if state not in self._forced:
            data = self.dfa.forced(state) if 0 <= state < self.num_states else b""
            self._forced[state] = self.vocab.encode_bytes(data) if data else []
        return self._forced[state]


# ---------------------------------------------------------------------------- compiling, cached per vocabulary
MAX_CACHED, MAX_CACHED_BYTES = 16, 256 * 2**20   # compiled constraints kept per vocabulary (a request holds its own)


def build_dfa(source: tuple, minimize: bool, max_states: int, longest: int, budget: CompileBudget) -> DFA:
    """source ("regex", pattern) or ("choice", strings) -> its DFA, within budget: the length check on the tree
    (longest: the vocabulary's longest token, in bytes) before any state, then the states and the time. Runs where
    the budget says (a worker process, for the server)."""
    kind, data = source
    ast = parse(data) if kind == "regex" else Alt(tuple(literal(c) for c in data))
    budget.check_length(ast, longest)
    return compile_dfa(ast, minimize, max_states, budget)


def _cached(tokenizer, key: tuple, source: tuple, budget: CompileBudget, minimize: bool = True,
            label: str = "guided_regex") -> TokenIndex:
    """The constraint `key` over tokenizer's vocabulary: from the cache, or built from source within budget
    (build_dfa, then the token masks here). label: how the pattern's errors name it."""
    vocab = vocab_of(tokenizer)
    with _LOCK:
        index = vocab.indexes.get(key)
    if index is None:                   # built outside the lock: the server's prepare threads compile side by side
        try:
            dfa = budget.build(build_dfa, source, minimize, max_states(vocab.size), vocab.longest)
        except RegexError as e:
            raise RegexError(str(e).replace("guided_regex", label, 1)) from None
        index = TokenIndex(dfa, vocab, key[0], budget)
    with _LOCK:
        index = vocab.indexes.setdefault(key, index)
        vocab.indexes.move_to_end(key)
        while len(vocab.indexes) > 1 and (len(vocab.indexes) > MAX_CACHED or
                                          sum(ix.nbytes for ix in vocab.indexes.values()) > MAX_CACHED_BYTES):
            vocab.indexes.popitem(last=False)                                   # least recently used first
    return index


def compile_regex(pattern: str, tokenizer, minimize: bool = True, budget: CompileBudget = NO_BUDGET) -> TokenIndex:
    """guided_regex: the pattern's DFA and its token masks over tokenizer's vocabulary."""
    return _cached(tokenizer, ("regex", pattern, minimize), ("regex", pattern), budget, minimize)


def compile_json(schema, tokenizer, budget: CompileBudget = NO_BUDGET) -> TokenIndex:
    """guided_json: a JSON schema (dict or JSON text) through schema_to_regex, then as a regex."""
    from .json_schema import schema_to_regex
    pattern = schema_to_regex(schema)
    return _cached(tokenizer, ("json", pattern), ("regex", pattern), budget, label="guided_json (as a regex)")


def compile_choice(choices: list, tokenizer, budget: CompileBudget = NO_BUDGET) -> TokenIndex:
    """guided_choice: exactly one of the strings."""
    return _cached(tokenizer, ("choice", json.dumps(list(choices))), ("choice", tuple(choices)), budget)
