"""The bytes each token of a tokenizer.json stands for, as the engine's detokenizer turns it into text: what
structured output's token index (minillm.guided.token_index) walks its automaton with."""
from __future__ import annotations

import json


def token_bytes(tok, V: int) -> tuple[list, list, list]:
    """tok: a `tokenizers.Tokenizer` of V ids -> (each token's bytes, the same for a first token right after BOS,
    whether it is text (special tokens are not)).
    Byte-level BPE (Llama 3, Qwen, SmolLM2): each character of a token stands for one byte (GPT-2's table).
    SentencePiece-style (TinyLlama, Llama 2): "\u2581" is a space, <0xNN> the byte NN, and the decoder's Strip
    drops the first space of an output that follows BOS. Other decoders (WordPiece, WordLevel) join tokens with
    rules of their own: refused."""
    decoder = json.loads(tok.to_str()).get("decoder") or {}
    kinds = [d.get("type") for d in decoder.get("decoders", [decoder])]
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    pieces = [tok.id_to_token(i) for i in range(V)]
    text = [p is not None and p not in special for p in pieces]
    if "ByteLevel" in kinds:
        inverse = {c: b for b, c in bytes_to_unicode().items()}
        out = [bytes(inverse[c] for c in p) if ok and all(c in inverse for c in p) else b""
               for p, ok in zip(pieces, text)]
        return out, out, text
    if "ByteFallback" in kinds or "Metaspace" in kinds or "Replace" in kinds:
        out = [_piece(p) if ok else b"" for p, ok in zip(pieces, text)]
        strips = any(d.get("type") == "Strip" and d.get("start", 0) >= 1 for d in decoder.get("decoders", []))
        first = [b[1:] if strips and b.startswith(b" ") else b for b in out]
        return out, first, text
    raise ValueError(f"structured output needs a byte-level or SentencePiece-style tokenizer.json, whose tokens' "
                     f"bytes it knows; this one's decoder is {kinds}")


def _piece(p: str) -> bytes:
    """A SentencePiece-style token's bytes: <0xNN> is the byte NN, "\u2581" a space."""
    if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
        return bytes([int(p[3:5], 16)])
    return p.replace("\u2581", " ").encode("utf-8")


def bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are written in."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
