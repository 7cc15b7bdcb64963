"""Train a BPE vocabulary from text, as a llama2.c `Tokenizer` (Sennrich et al. 2016).

Like SentencePiece's BPE, which made llama2.c's tokenizer.bin, words keep their leading space
(" the") and merges are learned inside pre-split chunks (words, digits, punctuation); code points seen in
the text are the base symbols and anything rarer falls back to the 256 byte tokens. A merge learned earlier
gets a higher score, so run.c's "merge the highest-scoring pair" replays the training order.

Pair counts are updated incrementally (only the words that contain the merged pair are touched),
and the most frequent pair comes from a heap with lazy invalidation, so a few MB of text trains a
4k vocabulary in well under a minute on one core.
"""
from __future__ import annotations

import heapq
import re
from collections import Counter, defaultdict

from ..llama.tokenizer import N_RESERVED, Tokenizer, reserved_pieces

# pre-split (for training only): " word" (letters), one digit, a run of punctuation, one whitespace
# character. Merges then never glue punctuation to words, so "sword," is "sword" + "," and a small
# vocabulary spends its entries on words (GPT-2's byte-level BPE splits the same way).
_WORD = re.compile(r" ?[^\W\d_]+| ?\d| ?[^\w\s]+| ?_+|\s", re.UNICODE)


def train_bpe(text: str, vocab_size: int, min_char_count: int = 2) -> Tokenizer:
    """text -> Tokenizer with exactly vocab_size tokens (fewer only if the text runs out of pairs)."""
    if vocab_size < N_RESERVED + 1:
        raise ValueError(f"vocab_size={vocab_size} is below the {N_RESERVED} reserved tokens "
                         f"(<unk>, BOS, EOS, 256 bytes) plus ' '")
    chars = Counter(text)
    chars[" "] = max(chars[" "], min_char_count)  # run.c needs a " " token for its dummy prefix
    room = vocab_size - N_RESERVED
    base = sorted((c for c, n in chars.items() if n >= min_char_count), key=lambda c: (-chars[c], c))
    base = base[: max(1, room // 2)] if len(base) > room // 2 else base  # keep at least half for merges
    if " " not in base:
        base[-1] = " "
    symbols = [c.encode() for c in base]
    known = set(symbols)

    # words as tuples of symbols; a character outside the base set becomes its UTF-8 bytes as
    # byte-symbols that never merge (they stay byte tokens at encode time too)
    word_counts = Counter(_WORD.findall(" " + text))
    words, freqs = [], []
    for w, f in word_counts.items():
        syms = []
        for c in w:
            b = c.encode("utf-8", errors="surrogateescape")
            syms.append(b if b in known else None)
        words.append(syms)
        freqs.append(f)

    pair_count: Counter = Counter()
    where: dict = defaultdict(set)  # pair -> indices of words containing it
    for wi, syms in enumerate(words):
        for a, b in zip(syms, syms[1:]):
            if a is not None and b is not None:
                pair_count[(a, b)] += freqs[wi]
                where[(a, b)].add(wi)
    heap = [(-n, p) for p, n in pair_count.items()]
    heapq.heapify(heap)

    reserved = set(reserved_pieces())
    merges: list[bytes] = []
    n_merges = vocab_size - N_RESERVED - len(symbols)
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or -neg <= 0:
            continue  # stale entry
        new = pair[0] + pair[1]
        if new in known or new in reserved:  # keep token strings unique
            pair_count[pair] = 0
            continue
        merges.append(new)
        known.add(new)
        changed = Counter()
        for wi in list(where[pair]):
            syms, f = words[wi], freqs[wi]
            for a, b in zip(syms, syms[1:]):  # remove this word's old pairs
                if a is not None and b is not None:
                    changed[(a, b)] -= f
                    where[(a, b)].discard(wi)
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == pair[0] and syms[i + 1] == pair[1]:
                    out.append(new)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[wi] = out
            for a, b in zip(out, out[1:]):  # add its new pairs
                if a is not None and b is not None:
                    changed[(a, b)] += f
                    where[(a, b)].add(wi)
        for p, d in changed.items():
            if d:
                pair_count[p] += d
                heapq.heappush(heap, (-pair_count[p], p))

    pieces = reserved_pieces() + symbols + merges
    # scores: byte and special tokens 0 (as Llama's), merges by rank (earlier = higher), base symbols
    # below every merge; run.c only compares the scores of merge results, so base scores never decide.
    scores = ([0.0] * N_RESERVED + [-float(len(merges) + i) for i in range(len(symbols))]
              + [-float(i) for i in range(len(merges))])
    return Tokenizer(pieces, scores)
