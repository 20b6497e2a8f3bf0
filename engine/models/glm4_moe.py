"""GLM-4.5 / 4.5-Air / 4.6 attention: GQA (bias, optional QK-norm, partial rotary); the decoder
around it (dense then sigmoid-routed MoE layers, the DeepSeek-V3 router family) is
engine.models.decoder's.

The cache holds K and V per KV head; queries of a group share them.
"""

from __future__ import annotations

import torch

from engine.arch.config import ModelConfig
from engine.kv.batch import StepBatch
from engine.models.attention import PagedAttention
from engine.models.layers import Linear, RMSNorm, RopeTables, Rotary, Tensors, linear
from kernels import paged_kv


class GQAttention(PagedAttention):
    decode_kernel = staticmethod(paged_kv.gqa_decode)

    @staticmethod
    def tensors(c: ModelConfig, a: str) -> dict[str, tuple[int, ...]]:
        h, d = c.hidden_size, c.attn_head_dim
        q_out, kv_out = c.num_attention_heads * d, c.kv_heads * d
        specs: dict[str, tuple[int, ...]] = {}
        for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            specs[f"{a}.{proj}.weight"] = (out, h)
            if c.attention_bias:
                specs[f"{a}.{proj}.bias"] = (out,)
        specs[f"{a}.o_proj.weight"] = (h, q_out)
        if c.use_qk_norm:
            specs[f"{a}.q_norm.weight"] = (d,)
            specs[f"{a}.k_norm.weight"] = (d,)
        return specs

    @staticmethod
    def rotary_spec(c: ModelConfig) -> tuple[int, bool]:
        return c.rotary_dim, False

    def __init__(self, t: Tensors, prefix: str, c: ModelConfig, layer: int, rotary: Rotary):
        self.layer = layer
        self.heads, self.kv_heads, self.dim = c.num_attention_heads, c.kv_heads, c.attn_head_dim
        self.out_dim = self.dim
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

        out = self.attend(batch, (q,), (k.reshape(n, -1), v))
        return self.o_proj(out.reshape(n, self.heads * d))

    def scores(self, queries, cached) -> torch.Tensor:
        # [kv_heads, group, l, d] x [t, kv_heads, d]: each group of query heads reads its KV head.
        q = queries[0]
        q_g = q.view(q.shape[0], self.kv_heads, self.group, self.dim).permute(1, 2, 0, 3)
        return torch.einsum("kgld,tkd->kglt", q_g, cached[0].view(-1, self.kv_heads, self.dim))

    def mix(self, probs, cached) -> torch.Tensor:
        v_all = cached[1].view(-1, self.kv_heads, self.dim)
        return torch.einsum("kglt,tkd->lkgd", probs, v_all).reshape(probs.shape[2], self.heads, self.dim)
