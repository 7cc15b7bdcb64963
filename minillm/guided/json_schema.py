"""A JSON-schema subset -> a regex whose every match is a JSON document that validates, as Outlines does
(outlines.fsm.json_schema.build_regex_from_schema; Willard & Louf 2023). Compact separators: no whitespace at
all, so `{"a":1,"b":[true]}` and never `{ "a": 1 }`; keys in the order `properties` lists them.

The subset, and how each keyword is kept:
    type           object, array, string, integer, number, boolean, null, or a list of these (one of them)
    enum, const    exactly the listed values, written as json.dumps writes them compactly
    anyOf          one of the branches
    object         properties (in their order), required (the others may be left out: every subset of the
                   optional ones, in order), additionalProperties: false, true or absent all give only the
                   listed properties (a valid instance either way); with no properties, additionalProperties
                   must be a schema: a map from any string to that schema
    string         minLength, maxLength (in characters, as jsonschema counts them: an escape is one; \\u escapes
                   of surrogates are left out so that each unit is one code point), or pattern (jsonschema
                   searches for it; here the whole string fullmatches it, anchors or not, a valid subset; it may
                   not produce '"', '\\' or control characters, which JSON would have to escape)
    integer        minimum, maximum, exclusiveMinimum, exclusiveMaximum: exact, as digit-range regexes
    number         the same bounds, rounded INWARD to integers (minimum 0.5 -> 1, exclusiveMaximum 3 -> 2), and
                   then no exponent: x = I.F lies in [lo, hi] iff I is in [lo, hi - 1] (any fraction) or I = hi
                   (a zero fraction). Every number produced validates; those between a fractional bound and the
                   next integer are never produced. Unbounded numbers may have a fraction and an exponent.
    array          items (one schema for every item), minItems, maxItems
    boolean, null
Annotations (title, description, default, examples, $schema, $id, $comment) are ignored. Anything else
($ref, oneOf, allOf, not, format, multipleOf, uniqueItems, prefixItems, patternProperties, ...) is refused with
a ValueError naming the keyword and where it is.
"""
from __future__ import annotations

import json
import math
import re

from .fsm import compile_dfa
from .regex import MAX_PATTERN_CHARS, RegexError, parse, unparse

STRING_UNIT = (r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]'
               r'|\\u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))')   # one character of a JSON string
INTEGER = r"-?(?:0|[1-9][0-9]*)"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
SCALARS = {"boolean": "(?:true|false)", "null": "null"}

ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "readOnly",
               "writeOnly", "deprecated"}
KEYWORDS = {"object": {"properties", "required", "additionalProperties"},
            "array": {"items", "minItems", "maxItems"},
            "string": {"minLength", "maxLength", "pattern"},
            "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
            "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
            "boolean": set(), "null": set()}
TYPES = tuple(KEYWORDS)


