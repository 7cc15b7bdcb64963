"""minillm.guided's regex parser and DFA against Python's re.fullmatch (flags=re.ASCII: the dialect's definition),
on seeded random patterns and strings (and the AST printed back as text, which Python reads the same way);
UTF-8 range splitting against brute force; refusals that name the construct."""
import re

import numpy as np
import pytest

from minillm.guided import RegexError, compile_dfa, parse
from minillm.guided.fsm import utf8_sequences
from minillm.guided.regex import unparse

ATOMS = ["a", "b", "c", " ", r"\.", ".", "é", r"\u00e9", "[a-c]", "[^a]", r"[^\n]", r"\d", r"\s", r"\w", "[α-ω]",
         r"\x41", "[.b-]", r"[\]a]", "[é-ë]", "😀", r"[^\x00-\x7f]"]
QUANTS = ["", "", "", "*", "+", "?", "{2}", "{1,3}", "{2,}", "{,2}", "*?", "+?"]


def random_pattern(rng, depth: int = 0) -> str:
    """A random pattern in the shared subset of both dialects."""
    parts = []
    for _ in range(rng.integers(1, 4 - depth)):
        if depth < 1 and rng.random() < 0.4:
            inner = "|".join(random_pattern(rng, depth + 1) for _ in range(rng.integers(1, 3)))
            atom = f"({inner})" if rng.random() < 0.5 else f"(?:{inner})"
        else:
            atom = ATOMS[rng.integers(len(ATOMS))]
        parts.append(atom + QUANTS[rng.integers(len(QUANTS))])
    return "".join(parts)


def random_strings(rng, dfa, n: int) -> list[str]:
    """Strings in the language (random DFA walks), their mutations, and random text over a small alphabet."""
    out = []
    alphabet = list("abc .é\n1Aα😀x]-")
    for _ in range(n):
        s = dfa.sample(rng, stop=0.4, max_len=24).decode()
        out.append(s)
        if s:
            i = int(rng.integers(len(s)))
            out.append(s[:i] + s[i + 1:])                                   # a character dropped
            out.append(s[:i] + alphabet[rng.integers(len(alphabet))] + s[i:])   # one inserted
        out.append("".join(alphabet[k] for k in rng.integers(len(alphabet), size=rng.integers(0, 6))))
    return out


def test_dfa_agrees_with_re_fullmatch_on_random_patterns():
    """200 seeded random patterns x ~40 strings each (in-language walks, their one-character mutations, random
    text): the DFA (minimised or not) accepts a string exactly when re.fullmatch(pattern, s, re.ASCII) does."""
    rng = np.random.default_rng(0)
    checked = 0
    for i in range(200):
        p = random_pattern(rng)
        dfa = compile_dfa(p)
        raw = compile_dfa(p, minimize=False) if i % 4 == 0 else dfa   # the unminimised DFA: every 4th pattern
        assert dfa.num_states <= raw.num_states
        printed = unparse(parse(p))                                     # the portable spelling json_schema emits
        for s in random_strings(rng, dfa, 10):
            want = re.fullmatch(p, s, re.ASCII) is not None
            assert dfa.match(s) == want, (p, s)
            assert raw.match(s) == want, (p, s)
            assert (re.fullmatch(printed, s) is not None) == want, (p, printed, s)
            checked += 1
    assert checked > 5000


@pytest.mark.parametrize("pattern, yes, no", [
    (r"^ab$", ["ab"], ["a", "ab\n"]),
    (r"\Aa|b\Z", ["a", "b"], ["ab"]),
    (r"a{,2}b{2}", ["bb", "abb", "aabb"], ["aaabb", "b"]),
    (r"a{x}", ["a{x}"], ["a"]),                      # not a repeat: Python reads the braces literally
    (r"(?P<year>[0-9]{4})-(?#comment)[0-9]{2}", ["2024-05"], ["24-05"]),
    (r"[\b]\0\x7f", ["\b\0\x7f"], [""]),
    (r"\N{GREEK SMALL LETTER ALPHA}+", ["ααα"], ["a"]),
    (r"[^\s\S]|x", ["x"], ["", "y"]),
    (r"()*a", ["a"], [""]),
])
def test_dialect_corners(pattern, yes, no):
    dfa = compile_dfa(pattern)
    for s in yes + no:
        assert dfa.match(s) == (re.fullmatch(pattern, s, re.ASCII) is not None) == (s in yes), (pattern, s)


