"""Structured output from first principles: SamplingParams(guided_regex=..., guided_json=schema,
guided_choice=[...]) make every output match, at any temperature.

    pattern --regex.parse--> AST --fsm.compile_dfa--> DFA over UTF-8 bytes (Thompson NFA, subset construction,
    minimised) --token_index.TokenIndex--> per-state token masks over the tokenizer's vocabulary, precomputed
    --processor.GuidedProcessor--> one masked_fill per row per step, in the engine's sampler; jump-forward appends
    the tokens the DFA forces. A JSON schema is first turned into a regex (json_schema.schema_to_regex), a choice
    into an alternation of literals.

Public API (small, for notebooks and tests):
    compile_regex(pattern, tokenizer) -> TokenIndex   (also compile_json(schema, tok), compile_choice(choices, tok))
        .dfa            the DFA: .num_states, .start (0), .accepting (S,) bool, .trans (S, 256) int32 (-1: dead),
                        .edges() -> [(from, to, [(byte lo, byte hi), ...])] for drawing, .match(text)
        .mask(state, tokens_left=None) -> (V,) bool torch tensor: the tokens allowed there
        .next_state(state, token), .walk(state, tokens), .is_accepting(state), .start, .start_after_bos
        .dist           (S + 1,) the fewest tokens from each state to a complete match
    compile_dfa(pattern) -> DFA                        the DFA alone (no tokenizer)
    schema_to_regex(schema) -> str                     the regex a JSON schema compiles to
    GuidedProcessor                                    what the engine runs per request (.forced: jump-forward's tokens)
The engine builds the constraint in LLMEngine.make_request (processor.attach), where the tokenizer is known, so a
bad pattern or schema is a ValueError before anything is queued. minillm.guided.check compares the masks with
outlines-core's (the optional extra "guided"); `python -m minillm bench guided` measures validity, mask cost,
jump-forward and that comparison.
"""
from .fsm import DFA, compile_dfa
from .json_schema import schema_to_regex
from .processor import GuidedProcessor, JumpForward, attach, jump_forward, processor_of
from .regex import RegexError, parse
from .token_index import TokenIndex, compile_choice, compile_json, compile_regex

__all__ = ["DFA", "GuidedProcessor", "RegexError", "TokenIndex", "attach", "compile_choice", "compile_dfa",
           "JumpForward", "compile_json", "compile_regex", "jump_forward", "parse", "processor_of", "schema_to_regex"]
