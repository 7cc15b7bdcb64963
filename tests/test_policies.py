"""Scheduling orders (minillm.scheduling.orders, EngineConfig.scheduling_policy): each order on hand-built queues,
priority preemption, MLFQ's skip-join, demotion and promotion, VTC's counters and its lift, the cache-aware order, and
the rule that an order changes WHEN a request runs, never WHAT it computes (the hash model's outputs under
fuzzed schedules, and the shipped model's greedy tokens on the numba backend, bit for bit)."""
import zlib

import pytest
from hashmodel import HashModel, reference
from hypothesis import given, settings
from test_scheduler_fuzz import run_schedule, schedules

from minillm import LLM, SamplingParams
from minillm.config import EngineConfig
from minillm.core.block_manager import BlockManager
from minillm.core.policies import Chunked, Continuous
from minillm.core.scheduler import Scheduler
from minillm.core.sequence import Sequence
from minillm.engine.engine import LLMEngine
from minillm.labs.hashmodel import IdTokenizer
from minillm.scheduling import make_policy
from minillm.scheduling.orders import (
    FCFS,
    MLFQ,
    LongestPrefix,
    Priority,
    ShortestJobFirst,
    VirtualTokenCounter,
    make_order,
)


# ---------------------------------------------------------------- hand-built queues (pure Python, no model)
def make_sched(order, max_num_seqs=8, blocks=64, block_size=4):
    cfg = EngineConfig(max_model_len=64, max_num_seqs=max_num_seqs)
    return Scheduler(cfg, BlockManager(blocks, block_size), lambda: 0.0, None, policy=Continuous(order))


def make_seq(i, prompt_len, max_tokens=8, priority=0, client=None, arrival=None, token=5):
    s = Sequence(i, str(i), 0, [1] + [token] * (prompt_len - 1), SamplingParams(max_tokens=max_tokens), 0,
                 float(i) if arrival is None else arrival)
    s.priority, s.client = priority, client
    return s


def admission_order(order, seqs, **kw):
    sched = make_sched(order, **kw)
    sched.waiting.extend(seqs)
    order.refresh(sched)
    return [s.seq_id for s in order.admissible(sched)]


def test_fcfs_is_the_queue_as_it_stands():
    seqs = [make_seq(i, p) for i, p in enumerate([30, 2, 9])]
    assert admission_order(FCFS(), seqs) == [0, 1, 2]


def test_sjf_ranks_by_prompt_plus_max_tokens():
    seqs = [make_seq(0, 30, 8), make_seq(1, 2, 40), make_seq(2, 9, 8), make_seq(3, 9, 8)]   # 38, 42, 17, 17
    assert admission_order(ShortestJobFirst(), seqs) == [2, 3, 0, 1]                     # ties: the older first


def test_priority_ranks_lower_first_then_by_arrival():
    seqs = [make_seq(0, 4, priority=2), make_seq(1, 4, priority=-1), make_seq(2, 4, priority=2),
            make_seq(3, 4, priority=0)]
    assert admission_order(Priority(), seqs) == [1, 3, 0, 2]


def test_mlfq_skip_join_picks_the_first_queue_by_prompt_cost():
    mlfq = MLFQ(levels=4, quantum=8, prompt_weight=1 / 16)          # quanta 8, 16, 32, unbounded
    assert [mlfq.first_level(n) for n in (1, 128, 129, 256, 257, 512, 513, 5000)] == [0, 0, 1, 1, 2, 2, 3, 3]
    seqs = [make_seq(0, 600), make_seq(1, 200), make_seq(2, 3)]
    assert admission_order(MLFQ(), seqs) == [2, 1, 0]


def test_lpm_ranks_by_the_longest_cached_prefix():
    order = LongestPrefix()
    order.tree.insert([1] + [7] * 20)
    seqs = [make_seq(0, 12, token=9), make_seq(1, 12, token=7), make_seq(2, 6, token=7)]
    assert admission_order(order, seqs) == [1, 2, 0]                 # 11 and 5 tokens matched, then none


def test_fair_alternates_clients_by_their_counters():
    seqs = [make_seq(i, 8, client="A") for i in range(4)] + [make_seq(4 + i, 8, client="B") for i in range(2)]
    assert admission_order(VirtualTokenCounter(), seqs) == [0, 4, 1, 5, 2, 3]


