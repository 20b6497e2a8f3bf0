"""The inference engine: MoE models (MLA), KV cache, sampling, tokenizer. Knows nothing of PoPs."""

from engine.engine import EngineStats, LLMEngine, StepStats
from engine.errors import EngineError, InvalidRequestError, ModelLoadError, RequestTooLargeError
from engine.llm import LLM, Generation
from engine.sampling import SamplingParams
from engine.sequence import RequestMetrics, SeqEvent

__all__ = [
    "LLM",
    "EngineError",
    "EngineStats",
    "Generation",
    "InvalidRequestError",
    "ModelLoadError",
    "LLMEngine",
    "RequestMetrics",
    "RequestTooLargeError",
    "SamplingParams",
    "SeqEvent",
    "StepStats",
]
