"""Refusals the engine gives for the options the README lists: each case -> its exception type and message.
tests/test_refusals.py compares them with tests/data/refusals.json, captured from the engine before the slim-core
change (issue 34: 'every refusal ... given after the change, with the same message'). One message changed on
purpose: the unknown-option refusal lists the seams, which gained `eviction`."""
import re

ENGINE = {   # LLM("random:tiny", **options)
    "backend": {"backend": "gpu"}, "dtype": {"dtype": "float8"}, "quantization": {"quantization": "int3"},
    "kv_cache_dtype": {"kv_cache_dtype": "fp8"}, "block_size_zero": {"block_size": 0},
    "block_size_type": {"block_size": "16"}, "max_model_len": {"max_model_len": 0},
    "kv_cache_bytes": {"kv_cache_bytes": -5}, "kv_eviction_method": {"kv_eviction": {"method": "lru"}},
    "kv_eviction_window": {"kv_eviction": {"method": "streaming", "sinks": 4, "window": 100000}},
    "batching": {"batching": "eager"}, "batch_window_s": {"batching": "dynamic", "batch_window_s": -1.0},
    "max_num_seqs": {"max_num_seqs": 0}, "scheduling_policy": {"scheduling_policy": "lifo"},
    "preemptive_static": {"batching": "static", "scheduling_policy": "sjf"},
    "lpm_without_cache": {"scheduling_policy": "lpm"},
    "chunked_type": {"enable_chunked_prefill": "yes"}, "batched_tokens": {"max_num_batched_tokens": 0},
    "preemption_mode": {"preemption_mode": "drop"}, "swap_without_bytes": {"preemption_mode": "swap"},
    "swap_bytes": {"swap_bytes": -1}, "speculative_method": {"speculative": {"method": "eagle"}},
    "speculative_gamma": {"speculative": {"method": "ngram", "gamma": 0}},
    "speculative_static": {"speculative": {"method": "ngram"}, "batching": "static"},
    "sparsity": {"sparsity": {"method": "random", "pattern": 0.5}},
    "tensor_parallel": {"tensor_parallel_size": 0}, "seed": {"seed": "zero"}, "trace": {"trace": "yes"},
    "lora_on_numba": {"enable_lora": True, "backend": "numba"},
    "unknown_option": {"max_batch_size": 4},
}
SAMPLING = {   # SamplingParams(**options)
    "temperature": {"temperature": -1.0}, "top_p": {"top_p": 0.0}, "top_k": {"top_k": -2},
    "min_p": {"min_p": 1.5}, "n": {"n": 0}, "best_of": {"n": 3, "best_of": 2}, "max_tokens": {"max_tokens": 0},
    "repetition_penalty": {"repetition_penalty": 0.0}, "frequency_penalty": {"frequency_penalty": float("nan")},
    "stop": {"stop": 5}, "stop_token_ids": {"stop_token_ids": ["a"]}, "logprobs": {"logprobs": -1},
    "seed": {"seed": 1.5}, "ignore_eos": {"ignore_eos": "no"},
}
REQUESTS = {   # llm.generate(prompt, params, **kw) or llm.beam_search on a plain random:tiny engine
    "prompt_too_long": ("generate", [1] * 5000, {}), "prompt_no_ids": ("generate", [[]], {}),
    "prompt_bytes": ("generate", b"abc", {}), "prompt_ids_range": ("generate", [1, 10**9], {}),
    "priority_without_order": ("generate", "Hello", {"priority": 1}),
    "lora_without_enable": ("generate", "Hello", {"lora": "comedy"}),
    "logprobs_over_vocab": ("generate", "Hello", {"params": {"logprobs": 10**6}}),
    "beam_width": ("beam_search", "Hello", {"beam_width": 0, "max_tokens": 4}),
}


def _clean(text: str) -> str:
    return re.sub(r"at 0x[0-9a-f]+", "at 0x...", text)


def _catch(fn) -> list:
    try:
        fn()
    except Exception as e:
        return [type(e).__name__, _clean(str(e))]
    return ["no error", ""]


def refusals() -> dict:
    from minillm import LLM, SamplingParams
    out = {f"engine:{k}": _catch(lambda o=o: LLM("random:tiny", **o)) for k, o in ENGINE.items()}
    out.update({f"sampling:{k}": _catch(lambda o=o: SamplingParams(**o)) for k, o in SAMPLING.items()})
    llm = LLM("random:tiny", max_model_len=256)
    spec = LLM("random:tiny", max_model_len=256, speculative={"method": "ngram"})
    for k, (call, prompt, kw) in REQUESTS.items():
        kw = dict(kw)
        if call == "generate":
            params = SamplingParams(**kw.pop("params", {}))
            out[f"request:{k}"] = _catch(lambda p=prompt, s=params, kw=kw: llm.generate(p, s, **kw))
        else:
            out[f"request:{k}"] = _catch(lambda p=prompt, kw=kw: llm.beam_search(p, **kw))
    out["request:beam_with_speculation"] = _catch(lambda: spec.beam_search("Hello", beam_width=2, max_tokens=4))
    return out


if __name__ == "__main__":
    import json
    import sys
    json.dump(refusals(), sys.stdout, indent=1, sort_keys=True)
