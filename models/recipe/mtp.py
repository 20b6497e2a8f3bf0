"""The multi-token-prediction (MTP) layer of DeepSeek-V3 / GLM-4.5, as the hub stores it, for both miniatures.

The hub keeps the MTP module as the layer after the last (N = num_hidden_layers) under
`model.layers.N.`: `enorm`, `hnorm` (RMSNorm), `eh_proj` [h, 2h], a full decoder layer with the usual
names (built with layer_idx=N, so a MoE layer), `shared_head.norm`, `shared_head.head` (a copy of
`lm_head`) and `embed_tokens` (a copy of the main embedding). For row q of a window x:

    z = eh_proj(cat([enorm(embed(x[q+1])), hnorm(h_q)]))   # h_q: the main model's final-normed state
    z = decoder_layer_N(z, position q, causal over the window, the main model's rotary)
    logits = shared_head.head(shared_head.norm(z))          # predicts x[q+2]

The layer is transformers' own DeepseekV3DecoderLayer / Glm4MoeDecoderLayer, so this module is the
reference the engine's MTP is compared with. transformers keeps routed experts fused
(`experts.gate_up_proj` [E, 2I, h], `experts.down_proj` [E, h, I]); the hub names them one by one,
which `hub_state_dict` / `load_hub_state_dict` translate.
"""

from __future__ import annotations

import torch
from torch import nn


def _family_classes(model_type: str):
    """(DecoderLayer, RMSNorm, RotaryEmbedding) of the family the config names."""
    if model_type == "deepseek_v3":
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

        return m.DeepseekV3DecoderLayer, m.DeepseekV3RMSNorm, m.DeepseekV3RotaryEmbedding
    if model_type == "glm4_moe":
        from transformers.models.glm4_moe import modeling_glm4_moe as m

        return m.Glm4MoeDecoderLayer, m.Glm4MoeRMSNorm, m.Glm4MoeRotaryEmbedding
    raise ValueError(f"no MTP layer for model_type {model_type!r}")


class SharedHead(nn.Module):
    def __init__(self, config, norm_class) -> None:
        super().__init__()
        self.norm = norm_class(config.hidden_size, eps=config.rms_norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


class MTPLayer(nn.Module):
    """One MTP module; attribute names are the hub's names under `model.layers.N.`."""

    def __init__(self, config) -> None:
        super().__init__()
        layer_class, norm_class, rotary_class = _family_classes(config.model_type)
        self.config = config
        self.layer_idx = config.num_hidden_layers
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.enorm = norm_class(h, eps=config.rms_norm_eps)
        self.hnorm = norm_class(h, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layer = layer_class(config, layer_idx=self.layer_idx)
        self.shared_head = SharedHead(config, norm_class)
        # Not a weight (its buffers are not persistent): the main model's rotary, rebuilt from the config.
        self.rotary_emb = rotary_class(config=config)

    @classmethod
    def from_main(cls, model, *, pass_through: bool = True) -> MTPLayer:
        """A fresh MTP layer for a transformers *ForCausalLM `model`: embedding and head copied and frozen.

        The decoder layer starts as a copy of the main model's last layer; pass_through: eh_proj starts
        as [0 | I] (the hidden half passes through), else random.
        """
        mtp = cls(model.config)
        std = model.config.initializer_range
        for p in mtp.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=std)
        with torch.no_grad():
            mtp.embed_tokens.weight.copy_(model.model.embed_tokens.weight)
            mtp.shared_head.head.weight.copy_(model.lm_head.weight)
            mtp.layer.load_state_dict(model.model.layers[-1].state_dict())
            mtp.shared_head.norm.weight.copy_(model.model.norm.weight)
            if pass_through:
                h = model.config.hidden_size
                mtp.eh_proj.weight.zero_()
                mtp.eh_proj.weight[:, h:].copy_(torch.eye(h))
        mtp.embed_tokens.weight.requires_grad_(False)
        mtp.shared_head.head.weight.requires_grad_(False)
        return mtp.to(model.dtype)

    def forward(
        self, hidden: torch.Tensor, next_tokens: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits [B, T, V] for x[q+2] from hidden[:, q] (final-normed h_q) and next_tokens[:, q] = x[q+1]."""
        from transformers.masking_utils import create_causal_mask

        if position_ids is None:
            position_ids = torch.arange(hidden.shape[1], device=hidden.device)[None].expand(
                hidden.shape[0], -1
            )
        e = self.embed_tokens(next_tokens)
        z = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden)], dim=-1))
        mask = create_causal_mask(
            config=self.config, inputs_embeds=z, attention_mask=None, cache=None, position_ids=position_ids
        )
        z = self.layer(
            z,
            attention_mask=mask,
            position_ids=position_ids,
            position_embeddings=self.rotary_emb(z, position_ids),
        )
        return self.shared_head.head(self.shared_head.norm(z))

    def hub_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """{hub name: tensor}, names as DeepSeek-V3 / GLM-4.5 checkpoints store them (`model.layers.N.…`)."""
        prefix = f"model.layers.{self.layer_idx}."
        out: dict[str, torch.Tensor] = {}
        for name, tensor in self.state_dict().items():
            if dtype is not None:
                tensor = tensor.to(dtype)
            if name.startswith("layer."):
                name = name.removeprefix("layer.")
                if name == "mlp.experts.gate_up_proj":
                    for e, (gate, up) in enumerate(zip(*tensor.chunk(2, dim=1), strict=True)):
                        out[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = gate.contiguous()
                        out[f"{prefix}mlp.experts.{e}.up_proj.weight"] = up.contiguous()
                    continue
                if name == "mlp.experts.down_proj":
                    for e, down in enumerate(tensor):
                        out[f"{prefix}mlp.experts.{e}.down_proj.weight"] = down
                    continue
            out[prefix + name] = tensor.contiguous()
        return out

    def load_hub_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load the `model.layers.N.*` tensors of a checkpoint (other names are ignored)."""
        prefix = f"model.layers.{self.layer_idx}."
        mine = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        n = self.config.n_routed_experts
        state = {}
        gate_up = [
            torch.cat([mine.pop(f"mlp.experts.{e}.{p}_proj.weight") for p in ("gate", "up")])
            for e in range(n)
        ]
        down = [mine.pop(f"mlp.experts.{e}.down_proj.weight") for e in range(n)]
        state["layer.mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        state["layer.mlp.experts.down_proj"] = torch.stack(down)
        top_level = ("embed_tokens.", "enorm.", "hnorm.", "eh_proj.", "shared_head.")
        for name, tensor in mine.items():
            state[name if name.startswith(top_level) else "layer." + name] = tensor
        self.load_state_dict(state, strict=True)


def mtp_parameters(mtp: MTPLayer) -> int:
    """Numbers the MTP layer adds to the checkpoint, its frozen embedding and head copies included."""
    return sum(t.numel() for t in mtp.hub_state_dict().values())


def mtp_rows(model, mtp: MTPLayer, hidden: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """MTP logits [B, T-1, V], rows q = 0..T-2 of window x [B, T]; hidden: the main model's final states."""
    return mtp(hidden[:, :-1], x[:, 1:])


@torch.no_grad()
def mtp_logits(model, mtp: MTPLayer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(main logits [B, T, V], MTP logits [B, T-1, V]) for window x; MTP row q drafts main row q+1."""
    hidden = model.model(x).last_hidden_state
    return model.lm_head(hidden), mtp_rows(model, mtp, hidden, x)
