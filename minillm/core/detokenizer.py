"""Detokenizing and stop checks: after each appended token, the sequence's text grows and it may finish.

A sequence stops (finish_reason "stop") on an end token (llama2.c vocabularies: BOS, which separates
documents in llama2.c's data and on which run.c stops, and EOS; HF tokenizers: their eos ids) unless
ignore_eos, on one of its stop_token_ids, or when a stop string appears in the new text (the text is cut
before it, as vLLM does); it ends with "length" at max_tokens or at max_model_len.
"""
from __future__ import annotations

from ..llama.tokenizer import BOS, EOS, Tokenizer
from .sequence import Sequence


class Detokenizer:
    def __init__(self, tokenizer, max_model_len: int):
        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        self.llama2c = isinstance(tokenizer, Tokenizer)
        self.stop_ids = {BOS, EOS} if self.llama2c else set(tokenizer.stop_ids)

    def check(self, seq: Sequence) -> bool:
        """seq's newest token was just appended: extend its text; -> has it finished?"""
        p, tok = seq.params, seq.output_ids[-1]
        if (not p.ignore_eos and tok in self.stop_ids) or tok in p.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", tok   # the stop token is not text
            return True
        before = len(seq.text)
        seq.text = self.append_text(seq)
        for s in p.stop:  # a stop string can only end in the newest text: search from just before it
            at = seq.text.find(s, max(0, before - len(s) + 1))
            if at >= 0:
                seq.text = seq.text[:at]
                seq.finish_reason, seq.stop_reason = "stop", s
                return True
        if len(seq.output_ids) >= p.max_tokens or len(seq) >= self.max_model_len:
            seq.finish_reason = "length"
            return True
        if not self.llama2c:   # a character whose bytes are still arriving (byte-level BPE splits them): held
            seq.text = seq.text.rstrip("\ufffd")   # back while the sequence runs, so streamed text only grows
        return False                               # (vLLM holds it back too); a finished text keeps it

    def append_text(self, seq: Sequence) -> str:
        """Text of the generated ids, extended by the newest token. llama2.c tokenizers: append the token's
        bytes (run.c's piece rules, BOS/EOS skipped) and decode the whole buffer, so a character split across
        byte tokens comes out whole. HF tokenizers: decode with the last prompt token as context, so one that
        strips a leading space at the start of a text (SentencePiece) keeps it, as vLLM does (check() holds a
        partial UTF-8 character at the end back while the sequence runs)."""
        if self.llama2c:
            ids = seq.output_ids
            prev = ids[-2] if len(ids) > 1 else seq.prompt_ids[-1]
            seq.text_bytes += self.tokenizer.decode_bytes(ids[-1:], prev_token=prev)
            return seq.text_bytes.decode("utf-8", errors="replace")
        prefix = self.tokenizer.decode(seq.prompt_ids[-1:])
        return self.tokenizer.decode(seq.prompt_ids[-1:] + seq.output_ids)[len(prefix):]
