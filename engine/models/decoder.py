"""The decoder both architectures share: pre-norm layers of attention then a dense MLP or MoE,
a final norm and the LM head, and the checkpoint tensors that make it up. An architecture
supplies only its attention (an engine.models.attention.PagedAttention): what it projects,
caches and scores, and its own checkpoint tensors."""

from __future__ import annotations

import torch

from engine.arch.architecture import KVComponent, describe
from engine.arch.config import ModelConfig
from engine.kv.batch import StepBatch
from engine.models import eager_ops
from engine.models.attention import PagedAttention
from engine.models.decoder_layer import DecoderLayer
from engine.models.layers import LMHead, MoE, RMSNorm, Rotary, Tensors, mlp_tensors, moe_tensors
from engine.models.mtp import MTPLayer


def expected_tensors(c: ModelConfig, attention: type[PagedAttention]) -> dict[str, tuple[int, ...]]:
    """Every tensor the checkpoint must hold, with its shape."""
    arch, h = describe(c), c.hidden_size
    specs: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h)}
    for i in range(arch.num_layers):
        p = f"model.layers.{i}"
        specs[f"{p}.input_layernorm.weight"] = (h,)
        specs[f"{p}.post_attention_layernorm.weight"] = (h,)
        specs.update(attention.tensors(c, f"{p}.self_attn"))
        if arch.is_moe_layer(i):
            specs.update(moe_tensors(f"{p}.mlp", c))
        else:
            specs.update(mlp_tensors(f"{p}.mlp", h, c.intermediate_size))
    specs["model.norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        specs["lm_head.weight"] = (c.vocab_size, h)
    return specs


def float32_tensors(c: ModelConfig) -> set[str]:
    """Tensors kept in float32 whatever the model dtype (the router, as in the reference)."""
    arch = describe(c)
    return {
        f"model.layers.{i}.mlp.gate.{name}"
        for i in range(arch.num_layers)
        if arch.is_moe_layer(i)
        for name in ("weight", "e_score_correction_bias")
    }


class DecoderLM:
    """The full model: forward over a flat token batch, then logits for the rows asked for."""

    def __init__(
        self,
        c: ModelConfig,
        t: Tensors,
        attention: type[PagedAttention],
        with_mtp: bool = False,
        dtype: torch.dtype | None = None,
    ):
        """`dtype`: the activations' (default the embedding's); a bf16 embedding kept bf16 on a CPU
        (kernels.dispatch.keeps_bf16) under float32 activations has its gathered rows widened."""
        self.config = c
        self.arch = describe(c)
        self.embed = t["model.embed_tokens.weight"]
        self.device = self.embed.device
        self.dtype = dtype or self.embed.dtype
        rotary_dim, interleaved = attention.rotary_spec(c)
        self.rotary = Rotary(rotary_dim, c.rope, interleaved, self.device)
        self.layers = [
            DecoderLayer(t, c, self.arch, i, attention, self.rotary) for i in range(self.arch.num_layers)
        ]
        self.norm = RMSNorm(t["model.norm.weight"], c.rms_norm_eps)
        # the largest product of a decode step: bf16 rows through the C kernel, or f32 on MKL's fast layout
        self.lm_head = LMHead(self.embed if c.tie_word_embeddings else t["lm_head.weight"])
        # the checkpoint's multi-token-prediction layer, the draft of MTP speculation
        self.mtp = MTPLayer(c, t, attention, self.rotary, self.embed, self.lm_head) if with_mtp else None
        # what a compiled step runs as opaque eager ops, numbered alike on every load of the model
        # (the MTP layer's after the decoder's, so the decoder's graphs are the same with or without)
        self.eager_parts = eager_ops.number_parts([self.layers, self.mtp])

    @property
    def cached_layers(self) -> int:
        """Layers the paged cache holds: the decoder's, and the MTP layer's when it is loaded."""
        return self.arch.num_layers + (self.mtp is not None)

    def kv_components(self) -> list[KVComponent]:
        """What each layer caches per token (the architecture's description says)."""
        return self.arch.kv_components

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoE)]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        x = self.embed[ids]
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        rope = self.rotary.tables(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, batch)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
