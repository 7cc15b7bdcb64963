"""Data parallelism (minillm.cluster): the router's policies decision by decision, the discrete-event loop that runs
replicas in parallel on the simulated clock, and a routed replay. No timing is asserted: simulated seconds come from
a fixed StepCost, so every number below is a deterministic function of the trace."""
import random

import pytest

from minillm.bench.step_cost import StepCost
from minillm.cluster import ROUTING_POLICIES, CacheAware, Router, replay_routed, routed_metrics
from minillm.cluster.router import NoLiveReplica
from minillm.formats.loader import random_model
from minillm.workload import Request

COST = StepCost(1e-3, 5e-4, 1e-4, "test")
OPTS = dict(backend="torch", max_model_len=256, block_size=8, max_num_seqs=8)


@pytest.fixture(scope="module")
def tiny():
    return random_model("tiny", n_layers=1)


def prompt(prefix: int, user: int, n_user: int = 4) -> list:
    """A shared system prompt (24 tokens, by `prefix`) and a user's question (by `user`)."""
    return [1] + [300 + prefix] * 23 + [400 + user + i for i in range(n_user)]


# ---------------------------------------------------------------------------- the router, decision by decision
def test_round_robin_takes_turns_and_least_loaded_counts_outstanding_requests():
    rr = Router("round_robin", 3)
    assert [rr.route([1, 2]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    ll = Router("least_loaded", 3)
    assert [ll.route([1]) for _ in range(3)] == [0, 1, 2]       # ties go to the lowest index
    ll.done(1)
    assert ll.route([1]) == 1 and ll.load == [1, 1, 1]
    ll.done(2)
    assert ll.route([1]) == 2 and ll.routed == [1, 2, 2]


def test_least_loaded_follows_the_finished_requests():
    r = Router("least_loaded", 2)
    assert [r.route([1]) for _ in range(4)] == [0, 1, 0, 1]
    r.done(0), r.done(0)                                        # replica 0 drained
    assert [r.route([1]) for _ in range(2)] == [0, 0]
    assert r.load == [2, 2] and r.routed == [4, 2]


def test_prefix_aware_keeps_a_system_prompt_on_one_replica():
    r = Router("prefix_aware", 2)
    first = [r.route(prompt(p, u)) for p, u in ((0, 0), (1, 0))]
    assert first == [0, 1]                                      # nothing matches: the smallest tree, then the other
    again = [r.route(prompt(p, u)) for p, u in ((0, 1), (1, 1), (0, 2), (1, 2), (0, 3))]
    assert again == [0, 1, 0, 1, 0]                             # 24 of 28 tokens match: > cache_threshold 0.3
    whys = r.summary()["decisions"]
    assert whys == {"smallest tree": 2, "cache hit": 5}


def test_prefix_aware_below_the_threshold_goes_to_the_smallest_tree():
    r = Router("prefix_aware", 2, CacheAware(cache_threshold=0.9))
    assert r.route(prompt(0, 0)) == 0
    assert r.route(prompt(0, 1)) == 1          # 24 / 28 = 0.86 < 0.9: the smallest tree (replica 1, empty) instead
    assert [w for _, w in r.decisions] == ["smallest tree", "smallest tree"]


def test_prefix_aware_balances_an_imbalanced_load_first():
    """SGLang's rule: imbalanced when max - min > balance_abs_threshold AND max > min * balance_rel_threshold; then
    the least-loaded replica, whatever the cache says."""
    r = Router("prefix_aware", 2, CacheAware(balance_abs_threshold=2, balance_rel_threshold=1.5))
    assert [r.route(prompt(0, u)) for u in range(3)] == [0, 0, 0]      # loads [2, 0]: 2 - 0 is not > 2
    assert r.route(prompt(0, 9)) == 1 and r.decisions[-1] == (1, "imbalanced")   # loads [3, 0]
    # with the default thresholds (64, 1.5) a difference of 4 is balanced: the cache decides
    d = Router("prefix_aware", 2)
    assert [d.route(prompt(0, u)) for u in range(6)] == [0] * 6


def test_the_trees_are_bounded_by_their_capacity():
    r = Router("prefix_aware", 1, CacheAware(tree_tokens=40))
    for u in range(5):
        r.route(prompt(u, u))                    # 28 tokens each, 5 different prefixes
    assert len(r.trees[0]) <= 40                 # evicted least-recently-used leaves


def test_every_policy_skips_the_replicas_that_are_down():
    rr = Router("round_robin", 3)
    rr.set_up(1, False)
    assert [rr.route([1]) for _ in range(4)] == [0, 2, 0, 2]
    rr.set_up(1, True)
    assert [rr.route([1]) for _ in range(3)] == [0, 1, 2]       # back in its turn
    ll = Router("least_loaded", 2)
    ll.set_up(0, False)
    assert [ll.route([1]) for _ in range(3)] == [1, 1, 1] and ll.summary()["state"] == ["down", "up"]
    pa = Router("prefix_aware", 2)
    assert [pa.route(prompt(0, u)) for u in range(2)] == [0, 0]
    pa.set_up(0, False)                                         # the replica holding the prefix goes away
    assert pa.route(prompt(0, 2)) == 1 and pa.decisions[-1] == (1, "smallest tree")
    pa.set_up(0, True)                                          # restarted: its cache (and tree) is empty
    assert len(pa.trees[0]) == 0 and pa.route(prompt(0, 3)) == 1 and pa.decisions[-1] == (1, "cache hit")


def test_with_every_replica_down_route_raises_and_loads_are_kept():
    r = Router("least_loaded", 2)
    r.route([1])
    r.set_up(0, False), r.set_up(1, False)
    with pytest.raises(NoLiveReplica, match="all 2 replicas are down"):
        r.route([1])
    assert r.load == [1, 0] and r.routed == [1, 0]             # a refused route counts nowhere
    r.done(0)                                                   # a request out on a dead replica still ends
    for bad in (2, -1, True, "0"):
        with pytest.raises(ValueError, match="replicas are 0 .. 1"):
            r.set_up(bad, True)


def test_bad_router_input_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown routing policy 'random'.*round_robin"):
        Router("random", 2)
    for n in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_replicas must be an integer >= 1"):
            Router("round_robin", n)
    with pytest.raises(ValueError, match="cache_threshold must be in"):
        CacheAware(cache_threshold=1.5)
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        CacheAware(balance_rel_threshold=0.5)
    r = Router("least_loaded", 2)
    with pytest.raises(ValueError, match="no outstanding request on replica 1"):
        r.done(1)
    assert ROUTING_POLICIES == ("round_robin", "least_loaded", "prefix_aware")


# ---------------------------------------------------------------------------- replicas on the simulated clock
def shared_trace(n: int, rate: float, prefixes: int = 4) -> list:
    """n requests, one every 1/rate s, each with one of `prefixes` system prompts drawn at random (seeded: a fixed
    order would line up with round robin's turns)."""
    rng = random.Random(0)
    return [Request(i / rate, prompt(rng.randrange(prefixes), i), 6) for i in range(n)]


def test_replicas_run_in_parallel_on_the_simulated_clock(tiny):
    """All requests at t=0, round robin: two replicas finish the same work in about half the simulated time of one
    (their clocks interleave; neither waits for the other's steps). 0.6 leaves room for the uneven split of a
    step's fixed overhead; a serialising bug would give 1.0."""
    trace = [Request(0.0, prompt(i % 4, i), 12) for i in range(16)]
    one = routed_metrics(replay_routed(*tiny, trace, "round_robin", 1, COST, **OPTS))
    two = routed_metrics(replay_routed(*tiny, trace, "round_robin", 2, COST, **OPTS))
    assert two["seconds"] < 0.6 * one["seconds"]
    assert one["requests"] == two["requests"] == 16


def test_a_routed_replay_serves_every_request_once_with_its_tokens(tiny):
    trace = shared_trace(24, rate=200.0)
    for policy in ROUTING_POLICIES:
        run = replay_routed(*tiny, trace, policy, 3, COST, enable_prefix_caching=True, **OPTS)
        assert sorted(int(o.request_id) for o in run.outputs) == list(range(24))
        assert all(len(o.token_ids) == 6 for o in run.outputs)                 # ignore_eos: exactly max_tokens
        assert run.router.load == [0, 0, 0] and sum(run.router.routed) == 24
        for o in run.outputs:                                                   # causality on each replica's clock
            m = o.metrics
            assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
        for e in run.engines:                                                   # a replica's steps never overlap
            starts = [(s.start, s.start + s.seconds) for s in e.trace.steps]
            assert all(b[0] >= a[1] - 1e-12 for a, b in zip(starts, starts[1:]))


def test_prefix_aware_routing_raises_the_prefix_hit_rate(tiny):
    """4 system prompts (3 blocks each) on 2 replicas whose KV pools (16 blocks) hold the running requests and about
    two prefixes each:
    round robin sends every prefix everywhere (each replica's cache churns through all four), the prefix-aware
    router keeps two on each. Deterministic on the simulated clock."""
    trace = shared_trace(32, rate=100.0)
    opts = dict(OPTS, enable_prefix_caching=True, max_model_len=64, max_num_seqs=4,
                kv_cache_bytes=16 * 8 * tiny[0].config.kv_bytes_per_token(4))     # 16 blocks of 8 tokens
    rates = {p: routed_metrics(replay_routed(*tiny, trace, p, 2, COST, **opts))["prefix_hit_rate"]
             for p in ("round_robin", "prefix_aware")}
    assert rates["prefix_aware"] > rates["round_robin"] + 0.1


def test_routed_replay_refuses_bad_input(tiny):
    with pytest.raises(ValueError, match="unknown routing policy"):
        replay_routed(*tiny, shared_trace(2, 10.0), "fastest", 2, COST, **OPTS)
    with pytest.raises(ValueError, match="num_replicas must be an integer >= 1"):
        replay_routed(*tiny, shared_trace(2, 10.0), "round_robin", 0, COST, **OPTS)