def test_a_swapped_sequence_that_outranks_the_waiting_comes_back_first():
    order = Priority()
    sched = make_sched(order)
    low, high, lower = make_seq(0, 4, priority=5), make_seq(1, 4, priority=1), make_seq(2, 4, priority=9)
    sched.waiting.extend([low, lower])
    sched.swapped.append(high)
    assert order.admissible(sched) == [] and order.next_swap_in(sched) is high
    sched.swapped[0] = make_seq(3, 4, priority=7)                     # now it ranks between the two waiting ones
    assert order.admissible(sched) == [low] and order.next_swap_in(sched) is None


def test_unknown_order_names_the_choices():
    with pytest.raises(ValueError, match="'lifo' is not one of"):
        make_order("lifo")
    with pytest.raises(ValueError, match="scheduling_policy='lifo' is not one of"):
        EngineConfig(scheduling_policy="lifo")


# ---------------------------------------------------------------- MLFQ: demotion by tokens served, promotion
def test_mlfq_demotes_after_each_quantum_and_promotes_after_a_wait():
    mlfq = MLFQ(levels=3, quantum=2, prompt_weight=0.0, starve_steps=3)   # quanta 2, 4, unbounded
    sched = make_sched(mlfq)
    s = make_seq(0, 4)
    sched.running.append(s)
    levels = []
    for _ in range(9):
        mlfq.refresh(sched)
        levels.append(mlfq.level(s))
        s.output_ids.append(3)
    assert levels == [0, 0, 1, 1, 1, 1, 2, 2, 2]          # 2 tokens at level 0, 4 at level 1, then the last level
    sched.running.remove(s)
    sched.waiting.append(s)                                # preempted: it waits
    for _ in range(2):
        mlfq.refresh(sched)
    assert mlfq.level(s) == 2 and mlfq.promotions == 0
    mlfq.refresh(sched)                                    # three steps without running: back to the top queue
    assert mlfq.level(s) == 0 and mlfq.promotions == 1


def hash_engine(policy_name=None, policy=None, **opts):
    model = HashModel()
    per_token = model.config.kv_bytes_per_token(8)
    cfg = dict(dtype="float64", block_size=4, max_model_len=64, kv_cache_bytes=256 * per_token)
    if policy_name:
        cfg["scheduling_policy"] = policy_name
    cfg.update(opts)
    return LLMEngine.from_model(model, IdTokenizer(), EngineConfig(**cfg), **({"policy": policy} if policy else {}))


def run_to_end(engine, arrivals, limit=2000):
    """arrivals: {step: [(prompt, max_tokens, kwargs)]}; -> ({request id: output}, {request id: finish step})."""
    outs, done, step, ids = {}, {}, 0, {}
    while step in arrivals or any(s > step for s in arrivals) or engine.has_unfinished_requests():
        for prompt, n, kw in arrivals.get(step, []):
            rid = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), **kw)
            ids[rid] = prompt, n
        engine.step()
        for o in engine.pop_finished():
            outs[o.request_id], done[o.request_id] = o, step
        step += 1
        assert step < limit
    for rid, (prompt, n) in ids.items():                   # the order never changes what is computed
        assert outs[rid].outputs[0].token_ids == reference(prompt, n)
    return outs, done


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_priority_preempts_a_lower_priority_request(mode):
    swap = dict(preemption_mode="swap", swap_bytes=256 * HashModel().config.kv_bytes_per_token(8)) \
        if mode == "swap" else {}
    engine = hash_engine("priority", max_num_seqs=1, **swap)
    outs, done = run_to_end(engine, {0: [([1, 5, 6], 20, {"priority": 5})], 3: [([1, 7], 3, {"priority": 0})]})
    assert done["1"] < done["0"]                          # the urgent one came later and finished first
    assert outs["0"].metrics.num_preemptions == 1 and outs["1"].metrics.num_preemptions == 0
    assert outs["1"].metrics.time_to_first_token is not None


def test_fcfs_does_not_preempt_for_a_later_request():
    engine = hash_engine(max_num_seqs=1)
    outs, done = run_to_end(engine, {0: [([1, 5, 6], 20, {})], 3: [([1, 7], 3, {})]})
    assert done["0"] < done["1"] and outs["0"].metrics.num_preemptions == 0


