"""llama2.c's tokenizer: `tokenizer.bin` load/save, run.c's encode (fast), decode.

File format (FORMATS.md): uint32 max_token_length, then per token: float32 score, int32 byte length,
raw bytes. Ids 0 <unk>, 1 BOS "\\n<s>\\n", 2 EOS "\\n</s>\\n", 3..258 the byte tokens <0x00>..<0xFF>.

Encoding follows run.c's `encode` rule for rule: BOS, a dummy-prefix " " token when the text is not
empty, then one UTF-8 code point at a time (a byte plus up to 3 continuation bytes), byte fallback
to ids 3..258, then repeatedly merge the adjacent pair whose concatenation is the highest-scoring
token, leftmost on ties. run.c rescans the whole sequence for every merge (quadratic); here a heap of
candidate pairs over a linked list gives the same merges in O(n log n): merges never reorder tokens,
so "leftmost" is "smallest original index", and a popped pair is used only if both sides are still
what they were when it was pushed. tests/test_tokenizer.py checks equality with a literal port.
"""
from __future__ import annotations

import heapq
import os
import re
import struct

import numpy as np

from ..atomic import open_replacing

BOS, EOS, UNK = 1, 2, 0
N_RESERVED = 259  # <unk>, BOS, EOS and 256 byte tokens
_BYTE_PIECE = re.compile(rb"^<0x([0-9A-Fa-f]{1,2})")  # what run.c's sscanf("<0x%02hhX>") accepts
# run.c's merge loop starts from best_score = -1e10 (a float) and needs a strictly greater score, so a
# token scored at or below it (or NaN) is never merged into
_NO_MERGE_AT_OR_BELOW = float(np.float32(-1e10))


def reserved_pieces() -> list[bytes]:
    return [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % i for i in range(256)]


