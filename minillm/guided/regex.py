"""A regular-expression parser: pattern text -> a small AST (Chars, Concat, Alt, Repeat), the first stage of
structured output (regex -> DFA -> token masks, as Outlines does: Willard & Louf 2023, "Efficient Guided
Generation for Large Language Models").

The dialect is Python's `re` with the ASCII flag, matched as re.fullmatch (the whole output is the match):
literals, escapes (\\n \\t \\xhh \\uhhhh \\N{name} ...), classes [a-z] [^"] and \\d \\w \\s (ASCII, as re.ASCII: \\d is
[0-9]), `.` (anything but a newline), groups ( ), (?: ), (?P<name> ), alternation |, and the quantifiers * + ?
{n} {n,} {,m} {n,m} (lazy ones too: laziness picks among matches, it does not change which strings match).
`^` / `\\A` where nothing can come before and `$` / `\\Z` where nothing can come after are accepted and mean nothing
under fullmatch. What a finite automaton cannot do, or what this parser leaves out, is refused with a RegexError
(a ValueError) naming the construct and its position: lookaround, backreferences, anchors and word boundaries
inside the pattern, inline flags, atomic groups, possessive quantifiers, conditionals.
Characters are Unicode code points; surrogates (U+D800..U+DFFF) are left out, as UTF-8 cannot carry them.
"""
from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

MAX_CODE = 0x10FFFF


MAX_DEPTH = 100            # nested groups a pattern may have
MAX_PATTERN_CHARS = 100_000   # a pattern's length: parsing is Python, about a second per 100k characters

class RegexError(ValueError):
    """A pattern this dialect does not accept; the message names the construct and where it is."""


# ---------------------------------------------------------------------------- the AST
@dataclass(frozen=True)
class Chars:
    """One character from a set: sorted, disjoint, inclusive code point ranges ((lo, hi), ...)."""
    ranges: tuple


@dataclass(frozen=True)
class Concat:
    parts: tuple            # () is the empty string


@dataclass(frozen=True)
class Alt:
    options: tuple


@dataclass(frozen=True)
class Repeat:
    item: object
    lo: int
    hi: int | None          # None: unbounded


def normalize(ranges) -> tuple:
    """Sort and merge overlapping or touching (lo, hi) ranges."""
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def negate(ranges) -> tuple:
    """Every code point not in ranges."""
    out, at = [], 0
    for lo, hi in normalize(ranges):
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CODE:
        out.append((at, MAX_CODE))
    return tuple(out)


