"""GLM-4.5 / 4.5-Air / 4.6 architecture: GQA attention (bias, optional QK-norm, partial rotary),
dense then sigmoid-routed MoE layers (the DeepSeek-V3 router family).

The cache holds K and V per KV head; queries of a group share them.
"""

from __future__ import annotations

import torch

from engine.batch import StepBatch
from engine.config import ModelConfig
from engine.kv_cache import KVComponent
from engine.models.decoder import DecoderLM
from engine.models.layers import (
    Linear,
    RMSNorm,
    RopeTables,
    Rotary,
    Tensors,
    linear,
    mlp_tensors,
    moe_tensors,
)
from kernels import paged_kv


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
        projs = [linear(t, f"{prefix}.{p}_proj", bias=c.attention_bias) for p in "qkv"]
        # one matmul for q, k and v when they are dense (compressed weights keep their own)
        self.fused = all(isinstance(p.weight, torch.Tensor) for p in projs)
        if self.fused:
            bias = torch.cat([p.bias for p in projs]) if c.attention_bias else None
            self.w_qkv = Linear(torch.cat([p.weight for p in projs]), bias)
        else:
            self.q_proj, self.k_proj, self.v_proj = projs
        self.o_proj = linear(t, f"{prefix}.o_proj")
        self.q_norm = RMSNorm(t[f"{prefix}.q_norm.weight"], c.rms_norm_eps) if c.use_qk_norm else None
        self.k_norm = RMSNorm(t[f"{prefix}.k_norm.weight"], c.rms_norm_eps) if c.use_qk_norm else None
        self.rotary = rotary
        self.scale = self.dim**-0.5

    def _rope(self, x: torch.Tensor, rope: RopeTables) -> torch.Tensor:
        r = self.rotary.dim
        if r == self.dim:
            return self.rotary.apply(x, rope)
        return torch.cat([self.rotary.apply(x[..., :r].contiguous(), rope), x[..., r:]], dim=-1)

    def __call__(self, x: torch.Tensor, rope: RopeTables, batch: StepBatch) -> torch.Tensor:
        n, d = x.shape[0], self.dim
        if self.fused:
            q, k, v = self.w_qkv(x).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = q.view(n, self.heads, d), k.view(n, self.kv_heads, d), v.reshape(n, self.kv_heads * d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self._rope(q, rope), self._rope(k, rope)

        meta = batch.decode
        if batch.decode_only:  # the common case: no rows to gather or scatter
            return self.o_proj(
                self._decode(q, k.reshape(n, -1), v, meta, batch.kv(self.layer)).view(n, self.heads * d)
            )
        out = torch.empty(n, self.heads, d, dtype=x.dtype, device=x.device)
        if meta is not None:  # one new token each: a single batched pass over the block tables
            rows = meta.rows
            out[rows] = self._decode(q[rows], k[rows].flatten(1), v[rows], meta, batch.kv(self.layer))
        for s in batch.prefilling:
            rows = slice(s.start, s.stop)
            k_all, v_all = batch.kv(self.layer).write_read(s.blocks, s.past, (k[rows].flatten(1), v[rows]))
            k_all = k_all.view(-1, self.kv_heads, self.dim)
            v_all = v_all.view(-1, self.kv_heads, self.dim)
            # [kv_heads, group, l, d] x [t, kv_heads, d]: each group of query heads reads its KV head.
            q_g = q[rows].view(s.length, self.kv_heads, self.group, self.dim).permute(1, 2, 0, 3)
            scores = torch.einsum("kgld,tkd->kglt", q_g, k_all) * self.scale
            q_pos = torch.arange(s.past, s.past + s.length, device=x.device)[:, None]
            visible = torch.arange(s.past + s.length, device=x.device)[None, :] <= q_pos
            scores = scores.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)
            out[rows] = torch.einsum("kglt,tkd->lkgd", probs, v_all).reshape(s.length, self.heads, self.dim)
        return self.o_proj(out.reshape(n, self.heads * self.dim))

    def _decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta, kv) -> torch.Tensor:
        kv.decode_write(meta, (k, v))
        return paged_kv.gqa_decode(
            q,
            kv.store(0),
            kv.store(1),
            meta.tables,
            meta.lengths,
            meta.slots,
            self.scale,
        )


class CausalLM(DecoderLM):
    def __init__(self, c: ModelConfig, t: Tensors):
        super().__init__(c, t, GQAttention, c.rotary_dim, interleaved=False)

    def kv_components(self) -> list[KVComponent]:
        """GQA caches K and V per KV head."""
        c = self.config
        return [
            KVComponent("k", c.kv_heads, c.attn_head_dim, "key"),
            KVComponent("v", c.kv_heads, c.attn_head_dim, "value"),
        ]