def test_mlfq_lets_a_short_job_pass_a_long_one_and_promotes_the_starved():
    def serve(starve_steps):
        engine = hash_engine(max_num_seqs=1, policy=Continuous(MLFQ(quantum=2, starve_steps=starve_steps)))
        stream = {t: [([1, 9, t % 50 + 3], 1, {})] for t in range(2, 60)}          # one short request per step
        return run_to_end(engine, {0: [([1, 5, 6], 12, {})], **stream})
    outs, done = serve(10 ** 6)
    assert done["0"] > 59                                   # the demoted long job waits out the whole stream
    assert outs["0"].metrics.num_preemptions >= 1
    outs, done = serve(8)
    assert done["0"] < 59                                   # promoted after 8 steps of waiting, it finishes first


def test_vtc_counts_each_clients_service_and_interleaves_them():
    order = VirtualTokenCounter(w_p=1.0, w_q=2.0)
    engine = hash_engine(policy=Continuous(order), max_num_seqs=1)
    a = [([1, 4 + i, 5], 4, {"client": "A"}) for i in range(4)]          # each 3 + 2 * 4 = 11 virtual tokens
    b = [([1, 8 + i], 2, {"client": "B"}) for i in range(2)]             # each 2 + 2 * 2 = 6
    outs, _ = run_to_end(engine, {0: a + b})
    first = sorted(outs.values(), key=lambda o: o.metrics.first_scheduled_time)
    assert [o.request_id for o in first] == ["0", "4", "5", "1", "2", "3"]   # B at 6 < A at 11: B twice in a row
    assert order.counters == {"A": 4 * (3 + 2 * 4), "B": 2 * (2 + 2 * 2)}          # w_p * prompt + w_q * output
    assert order.served == {"A": 16, "B": 4}


def test_vtc_lifts_a_returning_client_to_the_least_served_active_one():
    order = VirtualTokenCounter()
    sched = make_sched(order)
    sched.waiting.extend([make_seq(0, 4, client="A"), make_seq(1, 4, client="B")])
    order.refresh(sched)
    order.counters.update({"A": 100.0, "B": 40.0, "C": 5.0})    # C was served long ago, then went idle
    sched.waiting.append(make_seq(2, 4, client="C"))
    order.refresh(sched)
    assert order.counters["C"] == 40.0                        # no credit banked while idle
    assert order.admissible(sched)[0].client == "B"           # ties go to the older request


def test_lpm_admits_the_request_whose_prefix_is_cached_first():
    shared = [1] + list(range(10, 40))
    served = {}
    for name in ("fcfs", "lpm"):
        engine = hash_engine(name, max_num_seqs=1, enable_prefix_caching=True,      # 16 blocks: the other prompt
                             kv_cache_bytes=64 * HashModel().config.kv_bytes_per_token(8))   # evicts part of it
        outs, done = run_to_end(engine, {0: [(shared, 2, {})],
                                         4: [([1] + list(range(50, 90)), 2, {}), (shared[:28] + [99, 98], 2, {})]})
        served[name] = done["1"] < done["2"], outs["2"].metrics.num_cached_tokens
    assert served["fcfs"][0] and not served["lpm"][0]        # lpm takes the later request, whose prefix is cached
    assert served["lpm"][1] == 28 > served["fcfs"][1]       # the 7 shared blocks of 4 found, or partly evicted


# ---------------------------------------------------------------- an order changes WHEN, never WHAT
class HashedPriority(Priority):
    """Priorities that vary from request to request (a hash of its id), so that preemption happens in the fuzzer."""

    def key(self, seq):
        return (zlib.crc32(seq.request_id.encode()) % 5,) + self.tiebreak(seq)   # (hash() of a str varies by run)


ORDER_MAKERS = {"sjf": ShortestJobFirst, "priority": HashedPriority, "mlfq": lambda: MLFQ(quantum=2, starve_steps=6),
                "fair": VirtualTokenCounter, "lpm": lambda: LongestPrefix(64)}


@pytest.mark.parametrize("name", list(ORDER_MAKERS))
@settings(deadline=None, derandomize=True, max_examples=40)
@given(**schedules)
def test_fuzz_every_order_gives_the_sequential_outputs_and_leaks_nothing(name, **kw):
    kw["mode"] = "chunked" if kw["mode"] == "chunked" else "continuous"      # static: fcfs, fair and lpm only
    kw["caching"] = kw["caching"] or name == "lpm"
    order = ORDER_MAKERS[name]()
    run_schedule(**kw, policy=(Chunked if kw["mode"] == "chunked" else Continuous)(order))


