"""JSON schema -> regex (minillm.guided.json_schema), with jsonschema as the oracle: every string the regex
accepts (random DFA walks) parses and validates; valid instances written compactly are accepted; invalid ones
are not; integer and number bounds against brute force; keywords outside the subset refused by name."""
import json
import re

import jsonschema
import numpy as np
import pytest

from minillm.guided import compile_dfa, schema_to_regex
from minillm.guided.json_schema import int_range, number_range

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.(com|org)$"},
                         "role": {"enum": ["admin", "user", None, 3]}}}
ORDER = {"type": "object", "required": ["id", "items"],
         "properties": {"id": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 1000},
                        "items": {"type": "array", "minItems": 1, "maxItems": 3,
                                  "items": {"type": "object", "required": ["sku", "qty"], "additionalProperties": False,
                                            "properties": {"sku": {"type": "string", "maxLength": 4},
                                                           "qty": {"type": "number", "minimum": -2.5,
                                                                   "maximum": 10}}}},
                        "paid": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 3}}}
MIXED = {"type": "object", "required": ["kind", "tags", "meta"],
         "properties": {"kind": {"const": "event"},
                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 2},
                        "meta": {"type": "object", "additionalProperties": {"type": "integer"}},
                        "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                        "opt1": {"type": "boolean"}, "opt2": {"type": "null"}}}
SCHEMAS = {"person": PERSON, "order": ORDER, "mixed": MIXED}

VALID = {"person": [{"name": "Ann", "age": 0}, {"name": "bé\"\\\n", "age": 120, "email": "a@b.org", "role": None},
                    {"name": "x", "age": 7, "role": 3}],
         "order": [{"id": -4, "items": [{"sku": "", "qty": -2}]},
                   {"id": 999, "items": [{"sku": "ab", "qty": 10}, {"sku": "é", "qty": 9.75}], "paid": True,
                    "note": None}],
         "mixed": [{"kind": "event", "tags": [], "meta": {}},
                   {"kind": "event", "tags": ["a", "bc"], "meta": {"k": -3, "": 0}, "score": 1.5e3, "opt2": None}]}
INVALID = {"person": [{"name": "", "age": 1}, {"name": "Ann", "age": 121}, {"name": "Ann"},
                      {"name": "Ann", "age": 1, "extra": 1}, {"name": "Ann", "age": 1, "email": "a@b.net"},
                      {"name": "toolongname", "age": 1}, {"name": "A", "age": 1.5}],
           "order": [{"id": -5, "items": [{"sku": "", "qty": 1}]}, {"id": 1000, "items": [{"sku": "", "qty": 1}]},
                     {"id": 1, "items": []}, {"id": 1, "items": [{"sku": "", "qty": 10.5}]},
                     {"id": 1, "items": [{"sku": "", "qty": -2.75}]}],
           "mixed": [{"kind": "other", "tags": [], "meta": {}}, {"kind": "event", "tags": ["abc"], "meta": {}},
                     {"kind": "event", "tags": [], "meta": {"k": "v"}}]}


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@pytest.fixture(scope="module")
def dfas():
    return {name: compile_dfa(schema_to_regex(s)) for name, s in SCHEMAS.items()}


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_accepted_string_parses_and_validates(name, dfas):
    """300 random walks of the schema's DFA per schema: each is valid UTF-8 JSON that jsonschema validates."""
    rng = np.random.default_rng(0)
    validator = jsonschema.Draft202012Validator(SCHEMAS[name])
    for _ in range(300):
        text = dfas[name].sample(rng, stop=0.5, max_len=80).decode("utf-8")
        validator.validate(json.loads(text))


@pytest.mark.parametrize("name", SCHEMAS)
def test_valid_instances_accepted_invalid_rejected(name, dfas):
    validator = jsonschema.Draft202012Validator(SCHEMAS[name])
    for v in VALID[name]:
        assert validator.is_valid(v)
        assert dfas[name].match(compact(v)), compact(v)
    for v in INVALID[name]:
        assert not validator.is_valid(v), v
        assert not dfas[name].match(compact(v)), compact(v)


def test_fractional_number_bounds_round_inward():
    """minimum -2.5 -> -2: -2.75 is invalid and refused; -2.25 is valid but never produced (documented)."""
    dfa = compile_dfa(schema_to_regex({"type": "number", "minimum": -2.5, "maximum": 10}))
    assert not dfa.match("-2.75") and not dfa.match("-2.25") and dfa.match("-2.0") and dfa.match("9.99")
    assert dfa.match("10.000") and not dfa.match("10.01") and not dfa.match("1e1")


def test_integer_ranges_against_brute_force():
    """int_range(lo, hi) fullmatches str(k) exactly when lo <= k <= hi, for k in [-1300, 1300] (None: unbounded);
    never a leading zero or '-0'."""
    rng = np.random.default_rng(3)
    cases = [(0, 0), (-1, 1), (7, 7), (None, 5), (-3, None), (None, -12), (100, None), (0, None), (None, None)]
    cases += [tuple(sorted(rng.integers(-1200, 1200, size=2).tolist())) for _ in range(12)]
    for lo, hi in cases:
        dfa = compile_dfa(int_range(lo, hi))
        for k in range(-1300, 1301):
            assert dfa.match(str(k)) == ((lo is None or k >= lo) and (hi is None or k <= hi)), (lo, hi, k)
        assert not dfa.match("007") and not dfa.match("-0") and not dfa.match("")


def test_number_ranges_sound_against_brute_force():
    """number_range(lo, hi): every decimal string it accepts among a grid of candidates lies in [lo, hi], and every
    integer-valued one in range is accepted."""
    cands = [f"{s}{i}{f}" for s in ("", "-") for i in range(0, 25) for f in ("", ".0", ".5", ".00", ".25", ".999")]
    for lo, hi in [(0, 10), (-3, 3), (None, -2), (5, None), (-20, -10), (2, 2)]:
        dfa = compile_dfa(number_range(lo, hi))
        for c in cands:
            x = float(c)
            inside = (lo is None or x >= lo) and (hi is None or x <= hi)
            if dfa.match(c):
                assert inside, (lo, hi, c)
            elif inside and x == int(x) and not c.startswith("-0") and "." not in c:
                raise AssertionError(f"{c} in [{lo}, {hi}] refused")


def test_optional_properties_keep_order_and_commas():
    s = {"type": "object", "properties": {k: {"type": "null"} for k in "abcd"}, "required": ["c"]}
    dfa = compile_dfa(schema_to_regex(s))
    for keys in ["c", "ac", "bc", "abc", "cd", "abcd", "bcd", "acd"]:
        assert dfa.match(compact({k: None for k in keys})), keys
    for bad in ['{"a":null}', '{"c":null,"a":null}', '{,"c":null}', '{"c":null,}', "{}"]:
        assert not dfa.match(bad), bad


def test_regex_is_also_a_python_regex():
    """The emitted regex means the same to Python's re (ASCII): spot-check on the valid instances."""
    for name, schema in SCHEMAS.items():
        pattern = schema_to_regex(schema)
        for v in VALID[name]:
            assert re.fullmatch(pattern, compact(v), re.ASCII)


@pytest.mark.parametrize("schema, named", [
    ({"type": "string", "format": "date"}, "'format'"), ({"$ref": "#/$defs/x"}, "'$ref'"),
    ({"oneOf": [{"type": "null"}]}, "'oneOf'"), ({"type": "integer", "multipleOf": 2}, "'multipleOf'"),
    ({"type": "object"}, "'properties'"), ({"type": "array"}, "'items'"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength=5 > maxLength=2"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "no integer"),
    ({"type": "number", "minimum": 0.2, "maximum": 0.8}, "no integer"),
    ({"type": "string", "pattern": 'a"b'}, "must escape"), ({"type": "string", "pattern": "(?=a)"}, "lookahead"),
    ({"type": "foo"}, "type 'foo'"), (True, "any JSON value"), (False, "allows no value"), ({}, "any JSON value"),
    ({"type": "object", "properties": {"a": {"type": "null"}}, "required": ["b"]}, "required ['b']"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "format": "uri"}}}},
     "#/properties/a/items"),
    ({"type": "string", "minimum": 1}, "does not apply"), ("{not json", "not valid JSON"),
    ({"type": "integer", "exclusiveMinimum": True}, "draft-4"),
])
def test_outside_the_subset_refused_by_name(schema, named):
    with pytest.raises(ValueError) as e:
        schema_to_regex(schema)
    assert named in str(e.value) and "guided_json" in str(e.value)
