"""The decoder both architectures share: pre-norm layers of attention then a dense MLP or MoE,
a final norm and the LM head. An architecture supplies its attention and what that caches."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.batch import StepBatch
from engine.config import ModelConfig
from engine.kv_cache import KVComponent
from engine.models.layers import MLP, MoE, RMSNorm, Rotary, Tensors

# (tensors, prefix, config, layer index, rotary) -> a callable (x, rope, batch) -> x
AttentionFactory = Callable[[Tensors, str, ModelConfig, int, Rotary], Callable]


class DecoderLayer:
    def __init__(self, t: Tensors, c: ModelConfig, i: int, attention: AttentionFactory, rotary: Rotary):
        p = f"model.layers.{i}"
        self.input_norm = RMSNorm(t[f"{p}.input_layernorm.weight"], c.rms_norm_eps)
        self.post_attn_norm = RMSNorm(t[f"{p}.post_attention_layernorm.weight"], c.rms_norm_eps)
        self.attn = attention(t, f"{p}.self_attn", c, i, rotary)
        self.mlp = MoE(t, f"{p}.mlp", c) if c.is_moe_layer(i) else MLP(t, f"{p}.mlp")

    def __call__(self, x, rope, batch):
        x = x + self.attn(self.input_norm(x), rope, batch)
        return x + self.mlp(self.post_attn_norm(x))


class DecoderLM:
    """The full model: forward over a flat token batch, then logits for the rows asked for."""

    def __init__(
        self,
        c: ModelConfig,
        t: Tensors,
        attention: AttentionFactory,
        rotary_dim: int,
        interleaved: bool,
    ):
        self.config = c
        self.embed = t["model.embed_tokens.weight"]
        self.device = self.embed.device
        self.dtype = self.embed.dtype
        self.rotary = Rotary(rotary_dim, c.rope, interleaved, self.device)
        self.layers = [DecoderLayer(t, c, i, attention, self.rotary) for i in range(c.num_hidden_layers)]
        self.norm = RMSNorm(t["model.norm.weight"], c.rms_norm_eps)
        # [hidden, vocab], contiguous: the largest matmul of a decode step, on its fast layout
        self.lm_head_t = (self.embed if c.tie_word_embeddings else t["lm_head.weight"]).t().contiguous()

    def kv_components(self) -> list[KVComponent]:
        raise NotImplementedError

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoE)]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        x = self.embed[ids]
        rope = self.rotary.tables(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, batch)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.matmul(hidden, self.lm_head_t).to(torch.float32)
