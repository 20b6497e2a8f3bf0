"""One description per model architecture (MLA or GQA), shared by the engine, the roofline and
the planner, and what such an architecture caches per token.

Torch-free, so the planner and the roofline can describe a full-size model without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

if TYPE_CHECKING:
    from engine.arch.config import ModelConfig


@dataclass(frozen=True)
class KVComponent:
    """One thing a token caches per layer: `heads` x `dim` values, key-like or value-like."""

    name: str
    heads: int
    dim: int
    style: Literal["key", "value"]

    @property
    def width(self) -> int:
        return self.heads * self.dim


class Architecture(msgspec.Struct, frozen=True, kw_only=True):
    """One model's shape, as the engine's model construction, the roofline and the planner all
    read it: built from config.json by `describe`, never declared a second time.

    MLA (DeepSeek-V3, Kimi K2) fills the q/kv LoRA and head-dim fields and caches one latent
    "head"; GQA (GLM-4.5) fills `num_kv_heads`/`head_dim` and caches K and V per KV head. The
    first `first_dense_layers` layers run a dense MLP, the rest routed experts.
    """

    name: str
    attention: Literal["mla", "gqa"]
    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    dense_intermediate: int
    moe_intermediate: int
    n_routed_experts: int
    experts_per_token: int
    n_shared_experts: int
    first_dense_layers: int
    max_context: int
    # MLA
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # GQA
    num_kv_heads: int = 0
    head_dim: int = 0
    use_qk_norm: bool = False
    attention_bias: bool = False
    tie_embeddings: bool = False

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_dense_layers

    @property
    def kv_heads(self) -> int:
        """How many ways the KV cache splits by head (MLA's latent is one shared head)."""
        return 1 if self.attention == "mla" else self.num_kv_heads

    @property
    def kv_components(self) -> list[KVComponent]:
        """What one token caches per layer: MLA the normalised latent (read like values) and the
        shared roped key; GQA K and V per KV head."""
        if self.attention == "mla":
            return [
                KVComponent("latent", 1, self.kv_lora_rank, "value"),
                KVComponent("rope", 1, self.qk_rope_head_dim, "key"),
            ]
        return [
            KVComponent("k", self.num_kv_heads, self.head_dim, "key"),
            KVComponent("v", self.num_kv_heads, self.head_dim, "value"),
        ]


def describe(c: ModelConfig, name: str | None = None) -> Architecture:
    """The architecture a parsed config.json describes (named `name`, default its model_type)."""
    layers = c.num_hidden_layers
    common = dict(
        name=name or c.model_type,
        hidden_size=c.hidden_size,
        num_layers=layers,
        num_heads=c.num_attention_heads,
        vocab_size=c.vocab_size,
        dense_intermediate=c.intermediate_size,
        moe_intermediate=c.moe_intermediate_size,
        n_routed_experts=c.n_routed_experts,
        experts_per_token=c.num_experts_per_tok,
        n_shared_experts=c.n_shared_experts,
        first_dense_layers=min(c.first_k_dense_replace, layers),
        max_context=c.max_position_embeddings,
        attention_bias=c.attention_bias,
        tie_embeddings=c.tie_word_embeddings,
    )
    if c.model_type == "glm4_moe":
        return Architecture(
            attention="gqa",
            num_kv_heads=c.kv_heads,
            head_dim=c.attn_head_dim,
            use_qk_norm=c.use_qk_norm,
            **common,
        )
    return Architecture(
        attention="mla",
        q_lora_rank=c.q_lora_rank,
        kv_lora_rank=c.kv_lora_rank,
        qk_nope_head_dim=c.qk_nope_head_dim,
        qk_rope_head_dim=c.qk_rope_head_dim,
        v_head_dim=c.v_head_dim,
        **common,
    )


def load_architecture(model_dir: str | Path) -> Architecture:
    """The architecture of DIR/config.json, named after the directory (ModelLoadError if bad)."""
    from engine.arch.config import load_config

    config, _ = load_config(model_dir)
    return describe(config, Path(model_dir).name)
