"""Beam search (minillm.decoding.beam) inside the one engine path: against plain references, batch-invariant, no leaks,
beams sharing blocks and giving them back when pruned, fewer blocks than independent samples, and bad input.

Two references, both written out plainly here (not minillm.decoding.beam's code):
- the shipped model in float64, a full-sequence forward per beam per step: the engine runs float32 (torch and
  numba), so tokens are compared only where the reference's candidates are at least MARGIN apart at every
  selection (the test asserts the prompts it uses are), and cumulative logprobs within TOL;
- a fake model (HashModel whose next tokens hash the K/V it reads back through the block table, so a wrong block
  or a missed copy-on-write changes its output), with unequal logits and an end token after some contexts: its
  logprobs are computed exactly as the engine computes them, so results must be equal, ties included.
"""
import copy
import math

import pytest
import torch
from hashmodel import HashModel, allowed
from hypothesis import given, settings
from hypothesis import strategies as st
from test_transactions import fail_once, run_through_failures

import minillm.decoding.beam as beam_module
from minillm import LLM, SamplingParams
from minillm.core.batch import ScheduledBatch
from minillm.core.policies import Continuous
from minillm.decoding.beam import BeamSearchOutput, beam_step
from minillm.formats.loader import sample_tokenizer
from minillm.llama.tokenizer import BOS, EOS

MARGIN = 1e-3   # float32 logits vs float64: a per-token logprob differs by ~1e-6, 6 tokens stay far below this
TOL = 5e-5      # on cumulative logprobs of 6 tokens, float32 engine vs float64 reference (measured: 5e-6 at worst)
PROMPTS = ["ROMEO:", "To be, or not to be", "The king is dead"]


# ---------------------------------------------------------------------------- the reference
def reference_beams(next_logprobs, prompt: list, W: int, max_tokens: int, end_ids=(), lp: float = 1.0):
    """HF's beam search with its exact stopping bound, run to max_tokens without stopping early (the bound makes
    early stopping change nothing). Candidates are ranked by score, then beam rank, then token id.
    -> ([(output ids, cum logprob, score, finish reason)] best W, the smallest gap at a decision: between the last
    candidate kept and the next, at rank W when an end token is near, between the scores of the W + 1 best)."""
    beams, hyps, margin = [([], 0.0)], [], math.inf
    for length in range(1, max_tokens + 1):
        cand = []
        logp = next_logprobs([prompt + toks for toks, _ in beams]).tolist()   # (B, V) float64
        for b, (_, cum) in enumerate(beams):
            cand += [(cum + v, b, t) for t, v in enumerate(logp[b])]
        cand.sort(key=lambda c: (-c[0], c[1], c[2]))
        kept = []
        for rank, (s, b, t) in enumerate(cand[:2 * W]):
            if t in end_ids:
                if rank < W:
                    hyps.append((beams[b][0] + [t], s, s / max(1, length - 1) ** lp, "stop"))
            else:
                kept.append((beams[b][0] + [t], s))
                if len(kept) == W:
                    break
        beams = kept
        cut = [rank] + ([W - 1] if any(t in end_ids for _, _, t in cand[:2 * W + 1]) else [])
        margin = min([margin] + [cand[i][0] - cand[i + 1][0] for i in cut])   # who is kept, who finishes
    hyps += [(toks, s, s / max_tokens ** lp, "length") for toks, s in beams]
    hyps.sort(key=lambda h: -h[2])                                            # stable: ties keep their order
    scores = [h[2] for h in hyps[:W + 1]]
    margin = min([margin] + [a - b for a, b in zip(scores, scores[1:])])
    return hyps[:W], margin


@pytest.fixture(scope="module")
def torch_llm():
    return LLM("shakespeare", backend="torch")


@pytest.fixture(scope="module")
def numba_llm():
    return LLM("shakespeare")                     # backend "auto": numba on a CPU


