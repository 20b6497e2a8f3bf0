"""Tiny random checkpoints made with transformers (the numerical reference) for parity tests."""

from __future__ import annotations

from pathlib import Path

import torch


def tiny_deepseek_v3(out: Path, seed: int = 0, **overrides) -> torch.nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_nope_head_dim=32,
        qk_rope_head_dim=32,
        v_head_dim=32,
        max_position_embeddings=512,
        initializer_range=0.1,  # larger than the default so logits discriminate (see NOTES.md)
        eos_token_id=1,
        bos_token_id=0,
        rope_theta=10000.0,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**cfg)).eval()
    with torch.no_grad():  # a non-zero correction bias so the test sees it applied
        for layer in model.model.layers[cfg["first_k_dense_replace"] :]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.05)
    model.save_pretrained(out)
    return model


def tiny_glm4_moe(out: Path, seed: int = 0, **overrides) -> torch.nn.Module:
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    cfg = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        attention_bias=True,
        use_qk_norm=True,
        partial_rotary_factor=0.5,
        max_position_embeddings=512,
        initializer_range=0.1,
        eos_token_id=1,
        rope_theta=10000.0,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(Glm4MoeConfig(**cfg)).eval()
    with torch.no_grad():
        for layer in model.model.layers[cfg["first_k_dense_replace"] :]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.05)
        if cfg["attention_bias"]:  # transformers initialises biases to zero; make them count
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.1)
    model.save_pretrained(out)
    return model


class MTPReference(torch.nn.Module):
    """A multi-token-prediction layer as DeepSeek-V3 / GLM-4.5 hub checkpoints store it, built on
    transformers' own decoder layer (the reference for engine.models.mtp): for the row at position
    q, z = eh_proj([enorm(embed(t_{q+1})) ; hnorm(h_q)]) through decoder layer N, then the shared
    head; h_q is the main model's final-normed hidden state."""

    def __init__(self, model: torch.nn.Module, seed: int = 1):
        super().__init__()
        cfg = model.config
        h, n = cfg.hidden_size, cfg.num_hidden_layers
        layer_class = type(model.model.layers[-1])
        norm_class = type(model.model.norm)
        torch.manual_seed(seed)
        self.main = model
        self.enorm, self.hnorm = norm_class(h, cfg.rms_norm_eps), norm_class(h, cfg.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * h, h, bias=False)
        self.layer = layer_class(cfg, layer_idx=n)
        self.shared_norm = norm_class(h, cfg.rms_norm_eps)
        with torch.no_grad():
            for norm in (self.enorm, self.hnorm, self.shared_norm):
                norm.weight.normal_(1.0, 0.1)
            self.eh_proj.weight.normal_(0, 0.1)
            for p in self.layer.parameters():
                if p.dim() >= 2:
                    p.normal_(0, 0.1)
            self.layer.mlp.gate.e_score_correction_bias.normal_(0, 0.05)
        self.eval()

    def hub_tensors(self) -> dict[str, torch.Tensor]:
        p = f"model.layers.{self.main.config.num_hidden_layers}"
        out = {}
        for k, v in self.layer.state_dict().items():
            if k == "mlp.experts.gate_up_proj":  # transformers 5 fuses the experts; the hub has one each
                inter = v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[f"{p}.mlp.experts.{e}.gate_proj.weight"] = v[e, :inter]
                    out[f"{p}.mlp.experts.{e}.up_proj.weight"] = v[e, inter:]
            elif k == "mlp.experts.down_proj":
                for e in range(v.shape[0]):
                    out[f"{p}.mlp.experts.{e}.down_proj.weight"] = v[e]
            else:
                out[f"{p}.{k}"] = v
        out[f"{p}.enorm.weight"] = self.enorm.weight
        out[f"{p}.hnorm.weight"] = self.hnorm.weight
        out[f"{p}.eh_proj.weight"] = self.eh_proj.weight
        out[f"{p}.shared_head.norm.weight"] = self.shared_norm.weight
        out[f"{p}.shared_head.head.weight"] = self.main.lm_head.weight
        out[f"{p}.embed_tokens.weight"] = self.main.model.embed_tokens.weight
        return {k: v.detach().clone().contiguous() for k, v in out.items()}

    def save_into(self, out: Path) -> None:
        """Add this layer to the checkpoint in `out` and declare it in config.json."""
        import json

        from safetensors.torch import load_file, save_file

        tensors = load_file(out / "model.safetensors")
        tensors.update(self.hub_tensors())
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
        cfg = json.loads((out / "config.json").read_text())
        cfg["num_nextn_predict_layers"] = 1
        (out / "config.json").write_text(json.dumps(cfg, indent=2))

    @torch.no_grad()
    def logits(self, ids: list[int]) -> torch.Tensor:
        """[len(ids) - 1, vocab]: row q predicts the token after ids[q + 1]."""
        x = torch.tensor([ids])
        hidden = self.main.model(x).last_hidden_state  # final-normed
        z = self.eh_proj(
            torch.cat([self.enorm(self.main.model.embed_tokens(x[:, 1:])), self.hnorm(hidden[:, :-1])], -1)
        )
        t = z.shape[1]
        positions = torch.arange(t)[None]
        mask = torch.full((1, 1, t, t), float("-inf")).triu(1)
        z = self.layer(
            z,
            attention_mask=mask,
            position_ids=positions,
            position_embeddings=self.main.model.rotary_emb(z, positions),
        )
        z = z[0] if isinstance(z, tuple) else z
        return self.main.lm_head(self.shared_norm(z))[0].float()