DIGIT = ((0x30, 0x39),)
WORD = normalize([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
SPACE = normalize([(0x09, 0x0D), (0x20, 0x20)])
CLASSES = {"d": DIGIT, "D": negate(DIGIT), "w": WORD, "W": negate(WORD), "s": SPACE, "S": negate(SPACE)}
SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
EVERYTHING_BUT_NEWLINE = negate(((0x0A, 0x0A),))


def literal(text: str) -> Concat:
    """The AST matching exactly this text."""
    return Concat(tuple(Chars(((ord(c), ord(c)),)) for c in text))


# ---------------------------------------------------------------------------- the parser
class _Parser:
    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0

    def fail(self, what: str, at: int | None = None) -> RegexError:
        at = self.i if at is None else at
        shown = repr(self.p) if len(self.p) <= 200 else repr(self.p[:200]) + f"... ({len(self.p)} characters)"
        return RegexError(f"guided_regex: {what} at position {at} of {shown}")

    def peek(self, n: int = 1) -> str:
        return self.p[self.i:self.i + n]

    def parse(self):
        node = self.alternation(depth=0)
        if self.i < len(self.p):               # only an unmatched ')' stops the top level early
            raise self.fail("unbalanced parenthesis ')'")
        return node

    def alternation(self, depth: int):
        options = [self.sequence(depth)]
        while self.peek() == "|":
            self.i += 1
            options.append(self.sequence(depth))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self, depth: int):
        parts, begin = [], self.i
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            at, c = self.i, self.p[self.i]
            if c in "^$" or self.peek(2) in ("\\A", "\\Z"):
                self.i += 1 if c in "^$" else 2
                start = c == "^" or self.p[at:at + 2] == "\\A"
                ok = depth == 0 and (at == begin if start else self.i == len(self.p) or self.peek() == "|")
                if not ok:
                    raise self.fail(f"anchor {self.p[at:self.i]!r} inside the pattern (a match is the whole output: "
                                    "anchors are allowed only at its very start or end)", at)
                continue
            parts.append(self.quantified(self.atom(depth)))
        return parts[0] if len(parts) == 1 else Concat(tuple(parts))

    def quantified(self, node):
        counted = False
        while self.i < len(self.p):
            q = self.quantifier()
            if q is None:
                return node
            if counted:
                raise self.fail("multiple repeat (a quantifier on a quantifier)")
            lo, hi = q
            if self.peek() == "+":
                raise self.fail("possessive quantifier")
            if self.peek() == "?":             # lazy: the same set of strings under fullmatch
                self.i += 1
            node, counted = Repeat(node, lo, hi), True
        return node

    def quantifier(self):
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        if c != "{":
            return None
        end = self.p.find("}", self.i)
        body = self.p[self.i + 1:end] if end > 0 else ""
        lo, comma, hi = body.partition(",")
        if end < 0 or not (lo.isdigit() or (comma and not lo)) or not (hi.isdigit() or not hi) or \
                not (lo + hi).isascii():
            return None                        # not a repeat: Python reads '{' as a literal brace
        lo_n, hi_n = int(lo or 0), (int(hi) if hi else None) if comma else int(lo)
        if hi_n is not None and hi_n < lo_n:
            raise self.fail(f"min repeat greater than max repeat in {{{body}}}")
        self.i = end + 1
        return lo_n, hi_n

    def atom(self, depth: int):
        c = self.p[self.i]
        if c == "(":
            return self.group(depth)
        if c == "[":
            return Chars(self.char_class())
        if c == ".":
            self.i += 1
            return Chars(EVERYTHING_BUT_NEWLINE)
        if c in "*+?" or (c == "{" and self.quantifier_here()):
            raise self.fail("nothing to repeat")
        if c == "\\":
            return self.escape()
        self.i += 1
        return Chars(normalize([(ord(c), ord(c))]))

    def quantifier_here(self) -> bool:
        at = self.i
        try:
            return self.quantifier() is not None
        finally:
            self.i = at

    def group(self, depth: int):
        at = self.i
        if depth >= MAX_DEPTH:     # the parser and the NFA builder recurse once per level: refuse, never overflow
            raise self.fail(f"groups nested more than {MAX_DEPTH} deep", at)
        self.i += 1
        if self.peek() == "?":
            kind = self.peek(3)
            if kind.startswith("?:"):
                self.i += 2
            elif kind == "?P<":
                end = self.p.find(">", self.i)
                if end < 0:
                    raise self.fail("unterminated group name", at)
                self.i = end + 1
            elif kind == "?P=":
                raise self.fail("backreference (?P=name)", at)
            elif kind.startswith("?#"):
                end = self.p.find(")", self.i)
                if end < 0:
                    raise self.fail("unterminated comment (?#", at)
                self.i = end + 1
                return Concat(())
            else:
                names = {"?=": "lookahead (?=", "?!": "negative lookahead (?!", "?<": "lookbehind (?<",
                         "?>": "atomic group (?>", "?(": "conditional (?("}
                what = next((v for k, v in names.items() if kind.startswith(k)), None)
                raise self.fail(what or f"inline flags or group syntax {self.p[at:at + 4]!r}", at)
        node = self.alternation(depth + 1)
        if self.peek() != ")":
            raise self.fail("missing ')', unterminated group", at)
        self.i += 1
        return node

    def escape(self):
        at = self.i
        self.i += 1
        if self.i >= len(self.p):
            raise self.fail("bad escape (end of pattern)", at)
        c = self.p[self.i]
        self.i += 1
        if c in CLASSES:
            return Chars(CLASSES[c])
        if c in "bB":
            raise self.fail(f"word boundary \\{c}", at)
        if c.isdigit() and c != "0":
            raise self.fail(f"backreference \\{c}", at)
        return Chars(normalize([(self.code_point(c, at, False),) * 2]))

    def code_point(self, c: str, at: int, in_class: bool) -> int:
        """The character an escape \\c (already consumed) stands for."""
        if c in SIMPLE:
            return ord(SIMPLE[c])
        if c == "b" and in_class:
            return 8                           # [\b] is backspace
        if c == "0":
            digits = ""
            while len(digits) < 2 and self.peek() and self.peek() in "01234567":
                digits += self.p[self.i]
                self.i += 1
            return int("0" + digits, 8)
        if c in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[c]
            hexa = self.p[self.i:self.i + n]
            if len(hexa) != n or any(h not in "0123456789abcdefABCDEF" for h in hexa):
                raise self.fail(f"incomplete escape \\{c}{hexa}", at)
            self.i += n
            code = int(hexa, 16)
            if code > MAX_CODE:
                raise self.fail(f"bad escape \\{c}{hexa} (beyond U+10FFFF)", at)
            return code
        if c == "N":
            end = self.p.find("}", self.i)
            if self.peek() != "{" or end < 0:
                raise self.fail("missing {name} after \\N", at)
            name = self.p[self.i + 1:end]
            try:
                code = ord(unicodedata.lookup(name))
            except KeyError:
                raise self.fail(f"undefined character name {name!r}", at) from None
            self.i = end + 1
            return code
        if c.isascii() and c.isalnum():
            raise self.fail(f"bad escape \\{c}", at)
        return ord(c)

    def char_class(self) -> tuple:
        at = self.i
        self.i += 1
        negated = self.peek() == "^"
        self.i += negated
        ranges, first = [], True
        while True:
            if self.i >= len(self.p):
                raise self.fail("unterminated character set '['", at)
            c = self.p[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self.class_item()
            ranged = self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]"
            if isinstance(lo, tuple):          # \d, \w, \s and their negations
                if ranged:
                    raise self.fail("bad character range (a class as its start)")
                ranges += lo
                continue
            if ranged:
                dash = self.i
                self.i += 1
                hi = self.class_item()
                if isinstance(hi, tuple):
                    raise self.fail("bad character range (a class as its end)", dash)
                if hi < lo:
                    raise self.fail(f"bad character range {chr(lo)!r}-{chr(hi)!r}", dash)
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        out = normalize(ranges)
        return negate(out) if negated else out

    def class_item(self):
        """One member of a class: a code point, or a tuple of ranges for \\d \\w \\s and their negations."""
        c = self.p[self.i]
        self.i += 1
        if c != "\\":
            return ord(c)
        at = self.i - 1
        if self.i >= len(self.p):
            raise self.fail("unterminated character set", at)
        e = self.p[self.i]
        self.i += 1
        if e in CLASSES:
            return CLASSES[e]
        if e.isdigit() and e != "0":
            raise self.fail(f"backreference or octal escape \\{e} in a class", at)
        if e in "AZB":
            raise self.fail(f"bad escape \\{e} in a class", at)
        return self.code_point(e, at, in_class=True)


def parse(pattern: str):
    """Pattern text -> its AST. Raises RegexError (a ValueError) naming an unsupported construct."""
    if not isinstance(pattern, str):
        raise RegexError(f"guided_regex must be a str, got {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexError(f"guided_regex: the pattern has {len(pattern)} characters, more than {MAX_PATTERN_CHARS}")
    return _Parser(pattern).parse()


# ---------------------------------------------------------------------------- sizes, before any automaton
def min_bytes(node) -> float:
    """The fewest UTF-8 bytes of a string the AST matches (inf: none), from the tree alone: what a guided request's
    max_tokens is checked against before its DFA is built (minillm.guided.budget)."""
    if isinstance(node, Chars):    # a range's lowest code point has its shortest encoding (one of surrogates only
        return min((1 if lo < 0x80 else 2 if lo < 0x800 else 3 if lo < 0x10000 else 4 for lo, _ in node.ranges),
                   default=math.inf)             # matches nothing: counting it as 3 bytes only lowers the bound)
    if isinstance(node, Concat):
        return sum(min_bytes(p) for p in node.parts)
    if isinstance(node, Alt):
        return min((min_bytes(o) for o in node.options), default=math.inf)
    return node.lo * min_bytes(node.item) if node.lo else 0


# ---------------------------------------------------------------------------- AST -> pattern text
def _char(c: int, in_class: bool = False) -> str:
    special = "\\]^-[" if in_class else "\\.^$|?*+()[]{}"
    if 0x20 < c < 0x7F:
        return ("\\" + chr(c)) if chr(c) in special else chr(c)
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def unparse(node) -> str:
    """An AST as pattern text that Python's re, Rust's regex (outlines-core) and this parser all read the same way:
    no anchors, classes spelled out (\\d becomes [0-9]), non-ASCII as \\x / \\u / \\U escapes."""
    if isinstance(node, Chars):
        if len(node.ranges) == 1 and node.ranges[0][0] == node.ranges[0][1]:
            return _char(node.ranges[0][0])
        if not node.ranges:
            return "[^\\x00-\\U0010ffff]"
        spans = (_char(lo, True) + ("" if lo == hi else "-" + _char(hi, True)) for lo, hi in node.ranges)
        return "[" + "".join(spans) + "]"
    if isinstance(node, Alt):
        return "|".join(unparse(o) for o in node.options)
    if isinstance(node, Concat):
        return "".join(f"(?:{unparse(p)})" if isinstance(p, Alt) else unparse(p) for p in node.parts)
    item = unparse(node.item)
    if not (isinstance(node.item, Chars) or (isinstance(node.item, Concat) and len(node.item.parts) == 1
                                              and isinstance(node.item.parts[0], Chars))):
        item = f"(?:{item})"
    hi = "" if node.hi is None else str(node.hi)
    quant = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((node.lo, node.hi), f"{{{node.lo},{hi}}}")
    return item + quant