@pytest.fixture(scope="module")
def model64(torch_llm):
    return copy.deepcopy(torch_llm.model).double().eval()


_REFERENCE = {}


def reference64(model64, ids: list, W: int, max_tokens: int):
    """reference_beams over a plain float64 forward of every beam's full sequence (all beams in one batch: they
    have the same length), computed once per case for both backends."""
    @torch.no_grad()
    def next_logprobs(contexts):
        return torch.log_softmax(model64(torch.tensor(contexts))[:, -1], -1)   # (B, T, V) -> (B, V)
    key = (tuple(ids), W, max_tokens)
    if key not in _REFERENCE:
        _REFERENCE[key] = reference_beams(next_logprobs, ids, W, max_tokens, end_ids={BOS, EOS})
    return _REFERENCE[key]


def assert_leak_free(engine):
    bm, sched = engine.block_manager, engine.scheduler
    assert bm.num_free == bm.num_blocks, "blocks leaked"
    bm.check([])
    assert not (sched.running or sched.waiting or sched.swapped or sched.pending_forks or sched.groups)


# ---------------------------------------------------------------------------- (a) width 1 is greedy decoding
@pytest.mark.parametrize("which", ["torch_llm", "numba_llm"])
def test_width_one_is_greedy_decoding(which, request):
    llm = request.getfixturevalue(which)
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    beams = llm.beam_search(PROMPTS, 1, 16, ignore_eos=True)
    for g, b in zip(greedy, beams):
        assert isinstance(b, BeamSearchOutput) and len(b.sequences) == 1
        assert b.sequences[0].tokens == g.prompt_token_ids + g.token_ids
        assert b.sequences[0].text == g.text
    assert_leak_free(llm.engine)


# ---------------------------------------------------------------------------- (b) the brute-force reference
@pytest.mark.parametrize("which", ["torch_llm", "numba_llm"])
@pytest.mark.parametrize("W", [2, 3, 4])
def test_matches_brute_force_beam_search_over_a_float64_forward(which, W, request, model64):
    llm = request.getfixturevalue(which)
    max_tokens = 6
    outs = llm.beam_search(PROMPTS, W, max_tokens)
    tok = llm.tokenizer
    for prompt, out in zip(PROMPTS, outs):
        ids = tok.encode(prompt)
        ref, margin = reference64(model64, ids, W, max_tokens)
        assert margin > MARGIN, f"{prompt!r}: candidates {margin:.2g} apart, too close to compare in float32"
        assert len(out.sequences) == W
        for got, (toks, cum, score, reason) in zip(out.sequences, ref):
            assert got.tokens == ids + toks and got.finish_reason == reason
            assert abs(got.cum_logprob - cum) < TOL and abs(got.score - score) < TOL
            assert got.text == tok.decode(toks, prev_token=ids[-1])
    assert_leak_free(llm.engine)


# ---------------------------------------------------------------------------- the exact fake model
V = 300
_TOKENIZER = []


def shaped(ok: list) -> torch.Tensor:
    """Logits over V from the allowed tokens (sorted ids): unequal (and sometimes tied) values, and the end
    token EOS after some contexts, so beams rank, fork, finish and stop early."""
    row = torch.full((V,), -1e9, dtype=torch.float64)                         # (V,)
    for t in ok:
        row[t] = -((t * 7919) % 13) / 4
    if sum(ok) % 5 == 0:
        row[EOS] = -0.75
    return row


class ScoredHash(HashModel):
    def forward(self, tokens, positions, kv, attn, rows=None, return_hidden=False):
        base = super().forward(tokens, positions, kv, attn, rows)             # (N, V): 0 at the allowed tokens
        rows = [shaped((r == 0).nonzero().flatten().tolist()) for r in base]
        return torch.stack(rows) if rows else base                            # (N, V)


def hash_logprobs(choices):
    return lambda contexts: torch.stack([torch.log_softmax(shaped(sorted(allowed(c, choices))), -1)
                                        for c in contexts])                  # (B, V)


