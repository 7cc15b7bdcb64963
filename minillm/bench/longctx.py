"""`python -m minillm bench longctx`: perplexity against KV budget with kv_eviction, and KV bytes past the context.

Perplexity: held-out windows of the model's whole context (1024 tokens, minillm.bench.quant.held_out_windows), every
token scored through the engine (prompt_logprobs) with full attention and with each eviction policy at each budget
(sinks + window tokens). An evicting sequence is prefilled in chunks of minillm.kv_eviction.CHUNK tokens, blocks
leaving between chunks, so every token is scored with at most the budget in view (StreamingLLM's own evaluation
feeds one token at a time; chunks of 64 give the same visible set, the window rule being applied per token).
Generation past the context: a greedy streaming generation from a long prompt to beyond max_model_len, with the
blocks in use after every step (they must stay flat).
"""
from __future__ import annotations

import math
import time

BUDGETS = (64, 128, 256, 512)      # sinks + window tokens
QUICK_BUDGETS = (128, 256)


def window_ppl(llm, windows) -> float:
    """exp(mean negative log-likelihood) of every token after the first of each window, scored by the engine."""
    from ..core.sampling import SamplingParams
    outs = llm.generate([w.tolist() for w in windows], SamplingParams(max_tokens=1, prompt_logprobs=0))
    nll = [-next(iter(d.values())) for o in outs for d in o.prompt_logprobs[1:]]
    return math.exp(sum(nll) / len(nll))


def bench_longctx(model: str = "shakespeare", windows: int = 4, budgets=BUDGETS, methods=("streaming", "h2o"),
                  sinks: int = 4, gen_tokens: int = 300, prompt_tokens: int = 900) -> dict:
    from ..engine.llm import LLM
    from .quant import held_out_windows
    base = LLM(model, backend="torch")
    T = base.engine.config.max_model_len
    x, _ = held_out_windows(base.tokenizer, T=T - 1, max_windows=windows)  # (N, T - 1): a prompt leaves one slot
    res = {"model": model, "windows": int(x.shape[0]), "window_tokens": int(x.shape[1]), "sinks": sinks, "rows": []}
    t = time.perf_counter()
    res["full_ppl"] = window_ppl(base, x)
    res["full_seconds"] = time.perf_counter() - t
    for method in methods:
        for budget in budgets:
            llm = LLM(model, backend="torch", kv_eviction={"method": method, "sinks": sinks, "window": budget - sinks})
            t = time.perf_counter()
            ppl = window_ppl(llm, x)
            res["rows"].append({"method": method, "budget": budget, "ppl": ppl, "ratio": ppl / res["full_ppl"],
                                "seconds": time.perf_counter() - t,
                                "evicted_blocks": llm.engine.block_manager.num_evicted})
    if "streaming" in methods:      # the ablation: a window alone, no sinks, at the smallest budget
        llm = LLM(model, backend="torch", kv_eviction={"method": "streaming", "sinks": 0, "window": budgets[0]})
        ppl = window_ppl(llm, x)
        res["rows"].append({"method": "window", "budget": budgets[0], "ppl": ppl, "ratio": ppl / res["full_ppl"],
                            "seconds": 0.0, "evicted_blocks": llm.engine.block_manager.num_evicted})
    res["past_context"] = past_context(model, x[0, :prompt_tokens].tolist(), gen_tokens, sinks, 256 - sinks)
    return res


def past_context(model: str, prompt: list, gen_tokens: int, sinks: int, window: int) -> dict:
    """Greedy streaming generation from `prompt` for gen_tokens tokens: blocks in use after every step."""
    from ..core.sampling import SamplingParams
    from ..engine.llm import LLM
    from ..llama.kv_cache import KVCache
    llm = LLM(model, backend="torch", kv_eviction={"method": "streaming", "sinks": sinks, "window": window})
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=gen_tokens, ignore_eos=True))[0]
    per_block = llm.engine.kv.nbytes // llm.engine.kv.num_blocks
    used = [s.blocks_used for s in llm.engine.trace.steps]
    return {"prompt_tokens": len(prompt), "generated": len(out.outputs[0].token_ids),
            "total_tokens": len(prompt) + len(out.outputs[0].token_ids),
            "max_model_len": llm.engine.config.max_model_len,
            "blocks_used": used, "kv_bytes_max": max(used) * per_block, "kv_bytes_last": used[-1] * per_block,
            "bytes_per_token": KVCache.bytes_per_token(llm.model.config),
            "kv_bytes_full_attention": (len(prompt) + len(out.outputs[0].token_ids))
            * KVCache.bytes_per_token(llm.model.config),
            "evicted_blocks": llm.engine.block_manager.num_evicted, "text_tail": out.outputs[0].text[-200:]}


def print_table(res: dict):
    print(f"{res['model']}: {res['windows']} held-out windows of {res['window_tokens']} tokens, sinks {res['sinks']}")
    print(f"full attention: perplexity {res['full_ppl']:.3f}")
    print(f"{'method':<10} {'budget':>6} {'ppl':>8} {'vs full':>8} {'blocks evicted':>15}")
    for r in res["rows"]:
        print(f"{r['method']:<10} {r['budget']:>6} {r['ppl']:>8.3f} {r['ratio'] - 1:>+8.1%} {r['evicted_blocks']:>15}")
    p = res["past_context"]
    print(f"streaming past the context: {p['prompt_tokens']} + {p['generated']} = {p['total_tokens']} tokens "
          f"(max_model_len {p['max_model_len']}); KV in use at most {p['kv_bytes_max'] / 2**20:.2f} MiB, at the end "
          f"{p['kv_bytes_last'] / 2**20:.2f} MiB (full attention would hold {p['kv_bytes_full_attention'] / 2**20:.2f}"
          f" MiB); {p['evicted_blocks']} blocks freed")


# ---------------------------------------------------------------------------- python -m minillm bench longctx
def add_parser(sub):
    """`bench longctx`: its options, and run_cli to run it."""
    p = sub.add_parser("longctx", help="kv_eviction (StreamingLLM, H2O): perplexity against KV budget on 1024-token "
                                       "windows, KV bytes generating past the context")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--windows", type=int, default=4, help="held-out windows of the model's context (1024 tokens)")
    p.add_argument("--quick", action="store_true", help="1 window, budgets 128 and 256, 150 tokens generated")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    res = bench_longctx(a.model, 1 if a.quick else a.windows, QUICK_BUDGETS if a.quick else BUDGETS,
                        gen_tokens=150 if a.quick else 300)
    print_table(res)
    return res