@pytest.mark.parametrize("pattern, construct", [
    ("(?=a)a", "lookahead"), ("(?!a)b", "negative lookahead"), ("(?<=a)b", "lookbehind"), ("(?<!a)b", "lookbehind"),
    (r"(a)\1", "backreference"), ("(?P<x>a)(?P=x)", "backreference"), ("a^b", "anchor '^'"), ("a$b", "anchor '$'"),
    ("(^a)", "anchor"), (r"\bfoo", "word boundary"), ("(?i)abc", "inline flags"), ("(?>a)", "atomic group"),
    ("a*+", "possessive"), ("[a", "unterminated character set"), ("(a", "missing ')'"), ("a)", "unbalanced"),
    ("*a", "nothing to repeat"), ("a{3,2}", "min repeat greater than max"), (r"\q", "bad escape \\q"),
    ("[z-a]", "bad character range"), ("a**", "multiple repeat"), (r"[^\s\S]", "matches no string"),
    ("(?(1)a|b)", "conditional"), (r"[\d-z]", "bad character range"), ("a{100000}", "too large"),
])
def test_refusals_name_the_construct(pattern, construct):
    with pytest.raises(RegexError) as e:
        compile_dfa(pattern)
    assert construct in str(e.value)
    assert "position" in str(e.value) or construct in ("matches no string", "too large")
    assert isinstance(e.value, ValueError)


def test_utf8_sequences_match_brute_force():
    """Random code point ranges: a code point's UTF-8 bytes fit one of the byte-range sequences exactly when it
    is in the range (surrogates never), checked on every code point near both ends and at random inside."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        lo = int(rng.integers(0, 0x110000))
        hi = min(0x10FFFF, lo + int(rng.integers(0, 1 << int(rng.integers(1, 21)))))
        seqs = utf8_sequences(lo, hi)
        probes = list(range(max(0, lo - 70), min(0x110000, lo + 70))) + \
            list(range(max(0, hi - 70), min(0x110000, hi + 70))) + rng.integers(lo, hi + 1, size=50).tolist()
        for c in probes:
            if 0xD800 <= c <= 0xDFFF:
                continue
            b = chr(c).encode()
            inside = any(len(q) == len(b) and all(a <= x <= z for (a, z), x in zip(q, b)) for q in seqs)
            assert inside == (lo <= c <= hi), (hex(lo), hex(hi), hex(c))


def test_dfa_over_bytes_accepts_only_utf8():
    """Every string a random walk of a class-heavy DFA produces is valid UTF-8 that re.fullmatch accepts."""
    p = r"[^\n]{1,5}|[\u0800-\U0001ffff]+"
    dfa, rng = compile_dfa(p), np.random.default_rng(2)
    for _ in range(300):
        s = dfa.sample(rng).decode("utf-8")                              # strict: raises on invalid UTF-8
        assert re.fullmatch(p, s, re.ASCII)


def test_forced_bytes_edges_and_distances():
    dfa = compile_dfa(r'\{"name":(true|false)\}')
    assert dfa.forced(0) == b'{"name":'                             # one way on until the alternation
    assert dfa.forced(dfa.walk(0, b'{"name":t')) == b"rue}"
    assert dfa.byte_distance()[0] == len('{"name":true}')
    labels = {(a, b): r for a, b, r in dfa.edges()}
    assert labels[(0, 1)] == [(ord("{"), ord("{"))]
    assert all(dfa.match(dfa.sample(np.random.default_rng(i))) for i in range(20))


def test_deep_nesting_is_refused_not_a_recursion_error():
    """A pattern or a schema nested past the limits is a user's ValueError naming the limit (the parser and the NFA
    builder recurse once per level: without the limit, ~250 groups raised RecursionError and could stop a server)."""
    import pytest

    from minillm.guided import schema_to_regex
    from minillm.guided.fsm import compile_dfa
    compile_dfa("(" * 99 + "a" + ")" * 99)                       # within the limit: compiles
    with pytest.raises(ValueError, match="nested more than 100 deep"):
        compile_dfa("(" * 300 + "a" + ")" * 300)
    schema = {"type": "integer"}
    for _ in range(40):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"], "additionalProperties": False}
    with pytest.raises(ValueError, match="nests deeper than"):
        schema_to_regex(schema)


def test_hashed_minimisation_equals_moores_exact_refinement(monkeypatch):
    """_minimize numbers each round's rows by a 64-bit hash (fast on long chains: a 7,003-state string of 500
    characters took 9.5 s with the exact row sort, 0.9 s hashed) and then checks the partition exactly. With a hash
    that collides on purpose (every multiplier 1: rows with equal sums collide) the check must catch it and fall
    back to the exact rounds: both give the same minimal DFA, state for state, on 100 random patterns."""
    import minillm.guided.fsm as fsm
    rng = np.random.default_rng(1)
    patterns = [random_pattern(rng) for _ in range(100)] + [r'"(?:[^"\\]|\\.){3,40}"', r"(ab|a)*b{2,9}c?"]
    hashed = [compile_dfa(p) for p in patterns]
    monkeypatch.setattr(fsm, "ROW_HASH", np.ones(257, dtype=np.int64))
    collided = [compile_dfa(p) for p in patterns]
    for p, a, b in zip(patterns, hashed, collided):
        assert (a.trans == b.trans).all() and (a.accepting == b.accepting).all(), p
    assert sum(d.num_states for d in hashed) > 300                  # not only one-state patterns
