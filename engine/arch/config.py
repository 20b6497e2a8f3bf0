"""Model configuration read from an HF-format config.json into a typed struct.

Only the keys the engine uses are declared; the published configs carry many more (they are kept
in `raw` and written back untouched). Wrong types fail with the key's name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from engine.errors import ModelLoadError

SUPPORTED_MODEL_TYPES = ("deepseek_v3", "kimi_k2", "glm4_moe")


class RopeSpec(msgspec.Struct, frozen=True):
    """Rotary embedding parameters, normalised from `rope_scaling`/`rope_theta` or `rope_parameters`."""

    theta: float = 10000.0
    type: str = "default"  # "default" or "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int = 1
    first_k_dense_replace: int = 0
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    # MLA
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_interleave: bool = True
    attention_bias: bool = False
    # GQA (GLM-4.5)
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    partial_rotary_factor: float = 1.0
    use_qk_norm: bool = False
    # common
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    # multi-token-prediction layers stored after the last layer (the drafts of MTP speculation)
    num_nextn_predict_layers: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    rope: RopeSpec = RopeSpec()

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def attn_head_dim(self) -> int:
        """Per-head width of GQA attention (GLM-4.5 sets it explicitly: 128 with hidden 5120)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.attn_head_dim * self.partial_rotary_factor)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)


def _rope_spec(raw: dict[str, Any]) -> RopeSpec:
    # transformers 5 writes `rope_parameters` (theta inside); published checkpoints carry
    # `rope_theta` plus an optional `rope_scaling`. Accept both.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = params.pop("rope_theta", None) or raw.get("rope_theta") or 10000.0
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("partial_rotary_factor", None)  # read by parse_config
    known = set(RopeSpec.__struct_fields__)
    spec = {k: v for k, v in params.items() if k in known}
    if rope_type not in ("default", "yarn"):
        raise ModelLoadError(
            f"config.json: rope type {rope_type!r} is not supported; use 'default' or 'yarn'"
        )
    if rope_type == "yarn" and spec.get("original_max_position_embeddings") is None:
        spec["original_max_position_embeddings"] = raw.get("max_position_embeddings", 4096)
    try:
        return msgspec.convert({"theta": theta, "type": rope_type, **spec}, RopeSpec)
    except msgspec.ValidationError as exc:
        raise ModelLoadError(f"config.json: rope parameters: {exc}") from None


def parse_config(raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"{source}: model_type {model_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    fields = set(ModelConfig.__struct_fields__)
    data = {k: v for k, v in raw.items() if k in fields and k != "rope"}
    data["rope"] = msgspec.to_builtins(_rope_spec(raw))
    # partial_rotary_factor sits at the top level in published configs and inside rope_parameters
    # in configs transformers 5 writes; GLM-4.5 rotates half of each head when it is absent.
    rope_params = raw.get("rope_parameters") or {}
    partial = raw.get("partial_rotary_factor", rope_params.get("partial_rotary_factor"))
    if partial is None and model_type == "glm4_moe":
        partial = 0.5
    if partial is not None:
        data["partial_rotary_factor"] = partial
    try:
        config = msgspec.convert(data, ModelConfig)
    except msgspec.ValidationError as exc:
        raise ModelLoadError(f"{source}: {exc}") from None
    _validate(config, source)
    return config


def _validate(c: ModelConfig, source: str) -> None:
    def fail(field: str, expected: str) -> None:
        raise ModelLoadError(f"{source}: {field} = {getattr(c, field)!r}; expected {expected}")

    if c.scoring_func != "sigmoid":
        fail("scoring_func", "'sigmoid' (the DeepSeek-V3 / Kimi K2 router)")
    if c.n_routed_experts % c.n_group:
        fail("n_group", f"a divisor of n_routed_experts ({c.n_routed_experts})")
    if not 1 <= c.topk_group <= c.n_group:
        fail("topk_group", f"between 1 and n_group ({c.n_group})")
    if not 1 <= c.num_experts_per_tok <= c.topk_group * (c.n_routed_experts // c.n_group):
        fail("num_experts_per_tok", "at least 1 and at most the experts in the selected groups")
    if c.n_routed_experts // c.n_group < 2 and c.n_group > 1:
        fail("n_group", "groups of at least two experts (group scores sum each group's top two)")
    if c.model_type == "glm4_moe":
        if c.num_attention_heads % c.kv_heads:
            fail("num_key_value_heads", f"a divisor of num_attention_heads ({c.num_attention_heads})")
        if not 0 < c.partial_rotary_factor <= 1 or c.rotary_dim % 2:
            fail("partial_rotary_factor", "in (0, 1] giving an even number of rotary dims per head")
    elif c.qk_rope_head_dim % 2:
        fail("qk_rope_head_dim", "an even number")
    if c.hidden_act != "silu":
        fail("hidden_act", "'silu'")


def load_config(model_dir: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: not found; a model directory needs config.json") from None
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    return parse_config(raw, source=str(path)), raw
