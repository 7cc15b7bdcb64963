"""minillm.cluster: several engines serving together. Data parallelism (replicas behind a router) and prefill/decode
disaggregation (a prefill engine handing each sequence's KV blocks to a decode engine), on the simulated clock by
default (each engine its own clock, priced by minillm.bench.step_cost) and for real in separate processes.

router.py         which replica serves a request: round_robin, least_loaded, prefix_aware (SGLang's cache-aware)
replica.py        one engine on its own simulated clock
sim.py            the discrete-event loop that interleaves the replicas' steps and the events between them
data_parallel.py  replay a trace on N replicas behind a router; throughput, TTFT/TPOT, prefix hits per policy
kv_transfer.py    a sequence and its KV blocks out of one engine and into another (in process, or over a pipe)
disagg.py         DisaggregatedEngine: a prefill engine and a decode engine with LLMEngine's request API
disagg_sim.py     the pair replayed on the simulated clock, the handover over a modelled link; per-request timelines
processes.py      the same for real: replicas, or the prefill and decode engines, as processes on the wall clock
"""
from .data_parallel import replay_routed, routed_metrics
from .disagg import DisaggregatedEngine
from .disagg_sim import Link, replay_disagg, timelines
from .kv_transfer import KVHandover, export_sequence, import_sequence
from .router import ROUTING_POLICIES, CacheAware, Router

__all__ = ["ROUTING_POLICIES", "CacheAware", "DisaggregatedEngine", "KVHandover", "Link", "Router", "export_sequence",
           "import_sequence", "replay_disagg", "replay_routed", "routed_metrics", "timelines"]
