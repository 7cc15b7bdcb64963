"""Data parallelism: N engine replicas behind a router, replayed on the simulated clock.

Every replica is a whole engine (weights, KV pool, scheduler) on its own clock (minillm.cluster.replica); the router
(minillm.cluster.router) sends each arriving request to one of them; minillm.cluster.sim interleaves their steps in
time. Throughput grows with the replicas; what the routing policy changes is how evenly the work is spread (queueing:
TTFT) and whether a prompt meets its prefix in the cache of the replica it lands on (prefix caching is per replica:
a system prompt cached on replica 0 saves nothing on replica 1).

    run = replay_routed(model, tokenizer, workload, "prefix_aware", num_replicas=4, step_cost=cost,
                        enable_prefix_caching=True, kv_cache_bytes=...)
    routed_metrics(run)      # throughput, TTFT / TPOT p50 p99, prefix-cache hit rate, requests per replica
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..workload import sched_metrics
from .replica import SimReplica
from .router import CacheAware, Router, check_policy, check_replicas
from .sim import Timeline, simulate


@dataclass
class RoutedRun:
    """What a routed replay produced: every RequestOutput (request ids are the workload's arrival order), the
    router (its counters and decisions), the replica of each request, each replica's modelled busy seconds, and
    the engines themselves (simulated runs: their traces)."""
    outputs: list
    router: Router
    workload: list
    replica_of: dict = field(default_factory=dict)     # request id -> replica index
    busy_s: list = field(default_factory=list)
    engines: list = field(default_factory=list)


def replay_routed(model, tokenizer, workload: list, policy: str, num_replicas: int, step_cost: Callable,
                  cache_aware: Optional[CacheAware] = None, **options) -> RoutedRun:
    """Serve `workload` (minillm.workload.Request: arrival, prompt_ids, max_tokens) on num_replicas engines
    built with these EngineConfig options, behind a Router(policy), on the simulated clock. prefix_aware's trees
    default to the capacity of one replica's KV pool, in tokens."""
    check_policy(policy)
    check_replicas(num_replicas)
    replicas = [SimReplica.build(model, tokenizer, step_cost, f"replica {i}", **options) for i in range(num_replicas)]
    if cache_aware is None:
        bm = replicas[0].engine.block_manager
        cache_aware = CacheAware(tree_tokens=bm.num_blocks * bm.block_size)
    router = Router(policy, num_replicas, cache_aware)
    run = RoutedRun([], router, sorted(workload, key=lambda r: r.arrival))
    timeline = Timeline()

    def arrive(i, req):
        def deliver(t):
            r = router.route(req.prompt_ids)
            run.replica_of[str(i)] = r
            replicas[r].add(req.prompt_ids, req.max_tokens, str(i), t)
        return deliver

    for i, req in enumerate(run.workload):
        timeline.push(req.arrival, arrive(i, req))

    def after_step(replica, finished):
        for out in finished:
            router.done(run.replica_of[out.request_id])
            run.outputs.append(out)

    simulate(replicas, timeline, after_step)
    run.busy_s, run.engines = [r.busy_s for r in replicas], [r.engine for r in replicas]
    return run


def prefix_hit_rate(outputs: list) -> float:
    """Prompt tokens whose K/V came from a replica's prefix cache, over all prompt tokens."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    return sum(o.metrics.num_cached_tokens for o in outputs) / max(1, prompt)


def routed_metrics(run: RoutedRun, slo_ttft: float = float("inf"), slo_tpot: float = float("inf")) -> dict:
    """minillm.bench.sched's metrics (throughput, JCT, TTFT and TPOT p50/p99, goodput under the SLO) plus the prefix
    hit rate, requests per replica, the busiest replica's share, and each replica's busy fraction of the span."""
    m = sched_metrics(run.outputs, run.workload, slo_ttft, slo_tpot)
    routed = run.router.routed
    return {**m, "prefix_hit_rate": prefix_hit_rate(run.outputs), "routed": list(routed),
            "max_share": max(routed) / max(1, sum(routed)),
            "busy_fraction": [float(b / m["seconds"]) for b in run.busy_s] if m["seconds"] else [],
            "decisions": run.router.summary()["decisions"],
            "ttft_mean": float(np.mean([o.metrics.time_to_first_token for o in run.outputs]))}
