"""The inference engine: MoE models (MLA), KV cache, sampling, tokenizer. Knows nothing of PoPs."""

from engine.engine import LLMEngine, StepStats
from engine.errors import EngineError, InvalidRequestError, ModelLoadError
from engine.llm import LLM, Generation
from engine.sampling import SamplingParams
from engine.sequence import RequestMetrics, SeqEvent

__all__ = [
    "LLM",
    "EngineError",
    "Generation",
    "InvalidRequestError",
    "ModelLoadError",
    "LLMEngine",
    "RequestMetrics",
    "SamplingParams",
    "SeqEvent",
    "StepStats",
]
