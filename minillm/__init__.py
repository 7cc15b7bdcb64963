"""minillm: a small, complete, from-scratch Llama inference engine to learn from and measure."""
from .config import EngineConfig, ModelConfig
from .engine import LLMEngine
from .llm import LLM
from .loader import available_models, load
from .outputs import CompletionOutput, RequestOutput
from .sampling import SamplingParams
from .tokenizer import Tokenizer

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineConfig",
           "ModelConfig", "Tokenizer", "load", "available_models"]
__version__ = "0.1.0"
