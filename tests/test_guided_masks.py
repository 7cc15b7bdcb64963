"""Token masks (minillm.guided.token_index) over the shipped tokenizer: against brute force (decode every token with
the tokenizer's own decode_bytes, walk the DFA), the fewest-tokens table against its Bellman equation, length-aware
masks that never strand a walk, jump-forward's forced tokens, and the same masks as outlines-core's."""
import numpy as np
import pytest
import torch

import minillm
from minillm.guided import compile_json, compile_regex, schema_to_regex
from minillm.llama.tokenizer import BOS, EOS

PATTERNS = [r"[a-z]+", r"(Romeo|Juliet) loves [a-z ]{2,12}\.", r'\{"id":(0|[1-9][0-9]{0,2}),"ok":(true|false)\}',
            r"[^\n]{1,6}", "é+ü?"]


@pytest.fixture(scope="module")
def tok():
    return minillm.load("shakespeare")[1]


def random_states(index, rng, n: int) -> list[int]:
    """States reached by random walks of allowed tokens (the start state first)."""
    states, s = [index.start], index.start
    while len(states) < n:
        allowed = np.flatnonzero(index.mask(s).numpy())
        allowed = allowed[allowed != EOS]
        if not len(allowed) or rng.random() < 0.15:
            s = index.start
            continue
        s = index.next_state(s, int(rng.choice(allowed)))
        states.append(s)
    return states


@pytest.mark.parametrize("pattern", PATTERNS)
def test_masks_equal_brute_force(tok, pattern):
    """For 6 states per pattern and every token: allowed exactly when its text (tokenizer.decode_bytes, as the engine
    decodes) is non-empty and walks the DFA to a live state; EOS exactly in accepting states; the after-BOS start row
    uses the bytes decode_bytes gives right after BOS."""
    index, rng = compile_regex(pattern, tok), np.random.default_rng(0)
    V = tok.vocab_size
    for s in random_states(index, rng, 6) + [index.start_after_bos]:
        prev = BOS if s == index.start_after_bos else 300
        q = index.start if s == index.start_after_bos else s
        want = np.zeros(V, dtype=bool)
        for t in range(V):
            if t in (0, BOS, EOS):
                continue
            data = tok.decode_bytes([t], prev_token=prev)
            want[t] = len(data) > 0 and index.dfa.walk(q, data) >= 0
        want[EOS] = bool(index.dfa.accepting[q])
        got = index.mask(s).numpy()
        assert (got == want).all(), (pattern, s, np.flatnonzero(got != want)[:10])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_fewest_tokens_satisfy_bellman(tok, pattern):
    """dist[s] = 0 where s accepts, else 1 + min over allowed tokens of dist[next]: the BFS table is the fixed point."""
    index = compile_regex(pattern, tok)
    for s in range(index.num_states + 1):
        nxt = index.next[s][index.next[s] >= 0]
        want = 0 if index.accepting[s] else 1 + int(index.dist[nxt].min())
        assert index.dist[s] == want


@pytest.mark.parametrize("pattern", PATTERNS)
def test_length_aware_masks_never_strand_a_walk(tok, pattern):
    """From the fewest tokens a match needs up to 4 more, 40 random walks each through the length-aware masks:
    some token is always allowed, and every walk ends accepting within its budget (EOS chosen or tokens out)."""
    index, rng = compile_regex(pattern, tok), np.random.default_rng(1)
    least = index.min_tokens()
    for budget in range(least, least + 5):
        for _ in range(40):
            s = index.start
            for used in range(budget):
                allowed = np.flatnonzero(index.mask(s, budget - used).numpy())
                assert len(allowed), (pattern, budget, used)
                t = int(rng.choice(allowed))
                if t == EOS:
                    break
                s = index.next_state(s, t)
            assert index.is_accepting(s), (pattern, budget)


def test_forced_tokens_spell_the_forced_bytes(tok):
    index = compile_json({"type": "object", "required": ["name", "age"], "additionalProperties": False,
                          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}, tok)
    s = index.next_state(index.start, tok.lookup[b"{"])
    forced = index.forced_tokens(s)
    assert tok.decode_bytes(forced, prev_token=300) == b'"name":"'
    assert index.walk(s, forced) == index.dfa.walk(index.dfa.walk(0, b"{"), b'"name":"')


def test_same_masks_as_outlines_core(tok):
    """outlines-core 0.2.14 (Index over the same token bytes), the same random token prefixes through both: identical
    allowed sets at every state compared, for regexes and a JSON schema's regex."""
    pytest.importorskip("outlines_core")
    from minillm.guided.check import compare_masks, outlines_index, outlines_vocabulary
    from minillm.guided.token_index import vocab_of
    vocab = vocab_of(tok)
    vocabulary = outlines_vocabulary(vocab)
    schema = {"type": "object", "required": ["name", "n"], "properties": {"name": {"type": "string", "maxLength": 6},
                                                                          "n": {"type": "integer", "minimum": -5}}}
    for pattern in PATTERNS[:3] + [schema_to_regex(schema)]:
        ours = compile_regex(pattern, tok)
        theirs, _ = outlines_index(pattern, vocab, vocabulary)
        r = compare_masks(ours, theirs, walks=6, max_steps=30)
        assert r["states"] > 20 and r["equal"] == r["states"], (pattern, r["mismatches"])


def test_outlines_core_difference_is_lone_lead_bytes(tok):
    """Where the two differ: in an ACCEPTING state outlines-core 0.2.14 leaves out the byte tokens of UTF-8 lead bytes
    0xC2..0xF4 (a character begun but not finished), so it cannot spell any non-ASCII character from byte tokens
    there. Ours allows them, rightly: each one continues to a complete match (brute force below)."""
    pytest.importorskip("outlines_core")
    from minillm.guided.check import outlines_index
    from minillm.guided.token_index import vocab_of
    pattern = r"[^\n]*"
    ours = compile_regex(pattern, tok)
    theirs, _ = outlines_index(pattern, vocab_of(tok))
    mine = set(np.flatnonzero(ours.mask(ours.start).numpy()).tolist())
    other = set(theirs.get_allowed_tokens(theirs.get_initial_state()))
    assert other < mine
    assert mine - other == {b + 3 for b in range(0xC2, 0xF5)}            # byte tokens are ids 3..258
    for t in mine - other:                                                # e.g. 0xC3 then 0xA9: "é"
        lead = t - 3
        c = max((lead & 0x1F) << 6, 0x80) if lead < 0xE0 else max((lead & 0x0F) << 12, 0x800) if lead < 0xF0 \
            else max((lead & 0x07) << 18, 0x10000)                        # the first character with this lead byte
        assert chr(c).encode()[0] == lead and ours.dfa.match(chr(c))


def test_cached_bias_equals_the_length_aware_mask(tok):
    """The engine adds bias(s, L), cached per state and per need level: 0 exactly where mask(s, L) allows, for every
    tokens-left L from 1 to past the state's max_need."""
    index = compile_regex(r"[a-z ,.;:!?'\n]{60,}|(Romeo|Juliet) [a-z]{2,5}\.", tok)
    for s in range(index.num_states + 1):
        for left in range(1, int(index.max_need[s]) + 2):
            assert torch.equal(index.bias(s, left) == 0, index.mask(s, left)), (s, left)
