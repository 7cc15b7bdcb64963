"""What a guided compile may cost (minillm.guided.budget; the hostile-user issue's N2): the length check on the
pattern's tree before any state is built, the states a vocabulary's mask tables may hold, the time budget, the
size limits of schemas and patterns, and the cache shared by the server's prepare threads."""
import concurrent.futures as cf
import math

import numpy as np
import pytest
from test_guided_regex import random_pattern

import minillm.guided.budget as budget_mod
import minillm.guided.token_index as token_index
from minillm import LLM, SamplingParams
from minillm.guided import RegexError, compile_dfa, compile_json, compile_regex, parse, schema_to_regex
from minillm.guided.budget import CompileBudget, max_states
from minillm.guided.json_schema import MAX_LEADING_OPTIONAL
from minillm.guided.regex import MAX_PATTERN_CHARS, min_bytes

LONG_STRING = {"type": "string", "minLength": 500}


@pytest.fixture(scope="module")
def llm():
    return LLM("shakespeare")


def test_min_bytes_is_the_shortest_match_the_dfa_finds():
    """The tree's bound is exact wherever a pattern matches something: it equals the DFA's fewest bytes from the start
    to acceptance on 200 random patterns (multi-byte classes among them) and on JSON schemas."""
    rng = np.random.default_rng(7)
    patterns = [random_pattern(rng) for _ in range(200)]
    patterns += [schema_to_regex(s) for s in ({"type": "string", "minLength": 3}, {"type": "integer", "minimum": 100},
                                              {"type": "object", "properties": {"a": {"type": "boolean"}},
                                               "required": ["a"]}, {"enum": ["héllo", "é"]})]
    patterns += ["é{2}", "(?:ab|😀)+c", "[^a]x"]
    for p in patterns:
        assert min_bytes(parse(p)) == compile_dfa(p).byte_distance()[0], p
    assert min_bytes(parse("[^\\s\\S]")) == math.inf


def test_a_match_too_long_for_max_tokens_is_refused_before_any_state_is_built(llm, monkeypatch):
    """minLength 500 with max_tokens 10 once compiled for 20 s before its refusal: now the tree says 502 bytes, so at
    least 42 tokens of at most 12 bytes, and no automaton is built (compile_dfa would fail the test)."""
    def no_build(*a, **k):
        raise AssertionError("a DFA was built")
    monkeypatch.setattr(token_index, "compile_dfa", no_build)
    with pytest.raises(ValueError, match=r"guided_json: the shortest complete match has 502 bytes, so at least 42 "
                                         r"tokens \(this vocabulary's longest token has 12 bytes\), but max_tokens=10"):
        llm.generate("ROMEO:", SamplingParams(max_tokens=10, guided_json=LONG_STRING))
    with pytest.raises(ValueError, match="guided_regex: the shortest complete match has 60000 bytes"):
        llm.generate("ROMEO:", SamplingParams(max_tokens=900, guided_regex="[a-z]{60000}"))


def test_the_bound_never_refuses_what_fits(llm):
    """A pattern whose shortest match is exactly the budget's longest tokens still compiles, and generates."""
    out = llm.generate("ROMEO:", SamplingParams(max_tokens=8, temperature=0, guided_regex="(?:the ){2}"))[0]
    assert out.text == "the the "


def test_the_time_budget_refuses_a_slow_compile_and_names_itself(monkeypatch):
    """A fake clock that jumps a minute per reading: the first check past the deadline raises, naming the budget, the
    option that sets it and the stage it was in."""
    now = iter(range(0, 10**6, 60))
    monkeypatch.setattr(budget_mod.time, "monotonic", lambda: float(next(now)))
    tok = LLM("shakespeare").tokenizer
    with pytest.raises(RegexError, match=r"guided_json: compiling it took longer than its budget of 30 s "
                                         r"\(EngineConfig.guided_compile_timeout_s\) while building the DFA"):
        compile_json({"type": "string", "maxLength": 40}, tok, CompileBudget(30, name="guided_json"))


