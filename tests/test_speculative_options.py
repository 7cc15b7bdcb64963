"""Speculative decoding's options: what is refused (each a clear ValueError naming the value, before anything is
queued, the engine still usable) and what the config accepts."""
import pytest

from minillm import LLM, SamplingParams
from minillm.spec_decode.config import SpeculativeConfig


@pytest.mark.parametrize("spec,match", [
    ({"method": "draft", "gamma": 0}, r"gamma must be an integer >= 1 .* got 0"),
    ({"method": "ngram", "gamma": 2.5}, r"gamma must be an integer >= 1 .* got 2.5"),
    ({"method": "eagle"}, r"speculative method 'eagle' is not one of \('draft', 'ngram', 'medusa'\)"),
    ({"method": "ngram", "lookahead": 2}, r"unknown speculative option\(s\) \['lookahead'\]"),
    ({"gamma": 2}, r"speculative must be a dict with a 'method'"),
    ({"method": "ngram", "ngram_min": 3, "ngram_max": 2}, r"1 <= ngram_min <= ngram_max"),
    ({"method": "draft", "draft_backend": "cuda"}, r"draft_backend must be 'auto', 'torch' or 'numba', got 'cuda'"),
    ({"method": "medusa"},
     r"Medusa heads in .*shakespeare-medusa.bin were trained for a model with dim=256.*this model has dim=64"),
    ({"method": "medusa", "heads": "/nonexistent/heads.bin"}, None),
])
def test_bad_speculative_options_are_refused(spec, match):
    with pytest.raises(ValueError if match else FileNotFoundError, match=match):
        LLM("random:tiny", speculative=spec)


def test_medusa_refuses_sampling_and_keeps_the_engine_usable():
    llm = LLM("shakespeare", speculative={"method": "medusa", "gamma": 2})
    with pytest.raises(ValueError, match=r"'medusa' verifies its candidate tree greedily: it needs temperature=0, "
                                         r"got temperature=0.8"):
        llm.generate(["ROMEO.\n", "JULIET.\n"], [SamplingParams(temperature=0), SamplingParams(temperature=0.8)])
    assert not llm.engine.has_unfinished_requests()        # the valid first request was not queued either
    out = llm.generate("ROMEO.\n", SamplingParams(temperature=0, max_tokens=8))
    assert len(out[0].outputs[0].token_ids) == 8


def test_a_medusa_tree_deeper_than_the_heads_is_refused():
    with pytest.raises(ValueError, match=r"tree choice \(0, 0, 0, 0\) is 4 deep but there are only 3 heads"):
        LLM("shakespeare", speculative={"method": "medusa", "tree": [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]})


def test_a_draft_with_another_tokenizer_is_refused():
    with pytest.raises(ValueError,
                       match=r"the draft model 'random:tiny' uses a different tokenizer from the target's "
                             r"\(vocab 512 vs 4096"):
        LLM("shakespeare", speculative={"method": "draft", "model": "random:tiny"})


@pytest.mark.parametrize("opts,spec,match", [
    (dict(backend="cuda"), {"method": "medusa"}, r"backend='cuda' does not run speculative method='medusa' yet; "
                                                  r"backends that do: torch, numba"),
    (dict(batching="static"), {"method": "ngram"}, r"needs batching='continuous'")])
def test_speculative_refuses_what_it_cannot_combine_with(opts, spec, match):
    with pytest.raises(ValueError, match=match):
        LLM("random:tiny", speculative=spec, **opts)


def test_config_round_trip():
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "gamma": 2, "ngram_max": 4})
    assert (cfg.method, cfg.gamma, cfg.ngram_max) == ("ngram", 2, 4) and SpeculativeConfig.from_dict(cfg) is cfg