def hash_llm(choices=4, block_size=2, pool_tokens=512, **cfg) -> LLM:
    if not _TOKENIZER:
        _TOKENIZER.append(sample_tokenizer(V))      # end tokens BOS and EOS, as llama2.c's
    model = ScoredHash(max_seq_len=64, choices=choices)
    per_token = model.config.kv_bytes_per_token(8)
    return LLM(model, tokenizer=_TOKENIZER[0], dtype="float64", block_size=block_size, max_model_len=64,
               kv_cache_bytes=pool_tokens * per_token, **cfg)


HASH_REQS = [([BOS, 5, 6, 7], 3, 10, 1.0), ([BOS, 9, 9], 4, 12, 0.0), ([BOS, 3, 4, 5, 6, 7, 8, 9], 2, 9, 2.0),
             ([BOS, 11], 3, 14, 0.0)]


def run_mixed(engine, beams, plain=()):
    """Beam requests and plain requests queued together, run to the end. -> (beam requests, plain outputs);
    a beam request's results: request.beam.result().sequences."""
    reqs = [engine.make_beam_request(p, W, m, length_penalty=lp) for p, W, m, lp in beams]
    for r in reqs:
        engine.enqueue(r)
    ids = [engine.add_request(p, sp) for p, sp in plain]
    while engine.has_unfinished_requests():
        engine.step()
    done = {o.request_id: o for o in engine.pop_finished()}
    return reqs, [done[i] for i in ids]


def check_hash_results(results, reqs, choices=4):
    """results: BeamSearchOutputs or beam requests, equal to the exact reference (ties and all)."""
    for res, (prompt, W, m, lp) in zip(results, reqs):
        res = res.beam.result() if hasattr(res, "beam") else res
        ref, _ = reference_beams(hash_logprobs(choices), prompt, W, m, end_ids={BOS, EOS}, lp=lp)
        got = [(s.tokens[len(prompt):], s.cum_logprob, s.score, s.finish_reason) for s in res.sequences]
        assert got == ref


MODES = {"continuous": {}, "static": dict(batching="static"),
         "chunked, 5-token budget": dict(enable_chunked_prefill=True, max_num_batched_tokens=5),
         "prefix caching": dict(enable_prefix_caching=True)}


@pytest.mark.parametrize("mode", MODES)
def test_equals_the_exact_reference_in_every_batching_mode(mode):
    """Ties, end tokens, length penalties 0, 1 and 2, early stopping; with a 5-token budget a group waits, whole,
    for a step with room for all its beams."""
    engine = hash_llm(**MODES[mode]).engine
    reqs, _ = run_mixed(engine, HASH_REQS, [([BOS, 4, 4], SamplingParams(temperature=0, max_tokens=8))])
    check_hash_results(reqs, HASH_REQS)
    assert any(s.finish_reason == "stop" for r in reqs for s in r.beam.result().sequences)   # end tokens ran
    assert_leak_free(engine)


def test_stops_early_when_no_live_beam_can_win():
    """length_penalty 0: once W hypotheses beat every live beam's cumulative logprob, no step more is run."""
    engine = hash_llm().engine
    prompt, W, m = [BOS, 9, 9], 2, 40
    ref, _ = reference_beams(hash_logprobs(4), prompt, W, m, end_ids={BOS, EOS}, lp=0.0)
    reqs, _ = run_mixed(engine, [(prompt, W, m, 0.0)])
    check_hash_results(reqs, [(prompt, W, m, 0.0)])
    assert all(h[3] == "stop" for h in ref)
    assert engine.trace.count < m, f"ran {engine.trace.count} steps for max_tokens={m}"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_groups_restart_and_find_the_same_beams(mode):
    """A pool of 96 tokens for four beam groups (each fits alone) and plain requests: groups are preempted
    whole, start over from their prompts, and end as the reference does."""
    per_token = HashModel(max_seq_len=64).config.kv_bytes_per_token(8)
    engine = hash_llm(pool_tokens=96, preemption_mode=mode, swap_bytes=64 * per_token if mode == "swap" else 0).engine
    plain = [([BOS, 7, 3], SamplingParams(temperature=0, max_tokens=20)),
             ([BOS, 8], SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=16))]
    reqs, outs = run_mixed(engine, HASH_REQS, plain)
    check_hash_results(reqs, HASH_REQS)
    assert sum(r.output().metrics.num_preemptions for r in reqs) > 0          # groups did restart
    alone = hash_llm().engine
    assert [[c.token_ids for c in o.outputs] for o in outs] == \
        [[c.token_ids for c in o.outputs] for o in run_mixed(alone, [], plain)[1]]
    assert_leak_free(engine)


