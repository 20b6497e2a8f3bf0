"""Model architectures the engine serves: one decoder (engine.models.decoder) with the attention
the config's architecture names (MLA: engine.models.deepseek_v3, GQA: engine.models.glm4_moe)."""

from __future__ import annotations

from engine.architecture import describe
from engine.config import ModelConfig
from engine.models import decoder
from engine.models.attention import PagedAttention
from engine.models.layers import Tensors


def attention_for(config: ModelConfig) -> type[PagedAttention]:
    """The attention implementing the architecture `config` describes."""
    if describe(config).attention == "gqa":
        from engine.models.glm4_moe import GQAttention

        return GQAttention
    from engine.models.deepseek_v3 import MLAttention

    return MLAttention


def expected_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the checkpoint must hold, with its shape."""
    return decoder.expected_tensors(config, attention_for(config))


def float32_tensors(config: ModelConfig) -> set[str]:
    return decoder.float32_tensors(config)


def causal_lm(config: ModelConfig, tensors: Tensors) -> decoder.DecoderLM:
    """The model, built from its checkpoint tensors."""
    return decoder.DecoderLM(config, tensors, attention_for(config))
