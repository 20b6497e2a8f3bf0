"""The model catalog: names users call (`@edge/moonshotai/kimi-k2-mini`) and what serves them.

Read from `catalog.toml` in the models folder (WorkerConfig.models_dir: `[edge] models_dir`, else
$EDGE_MODELS_DIR, else the models shipped with this installation); each entry names its checkpoint
folder and says honestly what it is (for instance, random weights).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from edge_sim.pop import ModelSpec
from edge_sim.roofline import SimulationError
from edge_sim.target import TargetSpec
from runtime.ai.cloudflare_names import stand_ins
from runtime.ai.embeddings import catalog_entries as embedding_entries
from runtime.ai.inputs import TextGenerationInputs
from runtime.ai.refusals import REFUSED
from runtime.control.config import MODELS_DIR_ENV, ConfigError

if TYPE_CHECKING:
    from edge_sim.edge import Edge

Schema = Literal["text-generation", "chat-completions"]


class CatalogAlias(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Another provider's name for a model this entry stands in for (`@cf/moonshotai/kimi-k2.6`):
    calls under it are served by the entry's miniature, and every answer says so (`served_by`)."""

    name: str
    schema: Schema | None = None  # the answer's shape under this name (default: the entry's)
    description: str = ""  # what the aliased model is, as its provider describes it
    source: str = ""  # where the provider documents the name