def greedy_reference(prompt: list, max_tokens: int, choices: int = 4) -> list:
    ids = list(prompt)
    for _ in range(max_tokens):
        ids.append(int(torch.argmax(hash_logprobs(choices)([ids])[0])))
    return ids[len(prompt):]


beam_request = st.tuples(st.lists(st.integers(3, 12), max_size=12), st.integers(1, 4), st.integers(1, 14),
                         st.sampled_from([0.0, 1.0, 2.0]), st.integers(0, 4), st.booleans())
plain_request = st.tuples(st.lists(st.integers(3, 12), max_size=12), st.integers(1, 14), st.integers(0, 4))


@settings(deadline=None, derandomize=True, max_examples=60)
@given(beams=st.lists(beam_request, min_size=1, max_size=4), plain=st.lists(plain_request, max_size=3),
       block_size=st.sampled_from([1, 2, 4, 16]), mode=st.sampled_from(list(MODES)),
       preempt=st.sampled_from(["recompute", "swap"]), pool=st.sampled_from([1, 2, 4]),
       policy=st.sampled_from(["fcfs", "sjf", "priority", "mlfq", "fair", "lpm"]),
       fail=st.one_of(st.none(), st.tuples(st.integers(1, 40), st.sampled_from(["before", "after"]))))
