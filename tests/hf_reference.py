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
