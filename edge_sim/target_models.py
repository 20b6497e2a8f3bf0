"""The full-size models the planner and the PoPs' modeled times stand for, by name or directory.

Each built-in is an excerpt of its published config.json, read by the engine's own parser into the
one engine.architecture.Architecture that the engine, the roofline and the planner share.
"""

from __future__ import annotations

from pathlib import Path

from edge_sim.roofline import SimulationError
from engine.architecture import Architecture, describe, load_architecture
from engine.config import parse_config
from engine.errors import ModelLoadError


def _published(name: str, **config) -> Architecture:
    return describe(parse_config(config, source=f"{name} config.json"), name)


# moonshotai/Kimi-K2-Instruct (the DeepSeek-V3 architecture): MLA, 384 routed experts of 2048 with
# 8 active plus 1 shared, the first layer dense.
KIMI_K2 = _published(
    "kimi-k2",
    model_type="kimi_k2",
    hidden_size=7168,
    num_hidden_layers=61,
    num_attention_heads=64,
    vocab_size=163840,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    n_routed_experts=384,
    num_experts_per_tok=8,
    n_shared_experts=1,
    first_k_dense_replace=1,
    max_position_embeddings=131072,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
)

# zai-org/GLM-4.5: GQA with 96 query and 8 KV heads of 128 and attention bias; 160 routed experts of
# 1536 with 8 active plus 1 shared, the first 3 layers dense. (The multi-token-prediction layer is
# not counted: serving without speculation skips it.)
GLM_4_5 = _published(
    "glm-4.5",
    model_type="glm4_moe",
    hidden_size=5120,
    num_hidden_layers=92,
    num_attention_heads=96,
    num_key_value_heads=8,
    head_dim=128,
    attention_bias=True,
    vocab_size=151552,
    intermediate_size=12288,
    moe_intermediate_size=1536,
    n_routed_experts=160,
    num_experts_per_tok=8,
    n_shared_experts=1,
    first_k_dense_replace=3,
    max_position_embeddings=131072,
)

TARGET_MODELS: dict[str, Architecture] = {m.name: m for m in (KIMI_K2, GLM_4_5)}
_ALIASES = {"kimi_k2": "kimi-k2", "kimik2": "kimi-k2", "glm4.5": "glm-4.5", "glm-4_5": "glm-4.5"}


def target_model(name_or_dir: str | Path) -> Architecture:
    """A built-in target model by name (kimi-k2, glm-4.5) or one read from DIR/config.json."""
    text = str(name_or_dir).strip()
    key = _ALIASES.get(text.lower(), text.lower())
    if key in TARGET_MODELS:
        return TARGET_MODELS[key]
    path = Path(text)
    if path.is_dir():
        try:
            return load_architecture(path)
        except ModelLoadError as exc:
            raise SimulationError(f"model {str(path)!r}: {exc}") from None
    raise SimulationError(
        f"unknown target model {text!r}; use one of {', '.join(TARGET_MODELS)} "
        f"or a model directory with a config.json (deepseek_v3, kimi_k2 or glm4_moe)"
    )