def test_fuzz_beams_among_other_requests(beams, plain, block_size, mode, preempt, pool, policy, fail):
    """Beam groups and greedy requests arriving over the first steps, in every batching mode and scheduling
    policy, with pools from one group's worst case to four times it, preemption by recompute or swap, aborts, and
    a step that raises once (then the engine goes on): every beam result equals the exact reference, nothing
    leaks."""
    per_token = HashModel(max_seq_len=64).config.kv_bytes_per_token(8)
    worst = 4 * -(-27 // block_size) * block_size                    # 4 beams of 13 prompt + 14 new tokens
    cfg = dict(MODES[mode], max_num_batched_tokens=9) if "chunked" in mode else dict(MODES[mode])
    cfg["scheduling_policy"] = "fcfs" if mode == "static" else policy   # a static batch preempts no one for others
    if policy == "lpm":                              # it ranks by cached prefix: it needs the prefix cache
        cfg["enable_prefix_caching"] = True
    engine = hash_llm(block_size=block_size, pool_tokens=pool * worst, preemption_mode=preempt, max_num_seqs=8,
                      swap_bytes=64 * per_token if preempt == "swap" else 0, **cfg).engine
    engine.model.fail_at = fail
    arrivals = sorted([(r[4], "beam", i, r) for i, r in enumerate(beams)] +
                      [(r[2], "plain", i, r) for i, r in enumerate(plain)], key=lambda a: (a[0], a[1], a[2]))
    beam_reqs, plain_ids, outs, step = {}, {}, {}, 0
    while arrivals or engine.has_unfinished_requests():
        while arrivals and arrivals[0][0] <= step:
            _, kind, i, r = arrivals.pop(0)
            if kind == "beam":
                beam_reqs[i] = engine.make_beam_request([BOS] + r[0], r[1], r[2], length_penalty=r[3])
                engine.enqueue(beam_reqs[i])
            else:
                plain_ids[i] = engine.add_request([BOS] + r[0], SamplingParams(temperature=0, max_tokens=r[1],
                                                                               ignore_eos=True))
        try:
            engine.step()
        except KeyboardInterrupt:
            pass                                     # the step is undone; the next one computes it again
        step += 1
        if step == 3:
            for i, r in enumerate(beams):
                if r[5] and i in beam_reqs and beam_reqs[i].request_id in engine.requests:
                    engine.abort(beam_reqs[i].request_id)
        outs.update({o.request_id: o for o in engine.pop_finished()})
        assert step < 3000, "the engine stopped making progress"
    for i, req in beam_reqs.items():
        prompt, W, m, lp, _, aborted = beams[i]
        reasons = {c.finish_reason for c in outs[req.request_id].outputs}
        if reasons != {"abort"}:
            check_hash_results([req], [([BOS] + prompt, W, m, lp)])
        else:
            assert aborted
    for i, rid in plain_ids.items():
        assert outs[rid].token_ids == greedy_reference([BOS] + plain[i][0], plain[i][1])
    assert_leak_free(engine)


class Stutter(Continuous):
    """A policy that, every other decode step, runs only the first running sequence through Scheduler.extend_one
    (past the whole-group rule, as a rollback's recompute can): a group's beams that ran are then held."""

    def __init__(self):
        self.calls = 0

    def schedule(self, sched):
        self.calls += 1
        if self.calls % 2 or sched.waiting or not sched.running:
            return super().schedule(sched)
        batch = ScheduledBatch("decode")
        sched.extend_one(batch, sched.running[0])
        return batch


def test_part_of_a_group_is_held_until_all_its_beams_run(monkeypatch):
    holds = []

    def spy(sched, batch, out, verdicts):
        pruned = beam_step(sched, batch, out, verdicts)
        holds.extend(v for v in verdicts if v.accepted == -1)
        return pruned
    monkeypatch.setattr(beam_module, "beam_step", spy)      # what the engine's BeamStep post-processor calls
    engine = hash_llm(policy=Stutter()).engine
    reqs, _ = run_mixed(engine, HASH_REQS[:2])
    check_hash_results(reqs, HASH_REQS[:2])
    assert holds
    assert_leak_free(engine)


# ---------------------------------------------------------------------------- (c) batch invariance on numba
def test_beam_requests_beside_other_requests_give_what_they_give_alone(numba_llm):
    """numba sums in a fixed order, so a request's logits do not depend on its batch: bit-equal results."""
    engine = numba_llm.engine
    tok = numba_llm.tokenizer
    beams = [(tok.encode("ROMEO:"), 3, 10, 1.0), (tok.encode("Now is the winter"), 4, 8, 0.5)]
    plain = [(tok.encode("JULIET:"), SamplingParams(temperature=0, max_tokens=12)),
             (tok.encode("My lord"), SamplingParams(n=2, temperature=0.8, seed=7, max_tokens=10))]
    first = engine.trace.count
    together, outs = run_mixed(engine, beams, plain)
    assert max(len(st.seq_ids) for st in engine.trace.steps if st.step >= first) >= 3 + 4 + 1 + 2   # one batch
    for b, req in zip(beams, together):
        alone, _ = run_mixed(engine, [b])
        assert [(s.tokens, s.cum_logprob) for s in req.beam.result().sequences] == \
            [(s.tokens, s.cum_logprob) for s in alone[0].beam.result().sequences]
    for p, o in zip(plain, outs):
        assert [c.token_ids for c in o.outputs] == [c.token_ids for c in run_mixed(engine, [], [p])[1][0].outputs]
    assert_leak_free(engine)


# ---------------------------------------------------------------------------- (d) blocks: shared, freed, no leaks
def test_block_map_shows_beams_sharing_blocks_and_pruned_blocks_coming_back(monkeypatch):
    """Between steps the block map shows blocks of generated tokens in several beams' tables (ref count > 1);
    a beam pruned in a step gives back the blocks only it held at the model call (at least the block it just
    wrote, made private by copy-on-write), and the trace names it."""
    llm = LLM("shakespeare", backend="torch", block_size=4)
    engine, bm = llm.engine, llm.engine.block_manager
    at_call = {}

    def spy(sched, batch, out, verdicts):            # the tables as the model call left them, before pruning
        at_call.update({s.seq_id: [b for b in s.block_table if bm.ref_count[b] == 1] for s in sched.running})
        return beam_step(sched, batch, out, verdicts)
    monkeypatch.setattr(beam_module, "beam_step", spy)      # what the engine's BeamStep post-processor calls
    req = engine.make_beam_request("To be, or not to be, that is the question", 4, 16)
    engine.enqueue(req)
    prompt_blocks = len(req.prompt_ids) // 4
    shared_outputs = pruned_seen = 0
    while engine.has_unfinished_requests():
        at_call.clear()
        engine.step()
        snap = engine.block_snapshot()
        free = set(bm.free)
        for pid in engine.trace.steps[-1].pruned:
            own = at_call[pid]
            assert own and all(b in free and not snap.owners[b] for b in own)
            pruned_seen += 1
        tables = {s.seq_id: s.block_table for s in req.seqs if not s.is_finished}
        for b, owners in enumerate(snap.owners):     # a block of generated tokens in several beams' tables
            if len(owners) > 1 and all(tables[o].index(b) >= prompt_blocks for o in owners):
                assert bm.ref_count[b] == len(owners)
                shared_outputs += 1
    assert pruned_seen > 0 and shared_outputs > 0
    assert any(st.blocks_shared > 0 for st in engine.trace.steps)
    assert "fork" in {p for st in engine.trace.steps for p in st.phases}
    assert_leak_free(engine)


def test_no_block_leaks_after_abort_or_an_interrupted_step():
    llm = hash_llm()
    engine = llm.engine
    req = engine.make_beam_request([BOS, 5, 6, 7], 4, 20)
    engine.enqueue(req)
    for _ in range(5):
        engine.step()
    assert len(req.seqs) == 4 and engine.block_manager.num_free < engine.block_manager.num_blocks
    engine.abort(req.request_id)
    out = engine.pop_finished()[0]
    assert {c.finish_reason for c in out.outputs} == {"abort"} and len(out.outputs) == 4
    assert_leak_free(engine)
    engine.model.calls, engine.model.fail_at = 0, (6, "after")   # a step interrupted after its K/V writes
    with pytest.raises(KeyboardInterrupt):
        llm.beam_search([[BOS, 5, 6, 7]], 3, 10)
    assert_leak_free(engine)
    engine.model.fail_at = None
    check_hash_results(llm.beam_search([[BOS, 5, 6, 7]], 3, 10), [([BOS, 5, 6, 7], 3, 10, 1.0)])


# ---------------------------------------------------------------------------- the goal: fewer blocks than n = 4
SPEECH = ("To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer the slings and "
          "arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them. To die, "
          "to sleep; no more; and by a sleep to say we end the heart-ache and the thousand natural shocks that flesh "
          "is heir to: 'tis a consummation devoutly to be wish'd.")


def peak_blocks(llm, run) -> int:
    first = llm.engine.trace.count
    run()
    return max(st.blocks_used for st in llm.engine.trace.steps if st.step >= first)


def test_beam_width_4_uses_fewer_kv_blocks_than_4_independent_samples(numba_llm):
    """Prompt of 100 tokens, 32 new ones, block_size 16, no prefix caching: n = 4 samples share the prompt's
    blocks and copy from there on; beams also share the blocks of the tokens they have in common."""
    ids = numba_llm.tokenizer.encode(SPEECH)[:100]
    assert len(ids) == 100
    beam = peak_blocks(numba_llm, lambda: numba_llm.beam_search([ids], 4, 32, ignore_eos=True))
    n4 = peak_blocks(numba_llm, lambda: numba_llm.generate([ids], SamplingParams(n=4, temperature=1.0, seed=0,
                                                                                  max_tokens=32, ignore_eos=True)))
    print(f"peak KV blocks in use: beam_width=4 {beam}, n=4 samples {n4}")
    assert numba_llm.config.block_size == 16 and not numba_llm.config.enable_prefix_caching
    assert beam < n4


# ---------------------------------------------------------------------------- (e) bad input, refused up front
@pytest.mark.parametrize("kw, match", [
    (dict(beam_width=0), "beam_width must be a positive integer, got 0"),
    (dict(beam_width=-2), "beam_width must be a positive integer, got -2"),
    (dict(beam_width=2.5), "beam_width must be a positive integer, got 2.5"),
    (dict(beam_width=True), "beam_width must be a positive integer, got True"),
    (dict(max_tokens=0), "max_tokens must be a positive integer, got 0"),
    (dict(length_penalty=float("nan")), "length_penalty must be a finite number"),
    (dict(ignore_eos="no"), "ignore_eos must be True or False"),
    (dict(beam_width=33), "beam_width=33 beams run together but max_num_seqs=32"),
    (dict(beam_width=8, max_tokens=60), r"beam_width=8 beams of up to \d+ KV blocks each .* need \d+ blocks, but "
                                        r"the whole pool has 16"),
])
def test_bad_input_is_refused_before_anything_is_queued(torch_llm, kw, match):
    model = torch_llm.model
    llm = LLM(model, tokenizer=torch_llm.tokenizer, backend="torch", block_size=16, max_model_len=128,
              kv_cache_bytes=16 * 16 * model.config.kv_bytes_per_token(4))              # 16 blocks
    args = dict(beam_width=2, max_tokens=8) | kw
    with pytest.raises(ValueError, match=match):
        llm.beam_search(["ROMEO:", "JULIET:"], args.pop("beam_width"), args.pop("max_tokens"), **args)
    with pytest.raises(ValueError, match="prompt is empty"):     # a bad prompt after a good one: neither queued
        llm.beam_search(["ROMEO:", []], 2, 8)
    assert not llm.engine.requests and not llm.engine.scheduler.waiting
    assert [len(o.sequences) for o in llm.beam_search(["ROMEO:"], 2, 8)] == [2]   # the engine goes on


def test_engines_a_group_cannot_run_in_are_refused():
    llm = LLM("shakespeare", backend="torch", speculative={"method": "ngram", "gamma": 2})
    with pytest.raises(ValueError, match="does not combine with speculative decoding"):
        llm.beam_search("ROMEO:", 2, 4)
    llm = LLM("shakespeare", backend="torch", enable_chunked_prefill=True, max_num_batched_tokens=3)
    with pytest.raises(ValueError, match="beam_width=4 beams decode in the same step but a step computes at most "
                                         "max_num_batched_tokens=3 tokens"):
        llm.beam_search("ROMEO:", 4, 4)
    assert not llm.engine.requests


def test_a_step_that_fails_after_verification_leaves_the_beams_as_they_were():
    """An interrupt in the model runner's commit (after verification, before the beam step) is rolled back with
    no beam chosen, and the search then finds exactly what it finds uninterrupted (tests/test_update_faults.py
    interrupts the beam step itself at every line)."""
    engine = hash_llm().engine
    reqs = [engine.make_beam_request(p, W, m, length_penalty=lp) for p, W, m, lp in HASH_REQS[:2]]
    for r in reqs:
        engine.enqueue(r)
    fail_once(engine.runner, "commit", 3)                # after verify, inside the transaction, before the update
    assert run_through_failures(engine) == 1
    check_hash_results(reqs, HASH_REQS[:2])
    assert_leak_free(engine)
