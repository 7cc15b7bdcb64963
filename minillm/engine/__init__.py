"""The assembled engine: parts prepared in one place (load, quantize, backend, KV pool, proposer: parts.py),
LLMEngine (add_request / step / abort over the core's mechanisms: engine.py), the LLM API (llm.py), and `run`
(llama2.c's run.c, byte for byte: runc.py)."""
from .engine import LLMEngine

__all__ = ["LLMEngine"]
