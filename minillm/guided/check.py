"""minillm's masks beside a production library's: outlines-core (the Rust core of Outlines, `pip install
minillm[guided]`; its Index / Vocabulary API), fed the same token bytes.

Both build a regex's token index over the same vocabulary; compare_masks walks the same token prefixes through
both (random allowed tokens, the same one for both) and compares the allowed sets state by state: ours without
the length limit (outlines-core's masks are not length-aware), EOS allowed where the state accepts, as in both.
Patterns must mean the same in both dialects: outlines-core's regex (Rust regex-automata) reads \\d \\w \\s and
`.` as Unicode classes where ours are ASCII (re.ASCII), so compare with explicit classes.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .token_index import TokenIndex, Vocab


def _outlines():
    try:
        import outlines_core
    except ImportError as e:
        raise ImportError("the comparison needs outlines-core: pip install 'minillm[guided]' "
                          "(or outlines-core==0.2.14)") from e
    return outlines_core


def outlines_vocabulary(vocab: Vocab):
    """outlines_core.Vocabulary of the text tokens' bytes (what our masks may allow), EOS as its end token."""
    oc = _outlines()
    tokens: dict[bytes, list] = {}
    for t in np.flatnonzero(vocab.text):
        tokens.setdefault(vocab.bytes[t], []).append(int(t))
    return oc.Vocabulary(vocab.eos, tokens)


def outlines_index(pattern: str, vocab: Vocab, vocabulary=None) -> tuple[object, float]:
    """outlines_core.Index(pattern, vocabulary) and the seconds it took to build."""
    oc = _outlines()
    vocabulary = vocabulary or outlines_vocabulary(vocab)
    t0 = time.perf_counter()
    index = oc.Index(pattern, vocabulary)
    return index, time.perf_counter() - t0


def compare_masks(ours: TokenIndex, theirs, walks: int = 10, max_steps: int = 40, seed: int = 0) -> dict:
    """Walk random token prefixes through both indexes. -> {"states": compared, "equal": how many agreed,
    "mismatches": [(token prefix, only ours, only theirs)] (the first few)}."""
    rng = np.random.default_rng(seed)
    compared, equal, mismatches = 0, 0, []
    for _ in range(walks):
        s, st, prefix = ours.start, theirs.get_initial_state(), []
        for _ in range(max_steps):
            mine = set(np.flatnonzero(ours.mask(s).numpy()).tolist())
            other = set(theirs.get_allowed_tokens(st))
            compared += 1
            equal += mine == other
            if mine != other and len(mismatches) < 5:
                mismatches.append((list(prefix), sorted(mine - other)[:10], sorted(other - mine)[:10]))
            choices = sorted(mine & other - {ours.vocab.eos})
            if not choices or (ours.is_accepting(s) and rng.random() < 0.1):
                break
            t = int(rng.choice(choices))
            prefix.append(t)
            s, st = ours.next_state(s, t), theirs.get_next_state(st, t)
    return {"states": compared, "equal": equal, "mismatches": mismatches}


def mask_step_seconds(ours: TokenIndex, pattern: str, vocabulary, tokens: list, repeats: int = 3) -> dict:
    """Per-step seconds to mask one row of logits (V,) along a token path: ours (a state transition and an add of
    the state's cached (V,) 0 / -inf bias) and outlines-core's (its Guide writes a bitmask, unpacked with torch ops
    and applied with masked_fill; its torch.compile kernel is left out: CPU compile times would dominate).
    Medians over the path, best of repeats."""
    oc = _outlines()
    V = ours.vocab.size
    logits = torch.randn(V)
    shifts = torch.arange(32, dtype=torch.int32)
    words = torch.zeros(1, (V + 31) // 32, dtype=torch.int32)
    guide = oc.Guide(oc.Index(pattern, vocabulary))
    out = {}
    for name in ("minillm", "outlines-core"):
        best = float("inf")
        for _ in range(repeats):
            times, s = [], ours.start
            guide.reset()
            for t in tokens:
                t0 = time.perf_counter()
                if name == "minillm":
                    logits + ours.bias(s)
                    s = ours.next_state(s, t)
                else:
                    guide.write_mask_into(words.data_ptr(), words.numel(), words.element_size())
                    allowed = ((words.unsqueeze(-1) >> shifts) & 1).bool().view(-1)[:V]    # (V,)
                    logits.masked_fill(~allowed, float("-inf"))
                    guide.advance(t, return_tokens=False)
                times.append(time.perf_counter() - t0)
            best = min(best, float(np.median(times)))
        out[name] = best
    return out
