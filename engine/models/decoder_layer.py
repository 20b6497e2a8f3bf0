"""One pre-norm decoder layer: attention, then a dense MLP or a MoE, each behind its RMSNorm and a
residual. The decoder (engine.models.decoder) stacks them, and the MTP layer (engine.models.mtp)
holds one as its block: its own module, so that both import it and neither imports the other."""

from __future__ import annotations

from engine.arch.architecture import Architecture
from engine.arch.config import ModelConfig
from engine.models.attention import PagedAttention
from engine.models.layers import MLP, MoE, RMSNorm, Rotary, Tensors


class DecoderLayer:
    def __init__(
        self,
        t: Tensors,
        c: ModelConfig,
        arch: Architecture,
        i: int,
        attention: type[PagedAttention],
        rotary: Rotary,
    ):
        p = f"model.layers.{i}"
        self.input_norm = RMSNorm(t[f"{p}.input_layernorm.weight"], c.rms_norm_eps)
        self.post_attn_norm = RMSNorm(t[f"{p}.post_attention_layernorm.weight"], c.rms_norm_eps)
        self.attn = attention(t, f"{p}.self_attn", c, i, rotary)
        self.mlp = MoE(t, f"{p}.mlp", c) if arch.is_moe_layer(i) else MLP(t, f"{p}.mlp")

    def __call__(self, x, rope, batch):
        x = x + self.attn(self.input_norm(x), rope, batch)
        return x + self.mlp(self.post_attn_norm(x), batch)
