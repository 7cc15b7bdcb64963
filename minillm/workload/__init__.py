"""Serving workloads (who arrives when, wanting how many tokens), the clocks that replay them against an engine
without sleeping, and the metrics of a replay. Plain data and numpy: the bench, the cluster and the labs build on it
(through this lower layer, never sideways from one tool folder into another)."""
from .arrivals import (
                       Request,
                       SimClock,
                       SkipClock,
                       at_rate,
                       heavy_tailed,
                       lognormal_lengths,
                       make_workload,
                       merge,
                       multi_turn_chat,
                       pareto_lengths,
)
from .metrics import by_request, pct, sched_metrics

__all__ = ["Request", "SimClock", "SkipClock", "at_rate", "by_request", "heavy_tailed", "lognormal_lengths",
           "make_workload", "merge", "multi_turn_chat", "pareto_lengths", "pct", "sched_metrics"]
