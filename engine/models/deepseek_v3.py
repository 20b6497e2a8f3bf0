"""DeepSeek-V3 / Kimi K2 attention: MLA (the decoder around it is engine.models.decoder's).

Checkpoint names follow the hub layout that transformers' `save_pretrained` writes.
Attention runs in the absorbed form (queries projected into the latent space, W_UK and W_UV
folded in), so the cache holds only the latent and the shared roped key.
"""

from __future__ import annotations

import torch

from engine.arch.config import ModelConfig
from engine.kv.batch import StepBatch
from engine.models.attention import PagedAttention
from engine.models.layers import Linear, RMSNorm, RopeTables, Rotary, Tensors, dense, softmax_scale
from kernels import paged_kv


class MLAttention(PagedAttention):
    """MLA in absorbed form with its projections folded together at load:

    - one input matmul yields [q_lat | q_rot | latent | k_rot] (no q-LoRA), or [q_a | latent | k_rot]
      followed by one q_b matmul yielding [q_lat | q_rot]; W_UK is folded into the query weights;
    - W_UV is folded into o_proj, so attention output in latent space goes straight to the hidden size.
    Compressed attention weights are expanded for the fold (MLA then serves them dense).
    """

    decode_kernel = staticmethod(paged_kv.mla_decode)

    @staticmethod
    def tensors(c: ModelConfig, a: str) -> dict[str, tuple[int, ...]]:
        h, heads = c.hidden_size, c.num_attention_heads
        specs: dict[str, tuple[int, ...]] = {}
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
        return specs

    @staticmethod
    def rotary_spec(c: ModelConfig) -> tuple[int, bool]:
        return c.qk_rope_head_dim, c.rope_interleave

    def __init__(self, t: Tensors, prefix: str, c: ModelConfig, layer: int, rotary: Rotary):
        self.layer = layer
        h, self.heads = c.hidden_size, c.num_attention_heads
        self.nope, self.rope_dim, self.v_dim = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        self.rank = self.out_dim = c.kv_lora_rank
        self.rotary = rotary
        self.scale = softmax_scale(c.qk_head_dim, c.rope)
        dtype = t[f"{prefix}.kv_a_layernorm.weight"].dtype

        def w(name: str) -> torch.Tensor:
            return dense(t[f"{prefix}.{name}.weight"], dtype)

        def b(name: str, size: int) -> torch.Tensor:
            return t[f"{prefix}.{name}.bias"] if c.attention_bias else torch.zeros(size, dtype=dtype)

        kv_b = w("kv_b_proj").view(self.heads, self.nope + self.v_dim, self.rank)
        w_uk, w_uv = kv_b[:, : self.nope, :], kv_b[:, self.nope :, :]  # [H, nope, R], [H, v, R]

        def fold_queries(q_weight: torch.Tensor) -> torch.Tensor:
            """[H*(nope+rope), in] -> [H*R + H*rope, in]: q_nope . k_nope == (W_UK^T q_nope) . latent."""
            q = q_weight.view(self.heads, self.nope + self.rope_dim, -1)
            q_lat = torch.einsum("hnr,hni->hri", w_uk, q[:, : self.nope]).reshape(self.heads * self.rank, -1)
            return torch.cat([q_lat, q[:, self.nope :].reshape(self.heads * self.rope_dim, -1)])

        kv_a, kv_a_bias = w("kv_a_proj_with_mqa"), b("kv_a_proj_with_mqa", self.rank + self.rope_dim)
        self.q_lora = c.q_lora_rank
        if c.q_lora_rank is None:
            q = fold_queries(w("q_proj"))
            self.w_in = Linear(
                torch.cat([q, kv_a]), torch.cat([torch.zeros(q.shape[0], dtype=dtype), kv_a_bias])
            )
            self.q_a_norm = self.q_b = None
        else:
            self.w_in = Linear(
                torch.cat([w("q_a_proj"), kv_a]), torch.cat([b("q_a_proj", c.q_lora_rank), kv_a_bias])
            )
            self.q_a_norm = RMSNorm(t[f"{prefix}.q_a_layernorm.weight"], 1e-6)
            self.q_b = Linear(fold_queries(w("q_b_proj")))
        self.kv_a_norm = RMSNorm(t[f"{prefix}.kv_a_layernorm.weight"], 1e-6)
        o = w("o_proj").view(h, self.heads, self.v_dim)
        self.w_out = Linear(
            torch.einsum("dhv,hvr->dhr", o, w_uv).reshape(h, self.heads * self.rank),
            t[f"{prefix}.o_proj.bias"] if c.attention_bias else None,
        )

    def __call__(self, x: torch.Tensor, rope: RopeTables, batch: StepBatch) -> torch.Tensor:
        n, heads, rank, rdim = x.shape[0], self.heads, self.rank, self.rope_dim
        proj = self.w_in(x)
        if self.q_lora is None:
            q_lat, q_rot, latent, k_rot = proj.split([heads * rank, heads * rdim, rank, rdim], dim=-1)
        else:
            q_a, latent, k_rot = proj.split([self.q_lora, rank, rdim], dim=-1)
            q_lat, q_rot = self.q_b(self.q_a_norm(q_a)).split([heads * rank, heads * rdim], dim=-1)
        q_lat = q_lat.view(n, heads, rank)
        latent = self.kv_a_norm(latent)
        # queries and the shared key rotate together: one pass instead of two
        rotated = self.rotary.apply(
            torch.cat([q_rot.view(n, heads, rdim), k_rot.view(n, 1, rdim)], dim=1), rope
        )
        q_rot, k_rot = rotated[:, :heads], rotated[:, heads]

        out = self.attend(batch, (q_lat, q_rot), (latent, k_rot))
        return self.w_out(out.reshape(n, heads * rank))

    def scores(self, queries, cached) -> torch.Tensor:
        (q_lat, q_rot), (lat_all, rot_all) = queries, cached
        return torch.einsum("lhr,tr->hlt", q_lat, lat_all) + torch.einsum("lhd,td->hlt", q_rot, rot_all)

    def mix(self, probs, cached) -> torch.Tensor:
        return torch.einsum("hlt,tr->lhr", probs, cached[0])
