"""The full-size models the planner and the PoPs' modeled times stand for, by name or directory.

Each built-in is an excerpt of its published config.json (target_models.json, with its source),
read by the engine's own parser into the one engine.arch.architecture.Architecture that the engine,
the roofline and the planner share, exactly as a model directory's config.json is.
"""

from __future__ import annotations

import json
from pathlib import Path

from edge_sim.roofline import SimulationError
from engine.arch.architecture import Architecture, describe, load_architecture
from engine.arch.config import parse_config
from engine.errors import ModelLoadError


def _published() -> dict[str, Architecture]:
    raw = json.loads((Path(__file__).parent / "target_models.json").read_text())
    return {name: describe(parse_config(config, f"{name} config.json"), name) for name, config in raw.items()}


TARGET_MODELS = _published()
KIMI_K2, GLM_4_5 = TARGET_MODELS["kimi-k2"], TARGET_MODELS["glm-4.5"]
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
