"""GLM-4.5 / 4.5-Air / 4.6 architecture: GQA attention (bias, optional QK-norm, partial rotary),
dense then sigmoid-routed MoE layers (the DeepSeek-V3 router family).

The cache holds K and V per KV head; queries of a group share them.
"""

from __future__ import annotations

import torch

from engine.batch import SeqSlice
from engine.config import ModelConfig
from engine.models.layers import MLP, MoE, RMSNorm, Rotary, Tensors, linear, mlp_tensors, moe_tensors


def expected_tensors(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, d = c.hidden_size, c.attn_head_dim
    q_out, kv_out = c.num_attention_heads * d, c.kv_heads * d
    specs: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        specs[f"{p}.input_layernorm.weight"] = (h,)
        specs[f"{p}.post_attention_layernorm.weight"] = (h,)
        for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            specs[f"{a}.{proj}.weight"] = (out, h)
            if c.attention_bias:
                specs[f"{a}.{proj}.bias"] = (out,)
        specs[f"{a}.o_proj.weight"] = (h, q_out)
        if c.use_qk_norm:
            specs[f"{a}.q_norm.weight"] = (d,)
            specs[f"{a}.k_norm.weight"] = (d,)
        if c.is_moe_layer(i):
            specs.update(moe_tensors(f"{p}.mlp", c))
        else:
            specs.update(mlp_tensors(f"{p}.mlp", h, c.intermediate_size))
    specs["model.norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        specs["lm_head.weight"] = (c.vocab_size, h)
    return specs


def float32_tensors(c: ModelConfig) -> set[str]:
    return {
        f"model.layers.{i}.mlp.gate.{name}"
        for i in range(c.first_k_dense_replace, c.num_hidden_layers)
        for name in ("weight", "e_score_correction_bias")
    }


class GQAttention:
    def __init__(self, t: Tensors, prefix: str, c: ModelConfig, layer: int, rotary: Rotary):
        self.layer = layer
        self.heads, self.kv_heads, self.dim = c.num_attention_heads, c.kv_heads, c.attn_head_dim
        self.group = self.heads // self.kv_heads
        self.q_proj = linear(t, f"{prefix}.q_proj", bias=c.attention_bias)
        self.k_proj = linear(t, f"{prefix}.k_proj", bias=c.attention_bias)
        self.v_proj = linear(t, f"{prefix}.v_proj", bias=c.attention_bias)
        self.o_proj = linear(t, f"{prefix}.o_proj")
        self.q_norm = RMSNorm(t[f"{prefix}.q_norm.weight"], c.rms_norm_eps) if c.use_qk_norm else None
        self.k_norm = RMSNorm(t[f"{prefix}.k_norm.weight"], c.rms_norm_eps) if c.use_qk_norm else None
        self.rotary = rotary
        self.scale = self.dim**-0.5

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.rotary.dim
        if r == self.dim:
            return self.rotary.apply(x, cos, sin)
        return torch.cat([self.rotary.apply(x[..., :r], cos, sin), x[..., r:]], dim=-1)

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: list[SeqSlice]
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.heads, self.dim)
        k = self.k_proj(x).view(n, self.kv_heads, self.dim)
        v = self.v_proj(x).view(n, self.kv_heads, self.dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)

        out = torch.empty(n, self.heads, self.dim, dtype=x.dtype, device=x.device)
        for s in batch:
            rows = slice(s.start, s.stop)
            k_all, v_all = s.cache.write(self.layer, s.past, k[rows].flatten(1), v[rows].flatten(1))
            k_all = k_all.view(-1, self.kv_heads, self.dim)
            v_all = v_all.view(-1, self.kv_heads, self.dim)
            # [kv_heads, group, l, d] x [kv_heads, t, d]: each group of query heads reads its KV head.
            q_g = q[rows].view(s.length, self.kv_heads, self.group, self.dim).permute(1, 2, 0, 3)
            scores = torch.einsum("kgld,tkd->kglt", q_g, k_all) * self.scale
            if s.length > 1:
                q_pos = torch.arange(s.past, s.past + s.length, device=x.device)[:, None]
                visible = torch.arange(s.past + s.length, device=x.device)[None, :] <= q_pos
                scores = scores.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)
            out[rows] = torch.einsum("kglt,tkd->lkgd", probs, v_all).reshape(s.length, self.heads, self.dim)
        return self.o_proj(out.reshape(n, self.heads * self.dim))


class DecoderLayer:
    def __init__(self, t: Tensors, c: ModelConfig, i: int, rotary: Rotary):
        p = f"model.layers.{i}"
        self.input_norm = RMSNorm(t[f"{p}.input_layernorm.weight"], c.rms_norm_eps)
        self.post_attn_norm = RMSNorm(t[f"{p}.post_attention_layernorm.weight"], c.rms_norm_eps)
        self.attn = GQAttention(t, f"{p}.self_attn", c, i, rotary)
        self.mlp = MoE(t, f"{p}.mlp", c) if c.is_moe_layer(i) else MLP(t, f"{p}.mlp")

    def __call__(self, x, cos, sin, batch):
        x = x + self.attn(self.input_norm(x), cos, sin, batch)
        return x + self.mlp(self.post_attn_norm(x))


class CausalLM:
    def __init__(self, c: ModelConfig, t: Tensors):
        self.config = c
        self.embed = t["model.embed_tokens.weight"]
        self.device = self.embed.device
        self.dtype = self.embed.dtype
        self.rotary = Rotary(c.rotary_dim, c.rope, interleaved=False, device=self.device)
        self.layers = [DecoderLayer(t, c, i, self.rotary) for i in range(c.num_hidden_layers)]
        self.norm = RMSNorm(t["model.norm.weight"], c.rms_norm_eps)
        self.lm_head = self.embed if c.tie_word_embeddings else t["lm_head.weight"]

    def cache_widths(self) -> tuple[int, ...]:
        width = self.config.kv_heads * self.config.attn_head_dim
        return (width, width)

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
