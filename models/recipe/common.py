"""What the main training (train.py) and the MTP training (train_mtp.py) both use: the families'
shapes and the config.json they publish, the corpus as tokens, the learning-rate schedule and the
router's balancing rate.

A module of its own so that train_mtp.py takes these from here rather than from train.py, which
imports train_mtp.py for `--mtp`: neither trainer imports the other back (and `python -m
models.recipe.train --mtp` no longer loads train.py a second time, as models.recipe.train beside
__main__).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from models.recipe.corpus import read_corpus

KIMI_MINI = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.827,  # Kimi K2's published value
    norm_topk_prob=True,
    q_lora_rank=None,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=32,
    v_head_dim=32,
    max_position_embeddings=4096,
    rope_theta=50000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
GLM_MINI = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA, as GLM-4.5 (96 query heads over 8 KV heads)
    head_dim=64,
    partial_rotary_factor=0.5,  # GLM-4.5 rotates half of each head
    use_qk_norm=True,
    attention_bias=True,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,  # GLM-4.5's published value
    norm_topk_prob=True,
    max_position_embeddings=4096,
    rope_theta=1000000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
FAMILIES = {"kimi": KIMI_MINI, "glm": GLM_MINI}

# DeepSeek-V3 uses 1e-3 over trillions of tokens; a miniature trained for 1,600 steps at a high
# learning rate needs the bias to catch up with its router within tens of steps.
BIAS_UPDATE_RATE = 1e-2


def encode_corpus(tokenizer_path: Path, heldout: bool) -> torch.Tensor:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    text = read_corpus(heldout=heldout)
    chunk = 1 << 16
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    ids: list[int] = []
    for enc in tok.encode_batch(pieces, add_special_tokens=False):
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.int16 if tok.get_vocab_size() < 32768 else torch.int32)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def write_published_config(
    out: Path, family: str, eos_id: int | list[int], nextn_predict_layers: int = 0
) -> None:
    """Rewrite config.json with the keys the published Kimi K2 / GLM-4.5 configs carry (not only ours).

    nextn_predict_layers: how many MTP layers the checkpoint holds (0 after a main training; --mtp adds 1).
    """
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    rope = cfg.pop("rope_parameters", None) or {}
    shape = FAMILIES[family]
    common = dict(
        rope_theta=rope.get("rope_theta", shape["rope_theta"]),
        rope_scaling=None,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        num_nextn_predict_layers=nextn_predict_layers,
        eos_token_id=eos_id,
        torch_dtype="bfloat16",
    )
    if family == "kimi":
        cfg.update(
            architectures=["DeepseekV3ForCausalLM"],
            model_type="deepseek_v3",
            aux_loss_alpha=0.0,
            seq_aux=True,
            ep_size=1,
            moe_layer_freq=1,
            **common,
        )
    else:
        cfg.update(
            architectures=["Glm4MoeForCausalLM"],
            model_type="glm4_moe",
            partial_rotary_factor=rope.get("partial_rotary_factor", shape["partial_rotary_factor"]),
            **common,
        )
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")