def schema_to_regex(schema) -> str:
    """A schema (dict, JSON text, or a bool) -> a regex in minillm.guided.regex's dialect. Raises ValueError
    naming a keyword outside the subset, or a schema no value satisfies."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"guided_json: not valid JSON text ({e})") from None
    pattern = _value(schema, "#")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"guided_json: the schema's regex has {len(pattern)} characters, more than "
                         f"{MAX_PATTERN_CHARS} (long enums, many properties or deep anyOf): simplify the schema")
    return pattern


MAX_PATH_DEPTH = 24        # /properties/x or /items steps: a few levels of nesting, as real schemas have
MAX_LEADING_OPTIONAL = 24  # optional properties before an object's first required one (see _object)

def _fail(path: str, what: str) -> ValueError:
    return ValueError(f"guided_json: {what} (at {path})")


def _literal(value) -> str:
    return re.escape(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _value(schema, path: str) -> str:
    if path.count("/") > MAX_PATH_DEPTH:      # compiling recurses once per level: refuse, never overflow
        raise _fail(path, f"the schema nests deeper than {MAX_PATH_DEPTH} path steps")
    if schema is True or schema == {}:
        raise _fail(path, "a schema that allows any JSON value is outside the supported subset: give a 'type'")
    if schema is False:
        raise _fail(path, "the schema false allows no value")
    if not isinstance(schema, dict):
        raise _fail(path, f"a schema must be an object (a dict), got {type(schema).__name__}")
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types
    known = ANNOTATIONS | {"type", "enum", "const", "anyOf"} | set().union(*KEYWORDS.values())
    for kw in schema:
        if kw not in known:
            raise _fail(path, f"the schema keyword {kw!r} is outside the supported subset (type, enum, const, anyOf, "
                              "properties, required, additionalProperties, items, minItems, maxItems, minLength, "
                              "maxLength, pattern, minimum, maximum, exclusiveMinimum, exclusiveMaximum)")
    if types is not None and (not isinstance(types, list) or not types or any(t not in TYPES for t in types)):
        raise _fail(path, f"type {schema['type']!r}: expected one of {list(TYPES)} or a non-empty list of them")
    if "enum" in schema or "const" in schema:
        return _enum(schema, types, path)
    if "anyOf" in schema:
        return _any_of(schema, types, path)
    if types is None:
        raise _fail(path, "a schema without 'type' (or enum, const, anyOf) is outside the supported subset")
    used = set(schema) - ANNOTATIONS - {"type"}
    for kw in used:
        if not any(kw in KEYWORDS[t] for t in types):
            raise _fail(path, f"the keyword {kw!r} does not apply to type {schema['type']!r}")
    branches = [_typed(t, schema, path) for t in types]
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


def _enum(schema, types, path: str) -> str:
    if set(schema) - ANNOTATIONS - {"type", "enum", "const"}:
        raise _fail(path, "enum / const together with other keywords is outside the supported subset "
                          f"({sorted(set(schema) - ANNOTATIONS - {'type', 'enum', 'const'})})")
    if "const" in schema:
        values = [schema["const"]]
    elif isinstance(schema["enum"], list) and schema["enum"]:
        values = schema["enum"]
    else:
        raise _fail(path, f"enum must be a non-empty list, got {schema['enum']!r}")
    if types is not None:
        values = [v for v in values if any(_is_type(v, t) for t in types)]
        if not values:
            raise _fail(path, f"no value of enum / const has type {schema['type']!r}")
    return "(?:" + "|".join(_literal(v) for v in values) + ")"


def _is_type(v, t: str) -> bool:
    return {"object": isinstance(v, dict), "array": isinstance(v, list), "string": isinstance(v, str),
            "integer": isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer(),
            "number": isinstance(v, (int, float)) and not isinstance(v, bool),
            "boolean": isinstance(v, bool), "null": v is None}[t]


def _any_of(schema, types, path: str) -> str:
    if types is not None or set(schema) - ANNOTATIONS - {"anyOf"}:
        raise _fail(path, "anyOf together with other keywords is outside the supported subset: put them in each branch")
    if not isinstance(schema["anyOf"], list) or not schema["anyOf"]:
        raise _fail(path, "anyOf must be a non-empty list of schemas")
    return "(?:" + "|".join(_value(s, f"{path}/anyOf/{i}") for i, s in enumerate(schema["anyOf"])) + ")"


def _typed(t: str, schema: dict, path: str) -> str:
    if t in SCALARS:
        return SCALARS[t]
    if t == "string":
        return _string(schema, path)
    if t in ("integer", "number"):
        return _numeric(t, schema, path)
    if t == "array":
        return _array(schema, path)
    return _object(schema, path)


# ---------------------------------------------------------------------------- strings
def _count(schema, lo_key: str, hi_key: str, path: str) -> tuple[int, int | None]:
    lo, hi = schema.get(lo_key, 0), schema.get(hi_key)
    for k, v in ((lo_key, lo), (hi_key, hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise _fail(path, f"{k} must be a non-negative integer, got {v!r}")
    if hi is not None and hi < lo:
        raise _fail(path, f"{lo_key}={lo} > {hi_key}={hi}: no value satisfies both")
    return lo, hi


def _repeat(lo: int, hi: int | None) -> str:
    return f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}"


def _string(schema: dict, path: str) -> str:
    if "pattern" in schema:
        if "minLength" in schema or "maxLength" in schema:
            raise _fail(path, "pattern together with minLength / maxLength is outside the supported subset")
        pattern = schema["pattern"]
        if not isinstance(pattern, str):
            raise _fail(path, f"pattern must be a string, got {pattern!r}")
        try:
            dfa = compile_dfa(pattern)
        except RegexError as e:
            raise _fail(path, f"pattern {pattern!r}: {str(e).split(': ', 1)[-1]}") from None
        bad = [b for b in (0x22, 0x5C, *range(0x20)) if (dfa.trans[:, b] >= 0).any()]
        if bad:
            raise _fail(path, f"pattern {pattern!r} can produce {chr(bad[0])!r}, which a JSON string must escape")
        return '"(?:' + unparse(parse(pattern)) + ')"'      # anchors dropped: the pattern fills the quotes
    lo, hi = _count(schema, "minLength", "maxLength", path)
    return '"' + STRING_UNIT + _repeat(lo, hi) + '"'


# ---------------------------------------------------------------------------- integers and numbers
def _bounds(schema: dict, path: str) -> tuple[int | None, int | None]:
    """The integer bounds inside the schema's: minimum -> ceil, exclusiveMinimum -> floor + 1 (and mirrored)."""
    lo = hi = None
    for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        v = schema.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _fail(path, f"{k} must be a finite number, got {v!r} (draft-4 boolean exclusive bounds are not "
                              "supported)")
        if k == "minimum":
            lo = max(lo, math.ceil(v)) if lo is not None else math.ceil(v)
        elif k == "exclusiveMinimum":
            lo = max(lo, math.floor(v) + 1) if lo is not None else math.floor(v) + 1
        elif k == "maximum":
            hi = min(hi, math.floor(v)) if hi is not None else math.floor(v)
        else:
            hi = min(hi, math.ceil(v) - 1) if hi is not None else math.ceil(v) - 1
    if lo is not None and hi is not None and lo > hi:
        raise _fail(path, f"no integer lies within the bounds (minimum {lo} > maximum {hi} after rounding inward)")
    return lo, hi


