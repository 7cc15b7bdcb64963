"""KV eviction for long contexts (EngineConfig.kv_eviction): StreamingLLM's sinks + window and H2O's heavy
hitters, each an object with the hooks of minillm.core.hooks.NoEviction."""
from .policies import (
                       CHUNK,
                       KV_EVICTION_METHODS,
                       EvictionPolicy,
                       H2OPolicy,
                       StreamingPolicy,
                       check_kv_eviction,
                       make_eviction,
                       sink_blocks,
)

__all__ = ["CHUNK", "KV_EVICTION_METHODS", "EvictionPolicy", "H2OPolicy", "StreamingPolicy", "check_kv_eviction",
           "make_eviction", "sink_blocks"]
