"""The multi-token-prediction (MTP) layer DeepSeek-V3 and GLM-4.5 checkpoints carry: the draft of
MTP speculative decoding (engine.speculation).

On the hub the MTP module is the layer after the last, `model.layers.{N}` with N =
num_hidden_layers: its own embedding norm and hidden norm, a projection of the two concatenated,
one full decoder layer (attention and MoE, the model's own shapes) and a shared head (a norm and a
copy of the LM head; the embedding is a copy too). For the row at position q it reads the main
model's final-normed hidden state h_q and the next token t_{q+1}, and predicts t_{q+2}:

    z = eh_proj([enorm(embed(t_{q+1})) ; hnorm(h_q)]),  z = layer_N(z at position q),
    logits = head(shared_head.norm(z))

Its attention caches keys and values like any layer, as layer N of the paged cache, at the same
positions as the main model's. Chained drafts feed the layer its own normed output as the next
row's hidden state (the same kind of vector the main model's head reads).
"""

from __future__ import annotations

import torch

from engine.arch.architecture import describe
from engine.arch.config import ModelConfig
from engine.kv.batch import StepBatch
from engine.models.attention import PagedAttention
from engine.models.decoder_layer import DecoderLayer
from engine.models.layers import Linear, LMHead, RMSNorm, Rotary, Tensors, mlp_tensors, moe_tensors

# the copies a hub checkpoint stores in the MTP layer: used only when they differ from the main model's
SHARED_COPIES = ("embed_tokens.weight", "shared_head.head.weight")


def mtp_prefix(c: ModelConfig) -> str:
    return f"model.layers.{c.num_hidden_layers}"


def mtp_layers(c: ModelConfig) -> int:
    """MTP layers the checkpoint's config.json declares (`num_nextn_predict_layers`)."""
    return c.num_nextn_predict_layers


def mtp_tensors(c: ModelConfig, attention: type[PagedAttention]) -> dict[str, tuple[int, ...]]:
    """The MTP layer's checkpoint tensors with their shapes (the shared copies included)."""
    h, p = c.hidden_size, mtp_prefix(c)
    specs: dict[str, tuple[int, ...]] = {
        f"{p}.enorm.weight": (h,),
        f"{p}.hnorm.weight": (h,),
        f"{p}.eh_proj.weight": (h, 2 * h),
        f"{p}.shared_head.norm.weight": (h,),
        f"{p}.shared_head.head.weight": (c.vocab_size, h),
        f"{p}.embed_tokens.weight": (c.vocab_size, h),
        f"{p}.input_layernorm.weight": (h,),
        f"{p}.post_attention_layernorm.weight": (h,),
    }
    specs.update(attention.tensors(c, f"{p}.self_attn"))
    if describe(c).is_moe_layer(c.num_hidden_layers):
        specs.update(moe_tensors(f"{p}.mlp", c))
    else:
        specs.update(mlp_tensors(f"{p}.mlp", h, c.intermediate_size))
    return specs


def mtp_float32_tensors(c: ModelConfig) -> set[str]:
    """The MTP layer's router stays float32, as the main layers' does."""
    p = mtp_prefix(c)
    return {f"{p}.mlp.gate.weight", f"{p}.mlp.gate.e_score_correction_bias"}


class MTPLayer:
    """One MTP module over a flat batch of rows (hidden state, next token, position)."""

    def __init__(
        self,
        c: ModelConfig,
        t: Tensors,
        attention: type[PagedAttention],
        rotary: Rotary,
        embed: torch.Tensor,
        lm_head: LMHead,
    ):
        p = mtp_prefix(c)
        self.layer_index = c.num_hidden_layers  # its index in the paged cache
        self.enorm = RMSNorm(t[f"{p}.enorm.weight"], c.rms_norm_eps)
        self.hnorm = RMSNorm(t[f"{p}.hnorm.weight"], c.rms_norm_eps)
        self.eh_proj = Linear(t[f"{p}.eh_proj.weight"])
        self.block = DecoderLayer(t, c, describe(c), c.num_hidden_layers, attention, rotary)  # model.layers.N
        self.norm = RMSNorm(t[f"{p}.shared_head.norm.weight"], c.rms_norm_eps)
        self.rotary = rotary
        own_embed, own_head = (t[f"{p}.{name}"] for name in SHARED_COPIES)
        # the hub stores copies of the embedding and the head: the main model's tensors serve when
        # they are equal (one copy in memory, and the head the decode step keeps hot)
        self.embed = embed if _same(own_embed, embed) else own_embed
        self.head = lm_head if _same(own_head, lm_head.weight) else LMHead(own_head)

    def forward(
        self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor, batch: StepBatch
    ) -> torch.Tensor:
        """Rows [n, h] of final-normed hidden states, their next tokens and positions -> the MTP
        layer's normed output [n, h] (what its head reads, and a chained draft's next hidden)."""
        e = self.embed[next_ids].to(hidden.dtype)  # (a bf16 embedding kept bf16: its rows widened)
        z = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden)], dim=-1))
        z = self.block(z, self.rotary.tables(positions, z.dtype), batch)
        return self.norm(z)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.head(out)


def _same(a, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