def _numeric(t: str, schema: dict, path: str) -> str:
    lo, hi = _bounds(schema, path)
    if lo is None and hi is None:
        return INTEGER if t == "integer" else NUMBER
    if t == "integer":
        return int_range(lo, hi)
    return number_range(lo, hi)


def _digits(a: str, b: str) -> list[str]:
    """Regexes for the integers a..b written with the same number of digits (a <= b)."""
    if a == b:
        return [a]
    n = len(a)
    if a[1:] == "0" * (n - 1) and b[1:] == "9" * (n - 1):
        return [_cls(a[0], b[0]) + "[0-9]" * (n - 1)]
    if a[0] == b[0]:
        return [a[0] + r for r in _digits(a[1:], b[1:])]
    out, first, last = [], a[0], b[0]
    if a[1:] != "0" * (n - 1):
        out += [a[0] + r for r in _digits(a[1:], "9" * (n - 1))]
        first = str(int(a[0]) + 1)
    tail = []
    if b[1:] != "9" * (n - 1):
        tail = [b[0] + r for r in _digits("0" * (n - 1), b[1:])]
        last = str(int(b[0]) - 1)
    if first <= last:
        out.append(_cls(first, last) + "[0-9]" * (n - 1))
    return out + tail


def _cls(a: str, b: str) -> str:
    return a if a == b else f"[{a}-{b}]"


def _nonneg(a: int, b: int | None) -> list[str]:
    """Regexes for the non-negative integers a..b (b None: unbounded), without leading zeros."""
    out = []
    top = len(str(b)) if b is not None else len(str(a))
    for d in range(len(str(a)), top + 1):
        lo, hi = max(a, 10 ** (d - 1) if d > 1 else 0), 10 ** d - 1 if b is None else min(b, 10 ** d - 1)
        if lo <= hi:
            out += _digits(str(lo), str(hi))
    if b is None:
        out.append(f"[1-9][0-9]{{{len(str(a))},}}")
    return out


