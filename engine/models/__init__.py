"""Model architectures the engine serves, by config.json `model_type`."""

from __future__ import annotations

from engine.config import ModelConfig
from engine.errors import ModelLoadError


def architecture(config: ModelConfig):
    """The module implementing `config.model_type` (expected_tensors + CausalLM)."""
    if config.model_type in ("deepseek_v3", "kimi_k2"):
        from engine.models import deepseek_v3

        return deepseek_v3
    if config.model_type == "glm4_moe":
        from engine.models import glm4_moe

        return glm4_moe
    raise ModelLoadError(f"model_type {config.model_type!r} has no implementation")
