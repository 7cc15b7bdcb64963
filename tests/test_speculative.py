"""Speculative decoding: exactness of the verification rule, greedy equality for every proposer, rollback,
batch independence, bad input.

Chi-square tests: the statistic's p-value comes from the chi-square survival function
(torch.special.gammaincc(df / 2, x / 2)); a test fails when p < 1e-4, so a correct implementation
fails with probability 1e-4 per test (the seeds are fixed, so in practice it either always passes or
always fails; the rate says how strong the evidence is when it fails).
"""
import itertools

import pytest
import torch

from minillm import SamplingParams
from minillm.config import EngineConfig, ModelConfig
from minillm.engine.engine import LLMEngine
from minillm.llama.transformer import Transformer
from minillm.spec_decode.config import predicted_speedup, residual, verify_greedy, verify_sampled
from minillm.spec_decode.ngram import ngram_lookup

P_FAIL = 1e-4


def chi2_pvalue(observed, expected) -> float:
    observed, expected = torch.as_tensor(observed, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64)
    stat = ((observed - expected) ** 2 / expected).sum()
    df = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def pooled(observed: dict, expected: dict, min_expected: float = 5.0):
    """Cells with expected count < min_expected are pooled into one (the chi-square approximation needs it)."""
    big = [c for c in expected if expected[c] >= min_expected]
    small = [c for c in expected if expected[c] < min_expected]
    obs = [observed.get(c, 0) for c in big] + ([sum(observed.get(c, 0) for c in small)] if small else [])
    exp = [expected[c] for c in big] + ([sum(expected[c] for c in small)] if small else [])
    return obs, exp


