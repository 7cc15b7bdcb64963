"""Scheduling orders beyond FCFS (sjf, priority, mlfq, fair, lpm) and the radix tree lpm ranks by: plug-ins of the
core's Order interface (minillm.core.order), imported by the engine's parts, never by the core."""
from __future__ import annotations

from ..config import EngineConfig
from ..core.order import FCFS, Order
from ..core.policies import SchedulingPolicy, batching_policy
from .orders import MLFQ, ORDERS, LongestPrefix, Priority, ShortestJobFirst, VirtualTokenCounter, make_order
from .radix import RadixTree


def make_policy(config: EngineConfig, cache_tokens: int | None = None) -> SchedulingPolicy:
    """The batching policy of config, with the order config.scheduling_policy names. cache_tokens: the KV pool's
    size in tokens, which bounds lpm's radix tree as the pool bounds the prefix cache."""
    kwargs = {"capacity": cache_tokens} if config.scheduling_policy == "lpm" else {}
    return batching_policy(config, make_order(config.scheduling_policy, **kwargs))


__all__ = ["FCFS", "MLFQ", "ORDERS", "LongestPrefix", "Order", "Priority", "RadixTree", "ShortestJobFirst",
           "VirtualTokenCounter", "make_order", "make_policy"]