class Tokenizer:
    """pieces[i] is token i's bytes; scores[i] its merge priority (higher merges first)."""

    bos_id, eos_id = BOS, EOS

    def __init__(self, pieces: list[bytes], scores, max_token_length: int | None = None):
        if len(pieces) != len(scores):
            raise ValueError(f"{len(pieces)} pieces but {len(scores)} scores")
        if len(pieces) < N_RESERVED:
            raise ValueError(f"a llama2.c vocabulary needs at least {N_RESERVED} tokens "
                             f"(<unk>, BOS, EOS, 256 bytes), got {len(pieces)}")
        self.pieces = [bytes(p) for p in pieces]
        self.scores = np.asarray(scores, dtype=np.float32)
        self.max_token_length = max_token_length or max(len(p) for p in self.pieces)
        # run.c looks strings up by binary search over the sorted vocabulary; a dict does the same
        # job provided strings are unique (they are, for every tokenizer.bin we know).
        self.lookup: dict[bytes, int] = {}
        for i, p in enumerate(self.pieces):
            self.lookup.setdefault(p, i)
        self._score = self.scores.tolist()  # python floats (exact float32 values) for the merge loop
        self._bytes = {prev: [self._piece_bytes(prev, t) for t in range(len(self.pieces))] for prev in (BOS, -1)}

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    # ------------------------------------------------------------------ file I/O
    @classmethod
    def load(cls, path, vocab_size: int | None = None) -> "Tokenizer":
        """Read tokenizer.bin. run.c takes the count from the checkpoint; without it, read to the end."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        data = open(path, "rb").read()
        if len(data) < 4:
            raise ValueError(f"{path}: {len(data)} bytes is too short for a tokenizer.bin (needs a 4-byte header)")
        (max_len,) = struct.unpack_from("<I", data, 0)
        off, pieces, scores = 4, [], []
        while off < len(data) and (vocab_size is None or len(pieces) < vocab_size):
            if off + 8 > len(data):
                raise ValueError(f"{path}: truncated in token {len(pieces)} header at byte {off} of {len(data)}")
            score, n = struct.unpack_from("<fi", data, off)
            if n < 0 or off + 8 + n > len(data):
                raise ValueError(f"{path}: token {len(pieces)} claims {n} bytes at byte {off + 8}, "
                                 f"but the file has {len(data)} bytes")
            pieces.append(data[off + 8: off + 8 + n])
            scores.append(score)
            off += 8 + n
        if vocab_size is not None and len(pieces) < vocab_size:
            raise ValueError(f"{path}: expected {vocab_size} tokens (from the checkpoint), found {len(pieces)}")
        if len(pieces) < N_RESERVED:
            raise ValueError(f"{path}: {len(pieces)} tokens, but a tokenizer.bin holds at least {N_RESERVED}")
        return cls(pieces, scores, max_len)

    def save(self, path):
        with open_replacing(path) as f:
            f.write(struct.pack("<I", self.max_token_length))
            for p, s in zip(self.pieces, self.scores.tolist()):
                f.write(struct.pack("<fi", s, len(p)))
                f.write(p)

    # ------------------------------------------------------------------ encode
    def _initial_tokens(self, text: bytes) -> list[int]:
        """One code point at a time, as run.c groups bytes: a byte, then continuation bytes (10xxxxxx)
        while the group is shorter than 4. Unknown code points fall back to byte tokens (byte + 3)."""
        ids, i, n = [], 0, len(text)
        while i < n:
            j = i + 1
            while j < n and (text[j] & 0xC0) == 0x80 and j - i < 4:
                j += 1
            tok = self.lookup.get(text[i:j])
            if tok is not None:
                ids.append(tok)
            else:
                ids.extend(b + 3 for b in text[i:j])
            i = j
        return ids

    def encode(self, text: str | bytes, bos: bool = True, eos: bool = False, c_string: bool = False) -> list[int]:
        """c_string: stop at the first NUL, as run.c does (its prompt is a C string); `python -m minillm run` sets
        it. Elsewhere a NUL is text like any other (the byte token <0x00>), never a silent end."""
        data = text.encode("utf-8", errors="surrogateescape") if isinstance(text, str) else bytes(text)
        if c_string:
            data = data.split(b"\0", 1)[0]
        ids = self._initial_tokens(data)
        if data:
            space = self.lookup.get(b" ")
            if space is None:
                raise ValueError("this vocabulary has no ' ' token, which run.c's dummy prefix needs")
            ids = [space] + ids
        # run.c merges over its whole buffer, BOS included (it only matters if a piece starts with "\n<s>\n")
        ids = self._merge(([BOS] if bos else []) + ids)
        return ids + ([EOS] if eos else [])

    def _merge(self, ids: list[int]) -> list[int]:
        n = len(ids)
        if n < 2:
            return ids
        tok = list(ids)
        nxt = list(range(1, n + 1))   # linked list over original positions; n = end
        prv = list(range(-1, n - 1))
        alive = [True] * n
        heap = []
        pieces, lookup, score = self.pieces, self.lookup, self._score

        def push(i, j):
            m = lookup.get(pieces[tok[i]] + pieces[tok[j]])
            if m is not None and score[m] > _NO_MERGE_AT_OR_BELOW:
                # key: highest score first, then leftmost; the tokens pin the entry to this exact pair
                heapq.heappush(heap, (-score[m], i, j, tok[i], tok[j], m))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, i, j, ti, tj, m = heapq.heappop(heap)
            if not (alive[i] and alive[j] and nxt[i] == j and tok[i] == ti and tok[j] == tj):
                continue  # stale: one side was merged away since this pair was pushed
            tok[i] = m
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            if prv[i] >= 0:
                push(prv[i], i)
            if nxt[i] < n:
                push(i, nxt[i])
        return [tok[i] for i in range(n) if alive[i]]

    # ------------------------------------------------------------------ decode
    def piece_bytes(self, prev_token: int, token: int) -> bytes:
        """run.c's decode(): strip one leading space after BOS; a <0xXX> piece is that raw byte (a table lookup:
        each piece's bytes after BOS and after any other token are made once)."""
        return self._bytes[BOS if prev_token == BOS else -1][token]

    def _piece_bytes(self, prev_token: int, token: int) -> bytes:
        piece = self.pieces[token]
        if prev_token == BOS and piece[:1] == b" ":
            piece = piece[1:]
        m = _BYTE_PIECE.match(piece)
        if m:
            piece = bytes([int(m.group(1), 16)])
        return piece.split(b"\0", 1)[0]  # C strings stop at NUL (so <0x00> prints nothing)

    @staticmethod
    def printable(piece: bytes) -> bytes:
        """run.c's safe_printf(): drop a single byte that is neither printable nor whitespace (C locale)."""
        if len(piece) == 1 and not (0x20 <= piece[0] <= 0x7E or 0x09 <= piece[0] <= 0x0D):
            return b""
        return piece

    def decode_bytes(self, ids, prev_token: int | None = None) -> bytes:
        """Bytes of ids as run.c prints them (before safe_printf). BOS and EOS are not text: skipped."""
        out, prev = [], BOS if prev_token is None else prev_token
        for t in ids:
            if t not in (BOS, EOS):
                out.append(self.piece_bytes(prev, t))
            prev = t
        return b"".join(out)

    def decode(self, ids, prev_token: int | None = None) -> str:
        """Text of ids. Special tokens are skipped; byte tokens are joined into UTF-8 before decoding,
        so a character split across byte tokens comes out whole; invalid bytes become U+FFFD."""
        return self.decode_bytes(ids, prev_token).decode("utf-8", errors="replace")


def same_tokenizer(a, b) -> bool:
    """Do two tokenizers map text to the same ids? llama2.c vocabularies: the same pieces in the same
    order; others: the same size and the same ids for a probe text."""
    if a is b:
        return True
    if hasattr(a, "pieces") and hasattr(b, "pieces"):
        return a.pieces == b.pieces
    probe = "To be, or not to be: that is the question.\n"
    return type(a) is type(b) and a.vocab_size == b.vocab_size and a.encode(probe) == b.encode(probe)