def test_the_engine_passes_its_timeout(monkeypatch):
    seen = []
    real = CompileBudget.__init__

    def spy(self, seconds=None, *a, **k):
        seen.append(seconds)
        real(self, seconds, *a, **k)
    monkeypatch.setattr(CompileBudget, "__init__", spy)
    llm = LLM("shakespeare", guided_compile_timeout_s=2.5)
    llm.generate("ROMEO:", SamplingParams(max_tokens=8, guided_choice=["yes", "no"]))
    assert seen == [2.5]
    with pytest.raises(ValueError, match=r"guided_compile_timeout_s must be a finite number of seconds > 0, got 0"):
        LLM("shakespeare", guided_compile_timeout_s=0)


def test_the_states_are_capped_by_the_vocabularys_mask_bytes(monkeypatch):
    """The (S, V) tables must fit MAX_INDEX_BYTES: 4096 states at 4096 tokens, 530 at Qwen's 151,936; the subset
    construction stops at 4x the cap, and a minimised DFA above it is refused, naming the memory reason."""
    assert max_states(4096) == 4096 and max_states(151_936) == 530
    with pytest.raises(RegexError, match=r"its DFA passes 40 states before minimisation: the most whose token masks"):
        compile_dfa("[a-z]{50}", max_states=10)
    with pytest.raises(RegexError, match=r"its DFA has 31 states, more than 30: the most whose token masks"):
        compile_dfa("x{30}", max_states=30)
    assert compile_dfa("x{29}", max_states=30).num_states == 30
    tok = LLM("shakespeare").tokenizer
    monkeypatch.setattr(budget_mod, "MAX_INDEX_BYTES", 5 * 4096 * 20)   # 20 states' tables
    monkeypatch.setattr(token_index, "max_states", budget_mod.max_states)
    with pytest.raises(RegexError, match="more than 20"):
        compile_regex("y{25}", tok)


def test_schemas_and_patterns_too_large_are_refused_by_name():
    """300 optional properties once made a 2.7 MB regex that failed after 5 s as 'groups nested more than 100 deep'."""
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}}
    with pytest.raises(ValueError, match=r"guided_json: 300 optional properties come before the first required one, "
                                         rf"more than {MAX_LEADING_OPTIONAL}"):
        schema_to_regex(wide)
    first_required = dict(wide, required=["p0"])                 # linear in the properties: accepted
    assert len(schema_to_regex(first_required)) < 40_000
    edge = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(MAX_LEADING_OPTIONAL)}}
    assert compile_dfa(schema_to_regex(edge)).match('{"p3":1,"p7":2}')
    with pytest.raises(ValueError, match=rf"the schema's regex has \d+ characters, more than {MAX_PATTERN_CHARS}"):
        schema_to_regex({"enum": ["x" * 1000 + str(i) for i in range(200)]})
    with pytest.raises(RegexError, match=rf"the pattern has {MAX_PATTERN_CHARS + 1} characters"):
        parse("a" * (MAX_PATTERN_CHARS + 1))


def test_a_refusal_shows_a_long_pattern_cut_short():
    with pytest.raises(RegexError) as e:
        parse("(" * 150 + "a" + ")" * 150)
    assert len(str(e.value)) < 400 and "(301 characters)" in str(e.value)


def test_the_cache_is_shared_by_threads_building_at_once():
    """The server builds requests in 4 prepare threads: the same and different patterns at once give one index per
    pattern, equal to a build alone, and the LRU stays within its bounds."""
    tok = LLM("shakespeare").tokenizer
    patterns = [f"(?:a|b){{{n}}}c" for n in range(1, 25)] * 3
    with cf.ThreadPoolExecutor(4) as pool:
        built = list(pool.map(lambda p: compile_regex(p, tok), patterns))
    vocab = token_index.vocab_of(tok)
    assert len(vocab.indexes) <= token_index.MAX_CACHED
    for p, ix in zip(patterns, built):
        alone = token_index.TokenIndex(compile_dfa(p), vocab)
        assert (ix.next == alone.next).all() and (ix.dist == alone.dist).all(), p
