"""The router in front of data-parallel replicas: which engine serves the next request.

Data parallelism runs N copies of the whole engine (each its own weights, KV pool, scheduler and clock) and a
router that sends every request to one of them. What the router cannot do is split a request: so its one
decision, per request, decides the replicas' load balance AND which replica's prefix cache the prompt meets.

    round_robin   replica 0, 1, ..., N-1, 0, ...: blind to load and to prompts (SGLang's and vLLM's simplest).
    least_loaded  the replica with the fewest OUTSTANDING REQUESTS (routed to it, not yet finished; ties to the
                  lowest index), the count the router itself keeps, as SGLang's router keeps its running queue per
                  worker (vLLM's data-parallel load balancer also counts waiting + running requests). Requests, not
                  tokens: a router sees a request's prompt but not how long it will run.
    prefix_aware  SGLang's cache-aware router (sgl-router, "cache_aware"): an APPROXIMATE radix tree per replica of
                  the prompts routed there (the router never asks a replica what its cache holds; it remembers
                  where it sent what). Per request:
                    1. if the load is imbalanced, (max - min) > balance_abs_threshold AND max > min *
                       balance_rel_threshold, the least-loaded replica (shortest queue);
                    2. else the replica whose tree matches the longest prefix, if matched / prompt length exceeds
                       cache_threshold (its cache likely holds it);
                    3. else the replica with the smallest tree (most cache room), ties to the least loaded;
                  then the prompt is inserted into the chosen replica's tree (LRU leaves evicted past its capacity).
                  Defaults are SGLang's router_args: cache_threshold 0.3, balance_abs_threshold 64,
                  balance_rel_threshold 1.5. SGLang's trees hold characters; these hold token ids
                  (minillm.scheduling.radix).

    router = Router("prefix_aware", num_replicas=4)
    i = router.route(prompt_ids)        # -> replica index; router.load[i] += 1
    router.done(i)                      # the request finished there
    router.set_up(i, False)             # it stopped answering: no policy picks it until set_up(i, True)

Every policy chooses among the replicas that are up (the HTTP router takes one down when a forward to it fails or
its /health does not answer 200, and puts it back when /health answers again); with none up, route() raises
NoLiveReplica.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..scheduling.radix import RadixTree

ROUTING_POLICIES = ("round_robin", "least_loaded", "prefix_aware")


@dataclass(frozen=True)
class CacheAware:
    """prefix_aware's settings (SGLang router_args.py defaults). tree_tokens: each replica's tree capacity in tokens
    (None: unbounded; a replica's KV pool in tokens is a good value: what its cache can hold at most)."""
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    tree_tokens: Optional[int] = None

    def __post_init__(self):
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError(f"balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1, got "
                             f"{self.balance_abs_threshold} and {self.balance_rel_threshold}")
        if self.tree_tokens is not None and self.tree_tokens < 1:
            raise ValueError(f"tree_tokens must be None or >= 1, got {self.tree_tokens}")


def check_replicas(num_replicas) -> int:
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be an integer >= 1, got {num_replicas!r}")
    return num_replicas


def check_policy(policy) -> str:
    if policy not in ROUTING_POLICIES:
        raise ValueError(f"unknown routing policy {policy!r}; choose one of {ROUTING_POLICIES}")
    return policy


class NoLiveReplica(RuntimeError):
    """Every replica is down: nothing to route to."""


class Router:
    """Routes requests to replicas 0 .. N-1 by one of ROUTING_POLICIES, counting each replica's outstanding requests.
    decisions: (replica, why) per routed request, why in {"turn", "least loaded", "imbalanced", "cache hit",
    "smallest tree"}: the prefix-aware router's three branches, countable."""

    def __init__(self, policy: str, num_replicas: int, cache_aware: Optional[CacheAware] = None):
        self.policy, self.num_replicas = check_policy(policy), check_replicas(num_replicas)
        self.cache_aware = cache_aware or CacheAware()
        self.load = [0] * num_replicas            # outstanding requests per replica
        self.routed = [0] * num_replicas          # requests ever routed per replica
        self.trees = [RadixTree(self.cache_aware.tree_tokens) for _ in range(num_replicas)]
        self.decisions: list[tuple[int, str]] = []
        self.up = [True] * num_replicas           # replicas a policy may pick (set_up: health, failed forwards)
        self._turn = 0

    def set_up(self, replica: int, up: bool):
        """Take a replica out of rotation, or put it back. One that comes back starts with an empty tree: a
        restarted replica's prefix cache is empty."""
        if isinstance(replica, bool) or not isinstance(replica, int) or not 0 <= replica < self.num_replicas:
            raise ValueError(f"set_up({replica!r}): replicas are 0 .. {self.num_replicas - 1}")
        if up and not self.up[replica]:
            self.trees[replica] = RadixTree(self.cache_aware.tree_tokens)
        self.up[replica] = bool(up)

    def route(self, prompt_ids) -> int:
        """The replica for this prompt (token ids), among those up; counts it as outstanding there."""
        live = [r for r in range(self.num_replicas) if self.up[r]]
        if not live:
            raise NoLiveReplica(f"all {self.num_replicas} replicas are down")
        i, why = getattr(self, "_" + self.policy)(list(prompt_ids), live)
        self.load[i] += 1
        self.routed[i] += 1
        self.decisions.append((i, why))
        return i

    def done(self, replica: int):
        """A request routed to `replica` finished (or was refused there): it no longer counts as load."""
        if not 0 <= replica < self.num_replicas or self.load[replica] == 0:
            raise ValueError(f"done({replica}): no outstanding request on replica {replica} "
                             f"(loads {self.load})")
        self.load[replica] -= 1

    # ------------------------------------------------------------------ the policies: -> (replica, why)
    def _round_robin(self, ids, live) -> tuple[int, str]:
        i = min(live, key=lambda r: (r - self._turn) % self.num_replicas)   # the next one up from the turn
        self._turn = (i + 1) % self.num_replicas
        return i, "turn"

    def _least_loaded(self, ids, live) -> tuple[int, str]:
        return min(live, key=lambda r: (self.load[r], r)), "least loaded"

    def _prefix_aware(self, ids, live) -> tuple[int, str]:
        ca, loads = self.cache_aware, [self.load[r] for r in live]
        lo, hi = min(loads), max(loads)
        if hi - lo > ca.balance_abs_threshold and hi > lo * ca.balance_rel_threshold:
            i, why = self._least_loaded(ids, live)[0], "imbalanced"
        else:
            matched = {r: self.trees[r].match(ids) for r in live}      # tokens of the prompt each tree holds
            best = max(live, key=lambda r: (matched[r], -self.load[r], -r))
            if matched[best] / len(ids) > ca.cache_threshold:
                i, why = best, "cache hit"
            else:
                i = min(live, key=lambda r: (len(self.trees[r]), self.load[r], r))
                why = "smallest tree"
        self.trees[i].insert(ids)
        return i, why

    def summary(self) -> dict:
        """Requests routed per replica, and how many decisions took each branch."""
        whys = {}
        for _, why in self.decisions:
            whys[why] = whys.get(why, 0) + 1
        return {"policy": self.policy, "routed": list(self.routed), "decisions": whys,
                "state": ["up" if u else "down" for u in self.up]}