# ---------------------------------------------------------------- the rule itself
def test_verification_step_emits_exactly_p():
    """Fixed p and q over 8 tokens, 10^5 draws of x ~ q then verification: the emitted token is p-distributed,
    and the acceptance rate is sum_x min(p, q) (within 4.5 standard errors, false-failure rate ~1e-5)."""
    p = torch.tensor([0.30, 0.05, 0.20, 0.00, 0.15, 0.10, 0.12, 0.08], dtype=torch.float64)
    q = torch.tensor([0.10, 0.25, 0.20, 0.15, 0.05, 0.10, 0.05, 0.10], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    N = 100_000
    xs = torch.multinomial(q, N, replacement=True, generator=g).tolist()
    counts, accepted = torch.zeros(8), 0
    P, Q = torch.stack([p, p]), q[None]                   # p for the drafted slot and the bonus slot
    for x in xs:
        n, tok = verify_sampled(P, Q, [x], g)
        counts[x if n == 1 else tok] += 1
        accepted += n
    support = p > 0
    assert counts[~support].sum() == 0                    # a token p forbids is never emitted
    assert chi2_pvalue(counts[support], N * p[support]) > P_FAIL
    alpha = torch.minimum(p, q).sum().item()
    assert abs(accepted / N - alpha) < 4.5 * (alpha * (1 - alpha) / N) ** 0.5


def test_one_hot_proposer_accepts_with_p_and_resamples_without_x():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    assert torch.allclose(residual(p, None, 0), torch.tensor([0.0, 0.6, 0.4], dtype=torch.float64))
    assert torch.equal(residual(p, p.clone(), 1), p)      # p == q: the residual is empty, fall back to p
    g = torch.Generator().manual_seed(1)
    N = 40_000
    counts = torch.zeros(3)
    for _ in range(N):
        n, tok = verify_sampled(torch.stack([p, p]), None, [0], g)
        counts[0 if n == 1 else tok] += 1
    assert chi2_pvalue(counts, N * p) > P_FAIL


def test_greedy_rule_and_the_speedup_formula():
    assert verify_greedy([5, 6, 7, 8], [5, 6, 9]) == 2
    assert verify_greedy([5, 6, 7, 8], [5, 6, 7]) == 3
    assert verify_greedy([1], []) == 0
    # E(alpha, gamma) / (gamma c + r): alpha 0.8, gamma 4 gives E = 3.3616; c = 0.05, r = 1.1
    assert predicted_speedup(0.8, 4, 0.05, 1.1) == pytest.approx(3.3616 / 1.3)
    # where speculation stops paying (notebook 08): alpha 0.55, r 1.1, a costly draft loses, a cheap one wins
    assert predicted_speedup(0.55, 4, 0.3, 1.1) < 1.0 < predicted_speedup(0.55, 2, 0.05, 1.1)


def test_ngram_lookup_finds_the_latest_longest_match():
    t = [1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3]
    assert ngram_lookup(t, 2, ngram_max=3) == [4, 5]      # the latest earlier "1 2 3" was followed by 4 5
    assert ngram_lookup([7, 8, 9], 3) == []               # no earlier occurrence of any suffix
    assert ngram_lookup([4, 1, 4], 3, ngram_max=2) == [1, 4, 1]  # falls back to n = 1; the copy runs on
    assert ngram_lookup([5, 6, 7, 5, 6], 4) == [7, 5, 6, 7]    # past the context's end: the loop continues
    assert ngram_lookup([4, 1, 4], 3, ngram_min=2) == []


# ---------------------------------------------------------------- inside the engine
class IdTokenizer:
    """A tokenizer for models with a tiny vocabulary: text is never used, ids are the tokens."""
    stop_ids = []
    vocab_size = 8

    def encode(self, text):
        raise ValueError("this test tokenizer takes token ids only")

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


def vocab8(seed: int, layers: int = 2, std: float = 0.6) -> Transformer:
    cfg = ModelConfig(dim=16, hidden_dim=32, n_layers=layers, n_heads=2, n_kv_heads=1, vocab_size=8, max_seq_len=64)
    return Transformer(cfg).init_weights(seed, std=std).double().eval()


def test_first_three_sampled_tokens_match_exact_enumeration():
    """A vocab-8 target and a different vocab-8 draft: 3000 seeded requests of 3 tokens through the
    speculative engine (gamma 2: draws that accept, reject and take the bonus token all occur). The joint
    of the 3 tokens is compared with the target's own probabilities enumerated over all 512 sequences."""
    target, draft = vocab8(0), vocab8(1, layers=1)
    prompt = [1, 5, 2]
    with torch.no_grad():                                  # P(t1 t2 t3) = prod of the target's conditionals
        exact = {}
        for seq in itertools.product(range(8), repeat=3):
            x = torch.tensor([prompt + list(seq)])
            logp = torch.log_softmax(target(x)[0], -1)     # (6, 8)
            exact[seq] = float(sum(logp[len(prompt) - 1 + i, t] for i, t in enumerate(seq)).exp())
    assert sum(exact.values()) == pytest.approx(1.0)
    N = 3000
    eng = LLMEngine.from_model(target, IdTokenizer(), EngineConfig(dtype="float64", max_num_seqs=256,
                                                         speculative={"method": "draft", "gamma": 2, "model": draft}))
    ids = [eng.add_request(prompt, SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=i))
           for i in range(N)]
    outs = {}
    while eng.has_unfinished_requests():
        eng.step()
        for o in eng.pop_finished():
            outs[o.request_id] = tuple(o.outputs[0].token_ids)
    assert eng.spec_stats["accepted"] > 0 and eng.spec_stats["accepted"] < eng.spec_stats["drafted"]
    observed = {}
    for rid in ids:
        observed[outs[rid]] = observed.get(outs[rid], 0) + 1
    obs, exp = pooled(observed, {s: N * p for s, p in exact.items()})
    assert chi2_pvalue(obs, exp) > P_FAIL


@pytest.fixture(scope="module")
def shipped64():
    from minillm.formats.loader import load
    target, tok = load("shakespeare", dtype="float64")
    draft, _ = load("shakespeare-draft", dtype="float64")
    return target, draft, tok


