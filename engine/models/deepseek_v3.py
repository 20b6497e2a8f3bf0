"""DeepSeek-V3 / Kimi K2 architecture: MLA attention, dense then sigmoid-routed MoE layers.

Checkpoint names follow the hub layout that transformers' `save_pretrained` writes.
Attention runs in the absorbed form (queries projected into the latent space, W_UK and W_UV
folded in), so the cache holds only the latent and the shared roped key.
"""

from __future__ import annotations

import torch

from engine.batch import SeqSlice
from engine.config import ModelConfig
from engine.models.layers import (
    MLP,
    MoE,
    RMSNorm,
    Rotary,
    Tensors,
    dense,
    linear,
    mlp_tensors,
    moe_tensors,
    softmax_scale,
)


def expected_tensors(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the checkpoint must hold, with its shape."""
    h, heads = c.hidden_size, c.num_attention_heads
    specs: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        specs[f"{p}.input_layernorm.weight"] = (h,)
        specs[f"{p}.post_attention_layernorm.weight"] = (h,)
        if c.q_lora_rank is None:
            specs[f"{a}.q_proj.weight"] = (heads * c.qk_head_dim, h)
        else:
            specs[f"{a}.q_a_proj.weight"] = (c.q_lora_rank, h)
            if c.attention_bias:
                specs[f"{a}.q_a_proj.bias"] = (c.q_lora_rank,)
            specs[f"{a}.q_a_layernorm.weight"] = (c.q_lora_rank,)
            specs[f"{a}.q_b_proj.weight"] = (heads * c.qk_head_dim, c.q_lora_rank)
        specs[f"{a}.kv_a_proj_with_mqa.weight"] = (c.kv_lora_rank + c.qk_rope_head_dim, h)
        if c.attention_bias:
            specs[f"{a}.kv_a_proj_with_mqa.bias"] = (c.kv_lora_rank + c.qk_rope_head_dim,)
            specs[f"{a}.o_proj.bias"] = (h,)
        specs[f"{a}.kv_a_layernorm.weight"] = (c.kv_lora_rank,)
        specs[f"{a}.kv_b_proj.weight"] = (heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)
        specs[f"{a}.o_proj.weight"] = (h, heads * c.v_head_dim)
        if c.is_moe_layer(i):
            specs.update(moe_tensors(f"{p}.mlp", c))
        else:
            specs.update(mlp_tensors(f"{p}.mlp", h, c.intermediate_size))
    specs["model.norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        specs["lm_head.weight"] = (c.vocab_size, h)
    return specs


def float32_tensors(c: ModelConfig) -> set[str]:
    """Tensors kept in float32 whatever the model dtype (the router, as in the reference)."""
    return {
        name
        for i in range(c.first_k_dense_replace, c.num_hidden_layers)
        for name in (
            f"model.layers.{i}.mlp.gate.weight",
            f"model.layers.{i}.mlp.gate.e_score_correction_bias",
        )
    }


class MLAttention:
    def __init__(self, t: Tensors, prefix: str, c: ModelConfig, layer: int, rotary: Rotary):
        self.layer = layer
        self.heads = c.num_attention_heads
        self.nope, self.rope_dim, self.v_dim = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        self.rank = c.kv_lora_rank
        self.rotary = rotary
        if c.q_lora_rank is None:
            self.q_proj = linear(t, f"{prefix}.q_proj")
            self.q_a_proj = self.q_a_norm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = linear(t, f"{prefix}.q_a_proj", bias=c.attention_bias)
            self.q_a_norm = RMSNorm(t[f"{prefix}.q_a_layernorm.weight"], 1e-6)
            self.q_b_proj = linear(t, f"{prefix}.q_b_proj")
        self.kv_a_proj = linear(t, f"{prefix}.kv_a_proj_with_mqa", bias=c.attention_bias)
        self.kv_a_norm = RMSNorm(t[f"{prefix}.kv_a_layernorm.weight"], 1e-6)
        kv_b = dense(t[f"{prefix}.kv_b_proj.weight"], t[f"{prefix}.kv_a_layernorm.weight"].dtype).view(
            self.heads, self.nope + self.v_dim, self.rank
        )
        self.w_uk = kv_b[:, : self.nope, :]  # [heads, nope, rank]: absorbed into the queries
        self.w_uv = kv_b[:, self.nope :, :]  # [heads, v, rank]: applied after attention
        self.o_proj = linear(t, f"{prefix}.o_proj", bias=c.attention_bias)
        self.scale = softmax_scale(c.qk_head_dim, c.rope)

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: list[SeqSlice]
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x) if self.q_proj is not None else self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
        q = q.view(n, self.heads, self.nope + self.rope_dim)
        q_nope, q_rot = q.split([self.nope, self.rope_dim], dim=-1)
        q_rot = self.rotary.apply(q_rot, cos, sin)
        latent, k_rot = self.kv_a_proj(x).split([self.rank, self.rope_dim], dim=-1)
        latent = self.kv_a_norm(latent)
        k_rot = self.rotary.apply(k_rot[:, None, :], cos, sin)[:, 0]
        q_lat = torch.einsum("nhd,hdr->nhr", q_nope, self.w_uk)

        out = torch.empty(n, self.heads, self.rank, dtype=x.dtype, device=x.device)
        for s in batch:
            rows = slice(s.start, s.stop)
            lat_all, rot_all = s.cache.write(self.layer, s.past, latent[rows], k_rot[rows])
            scores = torch.einsum("lhr,tr->hlt", q_lat[rows], lat_all)
            scores = (scores + torch.einsum("lhd,td->hlt", q_rot[rows], rot_all)) * self.scale
            if s.length > 1:
                q_pos = torch.arange(s.past, s.past + s.length, device=x.device)[:, None]
                visible = torch.arange(s.past + s.length, device=x.device)[None, :] <= q_pos
                scores = scores.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)
            out[rows] = torch.einsum("hlt,tr->lhr", probs, lat_all)
        attn = torch.einsum("nhr,hvr->nhv", out, self.w_uv).reshape(n, self.heads * self.v_dim)
        return self.o_proj(attn)


class DecoderLayer:
    def __init__(self, t: Tensors, c: ModelConfig, i: int, rotary: Rotary):
        p = f"model.layers.{i}"
        self.input_norm = RMSNorm(t[f"{p}.input_layernorm.weight"], c.rms_norm_eps)
        self.post_attn_norm = RMSNorm(t[f"{p}.post_attention_layernorm.weight"], c.rms_norm_eps)
        self.attn = MLAttention(t, f"{p}.self_attn", c, i, rotary)
        self.mlp = MoE(t, f"{p}.mlp", c) if c.is_moe_layer(i) else MLP(t, f"{p}.mlp")

    def __call__(self, x, cos, sin, batch):
        x = x + self.attn(self.input_norm(x), cos, sin, batch)
        return x + self.mlp(self.post_attn_norm(x))


class CausalLM:
    """The full model: forward over a flat token batch, then logits for the rows asked for."""

    def __init__(self, c: ModelConfig, t: Tensors):
        self.config = c
        self.embed = t["model.embed_tokens.weight"]
        device = self.embed.device
        self.rotary = Rotary(c.qk_rope_head_dim, c.rope, c.rope_interleave, device)
        self.layers = [DecoderLayer(t, c, i, self.rotary) for i in range(c.num_hidden_layers)]
        self.norm = RMSNorm(t["model.norm.weight"], c.rms_norm_eps)
        self.lm_head = self.embed if c.tie_word_embeddings else t["lm_head.weight"]
        self.dtype = self.embed.dtype
        self.device = device

    def cache_widths(self) -> tuple[int, ...]:
        return (self.config.kv_lora_rank, self.config.qk_rope_head_dim)

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoE)]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, batch: list[SeqSlice]) -> torch.Tensor:
        x = self.embed[ids]
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, batch)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden, self.lm_head).to(torch.float32)
