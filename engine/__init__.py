"""The inference engine: MoE models (MLA), KV cache, sampling, tokenizer. Knows nothing of PoPs."""

from engine.errors import EngineError, InvalidRequestError, ModelLoadError
from engine.llm import LLM, Generation, StreamTiming, TokenEvent
from engine.sampling import SamplingParams

__all__ = [
    "LLM",
    "EngineError",
    "Generation",
    "InvalidRequestError",
    "ModelLoadError",
    "SamplingParams",
    "StreamTiming",
    "TokenEvent",
]
