"""minillm: a small, complete, from-scratch Llama inference engine to learn from and measure."""
from . import _checkout, _moved  # noqa: F401  (_checkout first: on PYTHONPATH=. it maps minillm.kernels, .viz)
from .config import EngineConfig, ModelConfig
from .core.outputs import CompletionOutput, RequestOutput
from .core.sampling import SamplingParams
from .engine.engine import LLMEngine
from .engine.llm import LLM
from .formats.hf_export import export_hf
from .formats.loader import available_models, load
from .llama.tokenizer import Tokenizer

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineConfig",
           "ModelConfig", "Tokenizer", "load", "available_models", "export_hf"]
__version__ = "0.1.0"

_moved.install()   # minillm.scheduler and the other pre-subpackage paths: a DeprecationWarning naming the new one