PROMPTS = ["ROMEO.\n", "HAMLET.\nTo be, or not to be", "First Citizen.\nBefore we proceed"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def greedy_reference(shipped64):
    target, _, tok = shipped64
    return run_all(LLMEngine.from_model(target, tok, EngineConfig(dtype="float64")), PROMPTS[:2], GREEDY)


@pytest.mark.parametrize("method,gamma", [("ngram", 1), ("ngram", 3), ("draft", 1), ("draft", 2), ("draft", 5),
                                          ("medusa", 1), ("medusa", 3)])
def test_greedy_speculative_output_equals_greedy_target_output(shipped64, greedy_reference, method, gamma):
    """DESIGN.md rule 7: float64, so scoring k + 1 positions in one forward cannot flip an argmax."""
    target, draft, tok = shipped64
    spec = LLMEngine.from_model(target, tok, EngineConfig(
        dtype="float64", speculative={"method": method, "gamma": gamma, "model": draft}))
    assert run_all(spec, PROMPTS[:2], GREEDY) == greedy_reference
    assert spec.spec_stats["accepted"] > 0                  # speculation really happened
    check_no_leaks(spec)


def run_all(engine, prompts, sp):
    ids = [engine.add_request(p, sp) for p in prompts]
    done = {}
    while engine.has_unfinished_requests():
        engine.step()
        for o in engine.pop_finished():
            done[o.request_id] = o.outputs[0].token_ids
    return [done[i] for i in ids]


def check_no_leaks(engine):
    bm = engine.block_manager
    assert bm.num_free == bm.num_blocks, f"target pool: {bm.num_used} blocks still in use"
    bm.check([])
    prop = engine.proposer
    if hasattr(prop, "blocks"):
        assert prop.blocks.num_free == prop.blocks.num_blocks and not prop.shadows, "draft pool leaked blocks"
        prop.blocks.check([])


def test_rollback_frees_rejected_blocks_under_memory_pressure(shipped64):
    """block_size 4 (drafts often spill into a fresh block), a pool too small for all sequences (preemption),
    prefix caching on: after every step each running sequence holds only the blocks its tokens need (those of
    its computed tokens, and of its newest token once a speculative step has run), and
    both pools' reference counts match the block tables; at the end nothing is held."""
    target, draft, tok = shipped64
    cfg = EngineConfig(dtype="float64", block_size=4, kv_cache_bytes=36 * 4 * target.config.kv_bytes_per_token(8),
                       max_model_len=128, enable_prefix_caching=True,
                       speculative={"method": "draft", "gamma": 4, "model": draft})
    eng = LLMEngine.from_model(target, tok, cfg)
    for i, p in enumerate(PROMPTS * 2):
        eng.add_request(p, SamplingParams(temperature=0.8, max_tokens=32, seed=i, ignore_eos=True))
    preempted = 0
    while eng.has_unfinished_requests():
        eng.step()
        running = eng.scheduler.running
        for s in running:
            assert -(-(len(s) - 1) // 4) <= len(s.block_table) <= -(-len(s) // 4), (len(s), s.block_table)
        eng.block_manager.check(running)
        eng.proposer.blocks.check(list(eng.proposer.shadows.values()))
        assert set(eng.proposer.shadows) <= {s.seq_id for s in running}
        preempted = max(preempted, sum(s.metrics.num_preemptions for r in eng.requests.values() for s in r.seqs))
        eng.pop_finished()
    assert preempted > 0, "the pool was meant to be too small for every sequence at once"
    check_no_leaks(eng)                       # (prefix-cache blocks nobody holds count as free)


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_batch_composition_does_not_change_a_seeded_request(shipped64, method):
    target, draft, tok = shipped64
    spec = {"method": method, "gamma": 3, "model": draft}
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=7, ignore_eos=True)
    alone = run_all(LLMEngine.from_model(target, tok, EngineConfig(dtype="float64", speculative=spec)),
                    [PROMPTS[2]], sp)[0]
    others = [SamplingParams(temperature=t, max_tokens=m, seed=s)
              for t, m, s in [(0.0, 12, 1), (1.2, 24, 2), (0.7, 8, 3)]]
    eng = LLMEngine.from_model(target, tok, EngineConfig(dtype="float64", speculative=spec))
    ids = [eng.add_request(p, q) for p, q in zip(PROMPTS + [PROMPTS[0]], others[:2] + [sp] + others[2:])]
    done = {}
    while eng.has_unfinished_requests():
        eng.step()
        for o in eng.pop_finished():
            done[o.request_id] = o.outputs[0].token_ids
    assert done[ids[2]] == alone


def test_stops_and_max_tokens_cut_a_speculative_step(shipped64):
    target, draft, tok = shipped64
    llm_plain = LLMEngine.from_model(target, tok, EngineConfig(dtype="float64"))
    sp = SamplingParams(temperature=0, max_tokens=30, stop=["\n\n"])
    want = run_all(llm_plain, PROMPTS, sp)
    assert any(len(w) < 30 for w in want)              # one stops on the string, inside a speculative step
    eng = LLMEngine.from_model(target, tok, EngineConfig(
        dtype="float64", speculative={"method": "draft", "gamma": 6, "model": draft}))
    assert run_all(eng, PROMPTS, sp) == want
    assert all(len(w) <= 30 for w in want)
    check_no_leaks(eng)


def test_trace_records_drafted_accepted_and_emitted(shipped64):
    target, draft, tok = shipped64
    eng = LLMEngine.from_model(target, tok, EngineConfig(
        dtype="float64", speculative={"method": "draft", "gamma": 3, "model": draft}))
    rid = eng.add_request(PROMPTS[1], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    out = eng.pop_finished()[0].outputs[0].token_ids
    events = eng.trace.spec_events(rid)
    assert events and sum(len(e["emitted"]) for e in events) == len(out) - 1     # the first token came from the prefill
    assert [t for e in events for t in e["emitted"]] == out[1:]
    for e in events:
        assert e["emitted"][:e["accepted"]] == e["drafted"][:e["accepted"]] and len(e["emitted"]) <= e["accepted"] + 1


def prefill_kv(model, ids):
    """K and V of every layer for these tokens, as a plain prefill into a fresh pool writes them: (L, n, Hkv, D)
    each."""
    from minillm.llama.attention import AttentionMetadata
    from minillm.llama.kv_cache import KVCache
    n = len(ids)
    kv = KVCache(model.config, num_blocks=n, block_size=1, dtype=torch.float64)
    attn = AttentionMetadata.build(torch.arange(n)[None], torch.arange(n)[None], torch.tensor([n]), 1)
    with torch.no_grad():
        model(torch.tensor([ids]), torch.arange(n)[None], kv, attn)
    return kv.k[:, :, 0], kv.v[:, :, 0]


def test_medusa_compacts_the_accepted_path_into_consecutive_slots(shipped64):
    """After every Medusa step the cache holds, at positions 0..num_computed-1, exactly the K/V a plain
    prefill of the same tokens writes (float64, 1e-10): the accepted path was moved out of the tree's
    scattered slots (on this prompt some accepted paths leave the first branch, so moves happen)."""
    target, _, tok = shipped64
    eng = LLMEngine.from_model(target, tok, EngineConfig(dtype="float64", block_size=4,
                                                         speculative={"method": "medusa", "gamma": 3}))
    eng.add_request(PROMPTS[1], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    moves, move = [], eng.kv.move_slots
    eng.kv.move_slots = lambda src, dst: (moves.append(len(src)), move(src, dst))
    while eng.has_unfinished_requests():
        eng.step()
        for s in eng.scheduler.running:
            n = s.num_computed
            want = prefill_kv(target, s.token_ids[:n])                    # K and V, each (L, n, Hkv, D)
            slots = [s.block_table[p // 4] * 4 + p % 4 for p in range(n)]
            for pool, w in zip((eng.kv.k, eng.kv.v), want):
                got = pool.view(pool.shape[0], -1, *pool.shape[3:])[:, slots]
                assert torch.allclose(got, w, atol=1e-10)
    assert sum(moves) > 0                                              # some accepted path really was moved
    check_no_leaks(eng)


def test_draft_on_the_numba_backend_drafts_the_same_tokens(shipped64):
    """draft_backend='numba' runs the draft as one compiled forward: same greedy drafts as torch's (float32)."""
    from minillm.formats.loader import load
    target, tok = load("shakespeare")
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = []
    for backend in ("torch", "numba"):
        eng = LLMEngine.from_model(target, tok,
                                   EngineConfig(speculative={"method": "draft", "gamma": 3, "draft_backend": backend}))
        outs.append((run_all(eng, PROMPTS[:1], sp), [e["drafted"] for st in eng.trace.steps for e in st.spec]))
    assert outs[0][1] and outs[0] == outs[1]


def test_medusa_serves_parallel_samples_and_swapped_sequences(shipped64):
    """n = 2 greedy samples fork after the prefill (each needs the parent's hidden state), and a pool too small
    for both prompts swaps one out and back (its hidden state must survive): same tokens as plain decoding."""
    target, _, tok = shipped64
    opts = dict(dtype="float64", max_model_len=48, block_size=4,
                swap_bytes=16 * 4 * target.config.kv_bytes_per_token(8),
                kv_cache_bytes=18 * 4 * target.config.kv_bytes_per_token(8), preemption_mode="swap")
    sp = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=2),
          SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)]
    outs = []
    for spec in (None, {"method": "medusa", "gamma": 3}):
        eng = LLMEngine.from_model(target, tok, EngineConfig(**opts, speculative=spec))
        ids = [eng.add_request(p, s) for p, s in zip(PROMPTS[:2], sp)]
        done, swapped = {}, 0
        while eng.has_unfinished_requests():
            eng.step()
            swapped = max(swapped, len(eng.scheduler.swapped))
            for o in eng.pop_finished():
                done[o.request_id] = [c.token_ids for c in o.outputs]
        outs.append(([done[i] for i in ids], swapped))
    (plain, _), (spec_out, swapped) = outs
    assert spec_out == plain and swapped > 0


def test_a_draft_pool_shortfall_drafts_less_instead_of_failing(shipped64):
    """n = 4 samples share their prompt's blocks in the target's pool but not in the draft's: with a pool
    that holds little more than one sequence, the draft runs out of room; those sequences decode plainly
    for a step. Nothing fails, nothing leaks, and greedy output is unchanged."""
    target, draft, tok = shipped64
    opts = dict(dtype="float64", max_model_len=64, block_size=16, max_num_seqs=1,
                kv_cache_bytes=8 * 16 * target.config.kv_bytes_per_token(8))
    from minillm.bench.spec import held_out_prompts
    prompt = held_out_prompts(tok, 1, length=33)[0]                        # 2 full blocks shared by the 4 samples
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=4)
    want = run_all_n(LLMEngine.from_model(target, tok, EngineConfig(**opts)), prompt, sp)
    eng = LLMEngine.from_model(target, tok,
                               EngineConfig(**opts, speculative={"method": "draft", "gamma": 4, "model": draft}))
    drops, rollback = [], eng.proposer.rollback
    eng.proposer.rollback = lambda seq, valid: (drops.append(seq.seq_id) if valid == 0 else None, rollback(seq, valid))
    assert run_all_n(eng, prompt, sp) == want and want[0] == want[3]
    assert drops, "the draft pool was meant to run short"
    check_no_leaks(eng)


def run_all_n(engine, prompt, sp):
    engine.add_request(prompt, sp)
    out = None
    while engine.has_unfinished_requests():
        engine.step()
        out = engine.pop_finished() or out
    return [c.token_ids for c in out[0].outputs]


def test_no_room_for_drafts_means_plain_decoding_not_preemption(shipped64):
    """A tight pool: reserving gamma = 8 draft slots would preempt another sequence; the scheduler grants no
    draft slots instead, so speculation never preempts more than plain decoding does."""
    target, _, tok = shipped64
    opts = dict(dtype="float64", block_size=4, max_model_len=64,
                kv_cache_bytes=20 * 4 * target.config.kv_bytes_per_token(8))
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    counts = []
    for spec in (None, {"method": "ngram", "gamma": 8}):
        eng = LLMEngine.from_model(target, tok, EngineConfig(**opts, speculative=spec))
        ids = [eng.add_request(p, sp) for p in PROMPTS]
        while eng.has_unfinished_requests():
            eng.step()
        counts.append(sum(s.metrics.num_preemptions for i in ids for s in eng.requests[i].seqs))
    assert counts[1] <= counts[0], counts


def test_speculation_with_chunked_prefill_equals_plain_greedy(shipped64, greedy_reference):
    """One step path: chunked prefill's mixed steps carry decode rows with drafts beside prompt chunks, the drafts
    counted in the token budget."""
    target, draft, tok = shipped64
    for method in ("ngram", "draft"):
        eng = LLMEngine.from_model(target, tok, EngineConfig(dtype="float64", enable_chunked_prefill=True,
                                                             max_num_batched_tokens=16,
                                                             speculative={"method": method, "gamma": 3,
                                                                          "model": draft}))
        assert run_all(eng, PROMPTS[:2], GREEDY) == greedy_reference
        assert eng.spec_stats["accepted"] > 0
        assert all(s.num_prefill_tokens + s.num_decode_tokens <= 16 for s in eng.trace.steps)
        check_no_leaks(eng)


# ---------------------------------------------------------------- the bonus token (issue 34, item 7)
def disjoint_rows(k: int) -> torch.Tensor:
    """p (k + 1, V = 4 (k + 1)): slot i puts [0.1, 0.2, 0.3, 0.4] on tokens 4i .. 4i + 3 and nothing elsewhere,
    so a token names the slot whose distribution drew it."""
    p = torch.zeros(k + 1, 4 * (k + 1), dtype=torch.float64)
    for i in range(k + 1):
        p[i, 4 * i:4 * i + 4] = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    return p


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("proposer", ["q-is-p", "one-hot"])
def test_the_bonus_token_is_drawn_from_the_slot_after_the_last_draft(k, proposer):
    """Every draft accepted (q = p on the drafted slots, so p / q = 1; or a one-hot proposer drafting the token
    its slot's p is certain of), so every call emits a bonus token, and it must come from p_{k+1} = p[k]. The
    rows' supports are disjoint, so a bonus drawn from any other slot (p[k - 1], say) lands outside p[k]'s
    support: that check is exact, no tolerance. The chi-square test (P_FAIL, as above: 4 cells, 4000 draws) checks
    the bonus follows p[k]'s weights too, not just its support."""
    p, g, N = disjoint_rows(k), torch.Generator().manual_seed(k), 4000
    if proposer == "one-hot":
        p[:k] = 0.0
        p[torch.arange(k), 4 * torch.arange(k) + 3] = 1.0           # slot i is certain of token 4i + 3
    q = p[:k].clone() if proposer == "q-is-p" else None
    bonus = torch.zeros(p.shape[1])
    for _ in range(N):
        draft = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(k)]    # x_i ~ q_i = p_i
        n, tok = verify_sampled(p, q, draft, g)
        assert n == k                                                 # p / q = 1: never rejected
        bonus[tok] += 1
    drawn = bonus.nonzero().flatten().tolist()
    assert bonus[4 * k:].sum() == N, f"bonus tokens drawn: {drawn}; p[k]'s support is {4 * k} .. {4 * k + 3}"
    assert chi2_pvalue(bonus[4 * k:], N * p[k, 4 * k:]) > P_FAIL


def test_top_k_1_sampling_with_the_target_as_its_own_draft_is_greedy(shipped64, greedy_reference):
    """temperature 1 with top_k = 1 makes p and q one-hot at their argmax, so speculative SAMPLING is
    deterministic: the emitted tokens are the target's greedy tokens whatever is drafted. With the target as its
    own draft every draft is accepted, so every speculative step ends in a bonus token from p_{k+1}; one drawn
    from p_k instead repeats the last draft. gamma 3 < max_tokens, so the bonus is not cut by max_tokens (float64:
    the argmax of the verification forward is the plain forward's)."""
    target, _, tok = shipped64
    eng = LLMEngine.from_model(target, tok, EngineConfig(
        dtype="float64", speculative={"method": "draft", "gamma": 3, "model": target}))
    sp = SamplingParams(temperature=1.0, top_k=1, max_tokens=GREEDY.max_tokens, ignore_eos=True, seed=0)
    assert run_all(eng, PROMPTS[:2], sp) == greedy_reference
    stats = eng.spec_stats
    assert stats["drafted"] > 0 and stats["accepted"] == stats["drafted"]   # every step took its bonus token
    check_no_leaks(eng)
