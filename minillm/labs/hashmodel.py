"""A fake model for engine fuzzing (DESIGN.md rule 7) and for the labs' block-manager and policy checkers: its next
token is a hash of the token ids it reads back from the KV pool through the block table, so any paging bug (a wrong
block, a missed copy-on-write, a stale prefix-cache block, a lost preempted or swapped sequence, a draft's K/V kept
after rejection) changes the output.

Each token's "K/V" is (token id, position); a query at position p reads the cached positions 0..p of its
sequence and checks they come back in order. Never BOS or EOS, so lengths are exact. With choices=1 (the default)
the logits are one-hot (greedy decoding is exact and sampling changes nothing); with choices=c the c tokens
allowed(context) are equally likely, so seeded samples of one prompt (n > 1) diverge and write different K/V into
blocks they share until copy-on-write separates them.

tests/hashmodel.py and tests/test_scheduler_fuzz.py use it; minillm.labs.nb05_batching and nb06_paged_attention
run the reader's scheduling policy and block manager on it.
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from ..llama.attention import gather_kv
from ..llama.transformer import Transformer

V = 300


def next_token(context: list[int]) -> int:
    h = 0
    for t in context:
        h = (h * 1_000_003 + t + 1) % 2_147_483_647
    return 3 + h % (V - 3)


def allowed(context: list[int], choices: int = 1) -> list[int]:
    """The tokens a HashModel(choices) may emit after context (the first is next_token)."""
    first = next_token(context) - 3
    return [3 + (first + j) % (V - 3) for j in range(choices)]


def reference(prompt, n: int) -> list[int]:
    """The n greedy tokens after prompt (choices=1)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(next_token(ids))
    return ids[len(prompt):]


class IdTokenizer:
    """Token ids in, no text out (decode gives ""): what an engine running HashModel needs, built in no time."""
    stop_ids = ()

    def __init__(self, vocab_size: int = V):
        self.vocab_size = vocab_size

    def encode(self, text):
        raise ValueError("this tokenizer takes token ids only")

    def decode(self, ids) -> str:
        return ""


class HashModel(Transformer):
    """A Transformer only in name and shape (so minillm.load and LLM take it), float64 throughout."""

    def __init__(self, max_seq_len: int = 64, choices: int = 1):
        super().__init__(ModelConfig(dim=2, hidden_dim=2, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=V,
                                     max_seq_len=max_seq_len))
        self.double().eval()
        self.choices = choices
        self.calls = 0
        self.fail_at = None            # (call number, "before" | "after" the K/V writes): raise KeyboardInterrupt

    def forward(self, tokens, positions, kv, attn, rows=None, return_hidden=False):
        B, T = tokens.shape
        self.calls += 1
        fail = self.fail_at is not None and self.fail_at[0] == self.calls
        if fail and self.fail_at[1] == "before":
            raise KeyboardInterrupt("injected before the K/V writes")
        kvals = torch.stack([tokens, attn.positions], -1).to(torch.float64)[:, :, None, :]   # (B, T, Hkv=1, D=2)
        kv.update(0, attn.slot_mapping, kvals, kvals)
        if fail:
            raise KeyboardInterrupt("injected after the K/V writes")
        rows = torch.arange(B) * T + T - 1 if rows is None else rows
        logits = torch.full((len(rows), V), -1e9, dtype=torch.float64)                     # (N, V)
        for i, r in enumerate(rows.tolist()):
            b, t = divmod(r, T)
            p = int(attn.positions[b, t])
            ctx = gather_kv(kv.k[0], attn.block_tables[b:b + 1], p + 1)[0, :, 0]          # (p+1, 2)
            assert ctx[:, 1].tolist() == list(range(p + 1)), "positions read back out of order"
            logits[i, allowed([int(x) for x in ctx[:, 0]], self.choices)] = 0.0
        return logits
