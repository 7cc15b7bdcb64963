"""`python -m minillm bench guided`: structured output (minillm.guided) on the shipped model, default backend.

Measured, each side by side in one process:
    validity      N samples at T = 1 (a seed each) for 3 JSON schemas and 3 regexes: the share whose returned text
                  parses and validates (jsonschema) or fullmatches (re); N = 500 (--quick: 8)
    mask cost     8 requests decoding together, constrained and not (the same prompts; a regex that cannot end before
                  max_tokens against ignore_eos, and a schema), in alternating rounds: the median decode step with
                  exactly 8 rows, and (step_c - step_plain) / step_c paired round by round; also the masks' own time
                  (the processors' clocks) per step and its share of the step (steadier on a busy machine)
    jump-forward  a schema with fixed keys, greedy, one request: engine steps (= forwards) and tokens with and
                  without jump-forward, tokens forced; and 8 sampled requests: tokens forced, steps
    vs outlines-core  (if installed: pip install 'minillm[guided]') the same constraints' token indexes: masks equal on
                  sampled states, build time (ours: regex -> DFA -> masks, all Python + numpy; theirs: Rust), and
                  per-step mask time along one token path
"""
from __future__ import annotations

import json
import re
import statistics
import time

from ..core.sampling import SamplingParams
from ..engine.llm import LLM
from ..guided import compile_dfa, processor_of, schema_to_regex
from ..guided.token_index import TokenIndex, vocab_of