POLICIES = ["fcfs", "sjf", "priority", "mlfq", "fair", "lpm"]


def test_the_shipped_model_gives_the_same_greedy_tokens_under_every_order():
    """numba's sums do not depend on batch composition (DESIGN rule 7), so the same tokens bit for bit, though each
    order runs the requests in other batches and, with max_num_seqs=2, preempts some."""
    prompts = ["To be, or not to be", "Hamlet", "O Romeo, Romeo", "Now is the winter", "Friends, Romans"]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 3, 9, 1, 6)]
    got = {}
    for name in POLICIES:
        llm = LLM("shakespeare", backend="numba", max_num_seqs=2, scheduling_policy=name,
                  enable_prefix_caching=name == "lpm")
        prio = [3, 0, 2, 1, 0] if name == "priority" else 0
        got[name] = [o.token_ids for o in llm.generate(prompts, params, priority=prio, client=list("ABABA"))]
        steps = [s.seq_ids for s in llm.engine.trace.steps]
        got[name + " steps"] = steps
    assert all(got[n] == got["fcfs"] for n in POLICIES)
    assert got["sjf steps"] != got["fcfs steps"] and got["priority steps"] != got["fcfs steps"]   # other schedules


# ---------------------------------------------------------------- bad input: refused before anything is queued
@pytest.mark.parametrize("kw, match", [
    (dict(priority="high"), "priority must be an integer"),
    (dict(priority=True), "priority must be an integer"),
    (dict(priority=1.5), "priority must be an integer"),
    (dict(client=["a"]), "client must be None, a str or an int"),
    (dict(client={"a": 1}), "client must be None, a str or an int"),
    (dict(client=2.0), "client must be None, a str or an int"),
])
def test_bad_priority_or_client_is_refused_before_queuing(kw, match):
    engine = hash_engine("priority")
    with pytest.raises(ValueError, match=match):
        engine.add_request([1, 5], SamplingParams(max_tokens=2), **kw)
    assert not engine.requests and not engine.has_unfinished_requests()


def test_a_priority_without_priority_scheduling_is_refused():
    engine = hash_engine("fcfs")
    with pytest.raises(ValueError, match=r"priority=3 needs scheduling_policy='priority'.*'fcfs'"):
        engine.add_request([1, 5], SamplingParams(max_tokens=2), priority=3)
    assert not engine.requests
    engine.add_request([1, 5], SamplingParams(max_tokens=2), priority=0, client="alice")   # the default is fine


def test_generate_checks_every_prompts_priority_before_queuing(tiny64):
    model, tok = tiny64
    llm = LLM(model, tokenizer=tok, scheduling_policy="priority")
    with pytest.raises(ValueError, match="2 prompts but 3 values of priority="):
        llm.generate(["a", "b"], SamplingParams(max_tokens=2), priority=[0, 1, 2])
    with pytest.raises(ValueError, match="priority must be an integer"):
        llm.generate(["a", "b"], SamplingParams(max_tokens=2), priority=[0, "1"])
    assert not llm.engine.requests and not llm.engine.has_unfinished_requests()
    outs = llm.generate(["a", "b"], SamplingParams(max_tokens=2, temperature=0), priority=[1, 0], client="x")
    assert [len(o.token_ids) for o in outs] == [2, 2]


@pytest.mark.parametrize("opts, match", [
    (dict(batching="static", scheduling_policy="mlfq"), "scheduling_policy='mlfq' preempts running requests"),
    (dict(batching="dynamic", scheduling_policy="priority"), "a dynamic batch never does"),
    (dict(batching="static", scheduling_policy="sjf"), "scheduling_policy='sjf' preempts"),
    (dict(scheduling_policy="lpm"), "needs enable_prefix_caching=True"),
])
def test_unsupported_combinations_are_refused(tiny64, opts, match):
    model, tok = tiny64
    with pytest.raises(ValueError, match=match):
        LLM(model, tokenizer=tok, **opts)


def test_supported_combinations_build():
    for opts in (dict(batching="static", scheduling_policy="fair"),
                 dict(enable_chunked_prefill=True, scheduling_policy="mlfq"),
                 dict(batching="dynamic", scheduling_policy="lpm", enable_prefix_caching=True)):
        policy = make_policy(EngineConfig(**opts))
        assert policy.order.name == opts["scheduling_policy"]