class CatalogSpeculative(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`speculative = { method = "ngram", tokens = 5 }` or `{ method = "mtp", tokens = 1 }` (the
    checkpoint's MTP layer drafts): the model's default, over $EDGE_SPECULATIVE (method "off":
    never); a request's `"speculative": false` turns it off for that request."""

    method: Literal["ngram", "mtp", "off"]
    tokens: int | None = None  # draft tokens per step at most (1-14; default 5 for ngram, 1 for mtp)

    def setting(self) -> str:
        """As engine.speculation.parse_speculative reads it."""
        if self.method == "off":
            return "off"
        return self.method if self.tokens is None else f"{self.method}:{self.tokens}"


class CatalogEntry(msgspec.Struct, kw_only=True):
    name: str
    path: str  # checkpoint folder, relative to the catalog
    task: str = "text-generation"
    description: str = ""
    context_window: int | None = None
    weights: str = "auto"
    kv_cache_dtype: str = "auto"
    # "chat-completions": env.AI.run answers in OpenAI's ChatCompletion shape, as Cloudflare's
    # Kimi and GLM entries do; "text-generation": {"response": ..., "usage": ...}
    schema: Literal["text-generation", "chat-completions"] = "text-generation"
    # the full-size model this miniature stands for (e.g. {model = "kimi-k2", weights = "fp8"}):
    # every answer's timing then also carries roofline-modeled times on the PoP's GPUs
    target: TargetSpec | None = None
    aliases: list[CatalogAlias] = []
    speculative: CatalogSpeculative | None = None  # None: $EDGE_SPECULATIVE decides


class Catalog(msgspec.Struct):
    model: list[CatalogEntry]


def load_catalog(models_dir: Path) -> dict[str, tuple[CatalogEntry, Path]]:
    """Catalog name -> (entry, absolute checkpoint folder)."""
    path = models_dir / "catalog.toml"
    try:
        catalog = msgspec.convert(tomllib.loads(path.read_text()), Catalog)
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no model catalog; point [edge] models_dir (or ${MODELS_DIR_ENV}) at a folder "
            "with catalog.toml"
        ) from None
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    entries = {}
    for entry in catalog.model:
        folder = (models_dir / entry.path).resolve()
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{path}: model {entry.name!r}: {folder} has no config.json")
        if entry.target is not None:
            try:
                entry.target.check()
            except SimulationError as exc:
                raise ConfigError(f"{path}: model {entry.name!r}: target: {exc}") from None
        tokens = entry.speculative.tokens if entry.speculative is not None else None
        if tokens is not None and not 1 <= tokens <= 14:
            raise ConfigError(
                f"{path}: model {entry.name!r}: speculative.tokens must be 1-14 (a KV block's room), "
                f"got {tokens}"
            )
        entries[entry.name] = (entry, folder)
    names = [a.name for entry in catalog.model for a in entry.aliases]
    clash = sorted({n for n in names if n in entries or names.count(n) > 1})
    if clash:
        raise ConfigError(f"{path}: alias(es) {', '.join(clash)} name more than one model")
    return entries


def alias_map(
    catalog: dict[str, tuple[CatalogEntry, Path]], stand_ins_from: list[str] | None = None
) -> dict[str, tuple[str, CatalogAlias]]:
    """Alias -> (the catalog name that serves it, the alias's entry); `stand_ins_from` (the names
    served, [] for all): also every other Cloudflare text-generation name, by the closest of those
    miniatures (runtime.ai.cloudflare_names)."""
    own = {a.name: (name, a) for name, (entry, _) in catalog.items() for a in entry.aliases}
    if stand_ins_from is None:
        return own
    listed = {
        name: (
            target,
            CatalogAlias(
                name=name,
                schema="text-generation",
                description=f"{name} on Workers AI; not shipped here: the closest stand-in answers.",
                source=source,
            ),
        )
        for name, (target, source) in stand_ins(catalog, stand_ins_from).items()
    }
    return {**listed, **own}


def catalog_if_any(config) -> dict[str, tuple[CatalogEntry, Path]]:
    """The catalog, or {} when the models folder has none (an edge without GPU PoPs needs none)."""
    if not (config.models_dir / "catalog.toml").is_file():
        return {}
    return load_catalog(config.models_dir)


def served_models(config) -> tuple[dict[str, tuple[CatalogEntry, Path]], list[str]]:
    """The catalog and the names `config` serves from it (`[edge] models`, default all)."""
    catalog = load_catalog(config.models_dir)
    names = config.edge.models or list(catalog)
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise ConfigError(
            f"edge.models: unknown model(s) {', '.join(unknown)}; the catalog has {', '.join(catalog)}"
        )
    return catalog, names


def model_spec(config, name: str, catalog: dict[str, tuple[CatalogEntry, Path]]) -> ModelSpec:
    """What a PoP needs to load catalog entry `name` under `config`'s trust settings."""
    entry, folder = catalog[name]
    return ModelSpec(
        name,
        str(folder),
        entry.weights,
        entry.kv_cache_dtype,
        trusted_keys=config.trusted_keys,
        allow_unsigned=config.models.allow_unsigned,
        speculative=entry.speculative.setting() if entry.speculative is not None else "env",
    )


def quality_path(folder: Path) -> Path:
    """Where `edge models eval --record` keeps a model's last measured quality (outside its signed folder)."""
    return folder.parent / "quality" / f"{folder.name}.json"


def quality_view(folder: Path) -> list[dict]:
    """The last measured cost of each KV format on this model: perplexity change and greedy
    agreement against the uncompressed cache, per context length (`edge models eval --record`)."""
    path = quality_path(folder)
    if not path.is_file():
        return []
    return [
        {
            "weights": r["weights"],
            "kv_cache": r["kv_cache_dtype"],
            "context": r["context"],
            "ppl_change_pct": round(r["ppl_change_pct"], 3),
            "greedy_agreement": round(r["greedy_agreement"], 4),
        }
        for r in json.loads(path.read_text())
    ]


def accepted_inputs() -> dict[str, Any]:
    """What a model's Workers AI inputs take (runtime.ai.inputs) and refuse by name, with why
    (runtime.ai.refusals): the same for every text-generation model here."""
    return {
        "parameters": sorted(TextGenerationInputs.__struct_fields__),
        "refused": {name: why for name, (_, why) in REFUSED.items()},
    }


def catalog_view(
    catalog: dict[str, tuple[CatalogEntry, Path]],
    edge: Edge,
    aliases: dict[str, tuple[str, CatalogAlias]] | None = None,
) -> list[dict[str, Any]]:
    """The catalog as the models search API shows it: formats that serve each model, always;
    then each alias (another provider's name, `@cf/...`; `aliases`, default the catalog's own)
    with the miniature that stands in; then the embedding names and their stand-in."""
    out = []
    for name, (entry, folder) in catalog.items():
        formats = next((n.formats(name) for n in edge.nodes.values() if name in n.models()), None)
        weights, kv, by_part = (
            (formats.weights, formats.kv_cache, formats.weights_by_part)
            if formats
            else (entry.weights, entry.kv_cache_dtype, {})
        )
        out.append(
            {
                "id": name,
                "name": name,
                "description": entry.description,
                "task": {"name": "Text Generation"},  # Cloudflare's task for its Kimi and GLM too
                "schema": entry.schema,
                "properties": [{"property_id": "context_window", "value": str(entry.context_window or "")}],
                "quantization": {
                    "weights": weights,
                    "weights_by_part": by_part,
                    "kv_cache": kv,
                    **({"dense_path": formats.dense_path} if formats and formats.dense_path else {}),
                },
                "quality": quality_view(folder),
                "served": name in edge.models(),
                "served_by": {"model": name, "stand_in": False, "weights": weights, "kv_cache": kv},
                "aliases": [a.name for a in entry.aliases],
                "inputs": accepted_inputs(),
            }
        )
    views = {view["name"]: view for view in out}
    for alias, (target, entry) in (alias_map(catalog) if aliases is None else aliases).items():
        view = views[target]
        out.append(
            {
                **view,
                "id": alias,
                "name": alias,
                "description": f"{entry.description} Served here by the miniature {target}.".strip(),
                "schema": entry.schema or view["schema"],
                "served_by": {**view["served_by"], "stand_in": True},
                "aliases": [],
                "source": entry.source,
            }
        )
    return out + embedding_entries()


def search_models(models: list[dict], search: str | None, task: str | None, author: str | None) -> list[dict]:
    """The catalog entries a Model Search query matches (case-insensitive, as Cloudflare's)."""

    def norm(text: str) -> str:
        return text.lower().replace("-", " ").replace("_", " ").strip()

    out = models
    if search:
        needle = search.lower()
        out = [m for m in out if needle in m["name"].lower() or needle in m["description"].lower()]
    if task:
        out = [m for m in out if norm(m["task"]["name"]) == norm(task)]
    if author:
        out = [m for m in out if m["name"].lower().split("/")[1:2] == [author.lower()]]
    return out


MODELS_PARAMS = ("search", "task", "author", "page", "per_page", "hide_experimental", "source")


def models_matching(models: list[dict], params: Any) -> list[dict]:
    """env.AI.models(params): `search`, `task`, `author` as Model Search takes them, `page` and
    `per_page` (default all); ValueError naming a key it does not take or a value of the wrong type."""
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise ValueError(f"env.AI.models takes a dict of filters ({', '.join(MODELS_PARAMS)}) or nothing")
    for key, value in params.items():
        if key not in MODELS_PARAMS:
            raise ValueError(
                f"env.AI.models: no filter {str(key)[:64]!r}; the filters are {', '.join(MODELS_PARAMS)}"
            )
        if key in ("search", "task", "author", "source") and not isinstance(value, str | None):
            raise ValueError(f"env.AI.models: {key} must be a string")
        if key in ("page", "per_page") and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(f"env.AI.models: {key} must be an integer from 1")
    found = search_models(models, params.get("search"), params.get("task"), params.get("author"))
    per_page = params.get("per_page", len(found) or 1)
    page = params.get("page", 1)
    return found[(page - 1) * per_page : page * per_page]
