"""Model architectures the engine serves: one decoder (engine.models.decoder) with the attention
the config's architecture names (MLA: engine.models.deepseek_v3, GQA: engine.models.glm4_moe)."""

from __future__ import annotations

import torch

from engine.arch.architecture import describe
from engine.arch.config import ModelConfig
from engine.models import decoder, mtp
from engine.models.attention import PagedAttention
from engine.models.layers import Tensors


def attention_for(config: ModelConfig) -> type[PagedAttention]:
    """The attention implementing the architecture `config` describes."""
    if describe(config).attention == "gqa":
        from engine.models.glm4_moe import GQAttention

        return GQAttention
    from engine.models.deepseek_v3 import MLAttention

    return MLAttention


def expected_tensors(config: ModelConfig, with_mtp: bool = False) -> dict[str, tuple[int, ...]]:
    """Every tensor the checkpoint must hold, with its shape (`with_mtp`: its MTP layer's too)."""
    specs = decoder.expected_tensors(config, attention_for(config))
    if with_mtp:
        specs.update(mtp.mtp_tensors(config, attention_for(config)))
    return specs


def float32_tensors(config: ModelConfig, with_mtp: bool = False) -> set[str]:
    names = decoder.float32_tensors(config)
    return names | mtp.mtp_float32_tensors(config) if with_mtp else names


def causal_lm(
    config: ModelConfig, tensors: Tensors, with_mtp: bool = False, dtype: torch.dtype | None = None
) -> decoder.DecoderLM:
    """The model, built from its checkpoint tensors; `with_mtp`: with its MTP layer as `model.mtp`;
    `dtype`: its activations' (default the embedding's)."""
    return decoder.DecoderLM(config, tensors, attention_for(config), with_mtp, dtype)
