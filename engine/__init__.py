"""The inference engine: MoE models (MLA), KV cache, sampling, tokenizer. Knows nothing of PoPs.

The names below load on first use, so that engine.arch.config and engine.arch.architecture (torch-free)
can be read by the planner and the roofline without bringing torch in.
"""

from __future__ import annotations

import importlib

from engine import native as _native

_native.install()  # the compiled hot paths, when their build is current (engine.native)

_EXPORTS = {
    "LLM": "engine.llm",
    "Generation": "engine.llm",
    "EngineStats": "engine.engine",
    "LLMEngine": "engine.engine",
    "StepStats": "engine.engine",
    "EngineError": "engine.errors",
    "InvalidRequestError": "engine.errors",
    "ModelLoadError": "engine.errors",
    "RequestTooLargeError": "engine.errors",
    "SamplingParams": "engine.sampling",
    "RequestMetrics": "engine.outputs",
    "SeqEvent": "engine.outputs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