SCHEMAS = {
    "person": {"type": "object", "required": ["name", "age"], "additionalProperties": False,
               "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
                              "age": {"type": "integer", "minimum": 0, "maximum": 120},
                              "title": {"enum": ["lord", "lady", None]}}},
    "scene": {"type": "object", "required": ["act", "lines"],
              "properties": {"act": {"type": "integer", "minimum": 1, "maximum": 5},
                             "lines": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1,
                                       "maxItems": 3},
                             "comic": {"type": "boolean"}}},
    "price": {"type": "object", "required": ["price", "tags"], "additionalProperties": False,
              "properties": {"price": {"type": "number", "minimum": -10, "maximum": 10},
                             "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                             "note": {"type": ["string", "null"], "maxLength": 6}}}}
REGEXES = {"sentence": r"(Romeo|Juliet|Tybalt) (loves|hates) [a-z]+( [a-z]+)?\.",
           "phone": r"[0-9]{3}-[0-9]{4}",
           "line": r"[A-Z][a-z ,]{4,40}[.!?]"}
FIXED_KEYS = {"type": "object", "required": ["speaker", "act", "scene", "line"], "additionalProperties": False,
              "properties": {"speaker": {"type": "string", "maxLength": 10},
                             "act": {"type": "integer", "minimum": 1, "maximum": 5},
                             "scene": {"type": "integer", "minimum": 1, "maximum": 9},
                             "line": {"type": "string", "maxLength": 20}}}
LONG = r"[a-z ,.;:!?'\n]{%d,}"            # at least L bytes per token allowed: no end before max_tokens
LONG_BYTES = b"abcdefghijklmnopqrstuvwxyz ,.;:!?'\n"


def longest_token(tokenizer, allowed: bytes = LONG_BYTES) -> int:
    """The most bytes one token made only of `allowed` holds (L): LONG with L * max_tokens bytes can end no sooner
    than max_tokens and no later (6 for the shipped tokenizer; fewer for a small vocabulary of short merges)."""
    ok = set(allowed)
    return max(len(b) for b, text in zip(vocab_of(tokenizer).bytes, vocab_of(tokenizer).text)
               if text and set(b) <= ok)


def _valid(text: str, kind: str, spec) -> bool:
    if kind == "regex":
        return re.fullmatch(spec, text, re.ASCII) is not None
    try:
        value = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:                   # parsed only; the dev extra installs the oracle
        return True
    return jsonschema.Draft202012Validator(spec).is_valid(value)


def validity(llm: LLM, n: int, max_tokens: int = 64) -> dict:
    out = {}
    cases = [("json", k, s) for k, s in SCHEMAS.items()] + [("regex", k, r) for k, r in REGEXES.items()]
    for kind, name, spec in cases:
        key = {"json": "guided_json", "regex": "guided_regex"}[kind]
        t0 = time.perf_counter()
        outs = llm.generate(["ROMEO:"] * n, [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens,
                                                            **{key: spec}) for i in range(n)])
        texts = [o.outputs[0] for o in outs]
        out[f"{kind}:{name}"] = {"n": n, "valid": sum(_valid(c.text, kind, spec) for c in texts),
                                 "distinct": len({c.text for c in texts}),
                                 "mean_tokens": statistics.mean(len(c.token_ids) for c in texts),
                                 "finished_stop": sum(c.finish_reason == "stop" for c in texts),
                                 "seconds": time.perf_counter() - t0, "example": texts[0].text}
    return out


def _decode_steps(engine, first: int, rows: int) -> list[float]:
    return [s.seconds for s in engine.trace.steps[first:]
            if s.kind == "decode" and len(s.seq_ids) == rows and all(p == "decode" for p in s.phases)]


def mask_cost(llm: LLM, batch: int = 8, max_tokens: int = 64, repeats: int = 3) -> dict:
    """Decode steps at `batch` rows, constrained (regex LONG; the person schema, jump-forward off, lengths as they
    come) and unconstrained, in rounds that alternate plain, regex, json: each round's median step, and the
    overhead paired with the plain run just before it (a busy machine drifts over seconds; pairing cancels most of
    it), the median over rounds. The masks' own time: the processors' clocks per call, times `batch` rows."""
    engine = llm.engine
    prompts = [f"{name}:" for name in ("ROMEO", "JULIET", "TYBALT", "MERCUTIO", "NURSE", "CAPULET", "PARIS",
                                       "BENVOLIO")][:batch]
    long = LONG % (longest_token(engine.tokenizer) * max_tokens)
    cases = {"plain": dict(ignore_eos=True), "regex": dict(guided_regex=long),
             "json": dict(guided_json=SCHEMAS["person"])}
    rounds = {k: [] for k in cases}
    clock = {k: [0.0, 0] for k in cases}                # processors' seconds, calls
    for extra in cases.values():                        # compile the masks before timing (cached by the vocabulary)
        engine.make_request(prompts[0], SamplingParams(max_tokens=max_tokens, **extra))
    engine.jump_forward = False
    try:
        for r in range(1, repeats + 1):
            for name, extra in cases.items():
                first = len(engine.trace.steps)
                params = [SamplingParams(temperature=1.0, seed=100 * r + i, max_tokens=max_tokens, **extra)
                          for i in range(batch)]
                requests = [engine.make_request(p, sp) for p, sp in zip(prompts, params)]
                for q in requests:
                    engine.enqueue(q)
                while engine.has_unfinished_requests():
                    engine.step()
                engine.pop_finished()
                rounds[name].append(statistics.median(_decode_steps(engine, first, batch)))
                for proc in filter(None, (processor_of(q.params) for q in requests)):
                    clock[name][0] += proc.seconds
                    clock[name][1] += proc.calls
    finally:
        engine.jump_forward = True
    out = {"batch": batch, "rounds": repeats, "plain_step_ms": statistics.median(rounds["plain"]) * 1e3}
    for name in ("regex", "json"):
        med = statistics.median(rounds[name])
        paired = [(c - p) / c for c, p in zip(rounds[name], rounds["plain"])]
        mask = clock[name][0] / max(1, clock[name][1]) * batch
        out[name] = {"step_ms": med * 1e3, "round_step_ms": [x * 1e3 for x in rounds[name]],
                     "plain_round_step_ms": [x * 1e3 for x in rounds["plain"]],
                     "overhead": statistics.median(paired), "overhead_range": (min(paired), max(paired)),
                     "mask_ms_per_step": mask * 1e3, "mask_share": mask / med}
    return out


def jump_forward(llm: LLM, samples: int = 8, max_tokens: int = 80) -> dict:
    engine = llm.engine
    out = {}
    for label, temps in (("greedy, 1 request", [0.0]), (f"T=1, {samples} requests", [1.0] * samples)):
        row = {}
        for on in (True, False):
            engine.jump_forward = on
            requests = [engine.make_request("ROMEO:", SamplingParams(temperature=t, seed=i, max_tokens=max_tokens,
                                                                     guided_json=FIXED_KEYS))
                        for i, t in enumerate(temps)]
            for q in requests:
                engine.enqueue(q)
            steps = 0
            while engine.has_unfinished_requests():
                engine.step()
                steps += 1
            done = engine.pop_finished()
            procs = [processor_of(q.params) for q in requests]
            row["on" if on else "off"] = {"steps": steps, "tokens": sum(len(o.outputs[0].token_ids) for o in done),
                                          "forced": sum(p.forced for p in procs),
                                          "valid": all(_valid(o.outputs[0].text, "json", FIXED_KEYS) for o in done)}
        engine.jump_forward = True
        row["forced_share"] = row["on"]["forced"] / max(1, row["on"]["tokens"])
        out[label] = row
    return out


def versus_outlines(tok, walks: int = 10, only=None) -> dict:
    try:
        from ..guided.check import compare_masks, mask_step_seconds, outlines_index, outlines_vocabulary
        outlines_vocabulary(vocab_of(tok))
    except ImportError as e:
        return {"skipped": str(e)}
    vocab = vocab_of(tok)
    vocabulary = outlines_vocabulary(vocab)
    patterns = {f"json:{k}": schema_to_regex(s) for k, s in SCHEMAS.items()}
    patterns.update({f"regex:{k}": r for k, r in REGEXES.items()})
    patterns = {k: v for k, v in patterns.items() if only is None or k in only}
    out = {}
    for name, pattern in patterns.items():
        t0 = time.perf_counter()
        ours = TokenIndex(compile_dfa(pattern), vocab)          # uncached: the whole build
        ours_s = time.perf_counter() - t0
        theirs, theirs_s = outlines_index(pattern, vocab, vocabulary)
        cmp = compare_masks(ours, theirs, walks=walks)
        path, s, st = [], ours.start, theirs.get_initial_state()
        while len(path) < 40:                                    # a token path both allow
            both = sorted(set(ours.mask(s).nonzero().flatten().tolist()) & set(theirs.get_allowed_tokens(st))
                          - {vocab.eos})
            if not both:
                break
            t = both[len(path) * 7919 % len(both)]
            path.append(t)
            s, st = ours.next_state(s, t), theirs.get_next_state(st, t)
        per_step = mask_step_seconds(ours, pattern, vocabulary, path)
        out[name] = {"states": ours.num_states, "masks_equal": f"{cmp['equal']}/{cmp['states']}",
                     "build_ms_minillm": ours_s * 1e3, "build_ms_outlines": theirs_s * 1e3,
                     "mask_us_minillm": per_step["minillm"] * 1e6, "mask_us_outlines": per_step["outlines-core"] * 1e6}
    return out


def bench_guided(model: str = "shakespeare", n: int = 500, repeats: int = 3, quick: bool = False) -> dict:
    llm = LLM(model, max_num_seqs=64)
    res = {"model": model, "backend": llm.engine.backend}
    res["validity"] = validity(llm, n, max_tokens=48 if quick else 64)
    res["mask_cost"] = mask_cost(llm, repeats=repeats, max_tokens=24 if quick else 64)
    res["jump_forward"] = jump_forward(llm, samples=2 if quick else 8)
    res["outlines"] = versus_outlines(llm.tokenizer, walks=2 if quick else 10,
                                      only=("json:person", "regex:sentence") if quick else None)
    return res


def print_report(res: dict):
    print(f"structured output on {res['model']} ({res['backend']} backend)")
    print(f"{'constraint':<16}{'valid':>11}{'distinct':>9}{'tokens':>8}{'stop':>6}{'s':>7}  example")
    for name, r in res["validity"].items():
        print(f"{name:<16}{r['valid']:>6}/{r['n']:<4}{r['distinct']:>9}{r['mean_tokens']:>8.1f}"
              f"{r['finished_stop']:>6}{r['seconds']:>7.1f}  {r['example'][:60]!r}")
    m = res["mask_cost"]
    print(f"mask cost at batch {m['batch']}: plain decode step {m['plain_step_ms']:.2f} ms (median)")
    for name in ("regex", "json"):
        r = m[name]
        print(f"  {name:<6} step {r['step_ms']:.2f} ms (median of {m['rounds']} rounds' medians): {r['overhead']:+.1%} "
              f"of the step against the plain run beside it; the masks' own time {r['mask_ms_per_step']:.3f} ms "
              f"per step = {r['mask_share']:.1%} of it")
    for label, r in res["jump_forward"].items():
        on, off = r["on"], r["off"]
        print(f"jump-forward, {label}: steps {on['steps']} (off: {off['steps']}), tokens {on['tokens']} "
              f"(off: {off['tokens']}), forced {on['forced']} = {r['forced_share']:.0%} of tokens; "
              f"valid {on['valid'] and off['valid']}")
    o = res["outlines"]
    if "skipped" in o:
        print(f"outlines-core: skipped ({o['skipped']})")
        return
    print(f"{'vs outlines-core':<16}{'states':>7}{'masks equal':>13}{'build ms':>10}{'(outl.)':>9}"
          f"{'mask us':>9}{'(outl.)':>9}")
    for name, r in o.items():
        print(f"{name:<16}{r['states']:>7}{r['masks_equal']:>13}{r['build_ms_minillm']:>10.1f}"
              f"{r['build_ms_outlines']:>9.1f}{r['mask_us_minillm']:>9.1f}{r['mask_us_outlines']:>9.1f}")


# ---------------------------------------------------------------------------- python -m minillm bench guided
def add_parser(sub):
    """`bench guided`: its options, and run_cli to run it."""
    p = sub.add_parser("guided", help="structured output: validity, mask cost at batch 8, jump-forward, "
                                      "masks and times beside outlines-core")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--samples", type=int, default=500, help="samples per schema / regex at T = 1")
    p.add_argument("--repeats", type=int, default=5, help="rounds of the mask-cost runs")
    p.add_argument("--quick", action="store_true", help="4 samples each, 1 repeat, 24-token mask runs, 2 constraints "
                                                       "beside outlines-core: a smoke test")
    p.add_argument("--json", default=None)
    p.set_defaults(run=run_cli)


def run_cli(a) -> dict:
    res = bench_guided(a.model, 4 if a.quick else a.samples, 1 if a.quick else a.repeats, a.quick)
    print_report(res)
    return res