def int_range(lo: int | None, hi: int | None) -> str:
    """A regex for the integers in [lo, hi] (None: unbounded), written as JSON writes them."""
    parts = []
    if hi is None or hi >= 0:
        parts += _nonneg(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        parts += ["-(?:" + "|".join(_nonneg(max(1, -hi) if hi is not None else 1, None if lo is None else -lo)) + ")"]
    return "(?:" + "|".join(parts) + ")"


def number_range(lo: int | None, hi: int | None) -> str:
    """A regex for decimal numbers (no exponent) in [lo, hi], lo and hi integers or None."""
    def magnitude(a: int, b: int | None) -> str:        # I(.F)? in [a, b]: I in [a, b - 1], or I = b, F zero
        parts = []
        if b is None or b - 1 >= a:
            parts.append("(?:" + "|".join(_nonneg(a, None if b is None else b - 1)) + r")(?:\.[0-9]+)?")
        if b is not None:
            parts.append(str(b) + r"(?:\.0+)?")
        return "(?:" + "|".join(parts) + ")"
    parts = []
    if hi is None or hi >= 0:
        parts.append(magnitude(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        parts.append("-" + magnitude(max(0, -hi) if hi is not None else 0, None if lo is None else -lo))
    return "(?:" + "|".join(parts) + ")"


# ---------------------------------------------------------------------------- arrays and objects
def _array(schema: dict, path: str) -> str:
    if "items" not in schema:
        raise _fail(path, "an array schema needs 'items' (a schema for every item): any JSON value is outside "
                          "the supported subset")
    item = _value(schema["items"], f"{path}/items")
    lo, hi = _count(schema, "minItems", "maxItems", path)
    if hi == 0:
        return r"\[\]"
    more = f"(?:,{item}){_repeat(max(lo - 1, 0), None if hi is None else hi - 1)}"
    body = f"{item}{more}"
    return rf"\[{body}\]" if lo > 0 else rf"\[(?:{body})?\]"


def _object(schema: dict, path: str) -> str:
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(props, dict):
        raise _fail(path, f"properties must be an object, got {props!r}")
    if not isinstance(required, list) or any(not isinstance(r, str) for r in required):
        raise _fail(path, f"required must be a list of strings, got {required!r}")
    missing = [r for r in required if r not in props]
    if missing:
        raise _fail(path, f"required {missing} not in properties: their values would have no schema")
    if not props:
        if extra is False:
            return r"\{\}"
        if not isinstance(extra, dict):
            raise _fail(path, "an object with no 'properties' may hold any JSON value, outside the supported "
                              "subset: give properties, or additionalProperties: <a schema>")
        pair = '"' + STRING_UNIT + '*":' + _value(extra, f"{path}/additionalProperties")
        return rf"\{{(?:{pair}(?:,{pair})*)?\}}"
    leading = next((i for i, k in enumerate(props) if k in required), len(props))
    if leading > MAX_LEADING_OPTIONAL:     # each may be the first one present: the regex repeats the rest per choice
        raise _fail(path, f"{leading} optional properties come before the first required one, more than "
                          f"{MAX_LEADING_OPTIONAL} (the regex holds a copy of the later ones for each that may come "
                          "first: its size grows as their square): list a required property first, or mark more "
                          "required")
    items = [(_literal(k) + ":" + _value(v, f"{path}/properties/{k}"), k in required) for k, v in props.items()]

    def rest(i: int, first: bool) -> str:             # the items from i on, comma-joined, every required one present
        if i == len(items):
            return ""
        text, req = items[i]
        this = ("" if first else ",") + text
        if req:
            return this + rest(i + 1, False)
        if not first:                                 # linear when something came before: (,item)? for each
            return f"(?:{this})?" + rest(i + 1, False)
        return f"(?:{this}{rest(i + 1, False)}|{rest(i + 1, True)})"
    return r"\{" + rest(0, True) + r"\}"
