"""Serving metrics of a replayed workload: job completion time (arrival to last token), TTFT, TPOT, goodput under
an SLO (DistServe, Zhong et al. 2024: requests per second that meet BOTH the TTFT and the TPOT target), from the
RequestOutputs' metrics. Plain data in, plain numbers out: bench, the cluster's router and the notebooks share it."""
from __future__ import annotations

import numpy as np


def pct(xs, q) -> float:
    """The q-th percentile of xs (0 for none)."""
    return float(np.percentile(xs, q)) if len(xs) else 0.0


def by_request(outs, workload) -> list:
    """(workload request, its RequestOutput) pairs: replay numbers requests in arrival order ("0", "1", ...)."""
    ordered = sorted(workload, key=lambda r: r.arrival)
    return [(ordered[int(o.request_id)], o) for o in outs]


def sched_metrics(outs, workload, slo_ttft: float, slo_tpot: float) -> dict:
    """JCT, TTFT, TPOT (mean, p50, p99), goodput under the SLO, per-priority mean JCT, and the span."""
    m = [o.metrics for o in outs]
    jct = [x.finished_time - x.arrival_time for x in m]
    ttft = [x.time_to_first_token for x in m]
    tpot = [x.time_per_output_token or 0.0 for x in m]        # one token: no gap, meets any TPOT target
    span = max(x.finished_time for x in m) - min(r.arrival for r in workload)
    good = sum(1 for a, b in zip(ttft, tpot) if a <= slo_ttft and b <= slo_tpot)
    classes = {}
    for r, o in by_request(outs, workload):
        classes.setdefault(r.priority, []).append(o.metrics.finished_time - o.metrics.arrival_time)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"requests": len(outs), "jct_mean": float(np.mean(jct)), "jct_p50": pct(jct, 50), "jct_p99": pct(jct, 99),
            "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "tpot_p50": pct(tpot, 50),
            "tpot_p99": pct(tpot, 99), "goodput": good / span, "slo_attained": good / len(outs),
            "throughput": tokens / span, "seconds": span, "preemptions": sum(x.num_preemptions for x in m),
            "jct_mean_by_priority": {str(k): float(np.mean(v)) for k, v in sorted(classes.items())}}
