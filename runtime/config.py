"""The worker's config, read once into typed structs: wrangler.json, wrangler.jsonc or
wrangler.toml (wrangler's own files and keys), or wrangler-like.toml.

Unknown keys warn (naming the key); wrong types fail with the key's path; malformed TOML or JSON
fails with the line and column. Relative paths are resolved against the config file's folder.
Our own tables, `edge` and `models`, are the same in every format.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from runtime import limits as worker_limits
from runtime.fetch_guard import parse_host_port
from runtime.validation import describe

if TYPE_CHECKING:
    from edge_sim.topology import Topology

log = logging.getLogger("edge.config")

DEFAULT_CONFIG = "wrangler-like.toml"
# What `edge` looks for in the current folder when no --config is given, first found wins:
# wrangler's own order (packages/wrangler/src/config/config-helpers.ts, findWranglerConfig:
# wrangler.json, then wrangler.jsonc, then wrangler.toml), then ours.
CONFIG_NAMES = ("wrangler.json", "wrangler.jsonc", "wrangler.toml", DEFAULT_CONFIG)
DEFAULT_POPS = ["ICN", "FRA", "IAD"]
MODELS_DIR_ENV = "EDGE_MODELS_DIR"
# The shipped miniatures and catalog: models/ beside the installed packages (the repository's
# models/ with the editable install; package data in a wheel, installed beside runtime/).
INSTALLED_MODELS_DIR = Path(__file__).resolve().parent.parent / "models"


class ConfigError(Exception):
    """The config cannot be used as written; the message names the file, key and what to change."""


class AIConfig(msgspec.Struct, forbid_unknown_fields=False):
    binding: str = "AI"


class NetworkConfig(msgspec.Struct):
    base_ms: float = 2.0
    inflation: float = 2.0
    backbone_inflation: float = 1.4
    backbone_base_ms: float = 0.5
    jitter_ms: float = 0.0
    seed: int = 0


class EdgeConfig(msgspec.Struct):
    client_location: str = "Seoul"
    # GPU PoPs that run an in-process engine in this session (IATA codes of the topology); unset =
    # DEFAULT_POPS when the worker has an AI binding, none (no engine loads) when it has not.
    pops: list[str] | None = None
    # Catalog names every GPU PoP serves; empty = every model in the catalog.
    models: list[str] = msgspec.field(default_factory=list)
    # Unset: $EDGE_MODELS_DIR, else the models shipped with this installation (INSTALLED_MODELS_DIR).
    models_dir: str | None = None
    # A TOML file of PoPs that extend (or, with replace = true, replace) the built-in world topology.
    topology: str | None = None
    max_in_flight: int = 256  # per GPU PoP; beyond it the router spills to the next best PoP
    # HOST:PORT servers (private or loopback) a worker's fetch may reach, for local development;
    # only this file sets it. The runtime's own port and PoP node URLs stay refused.
    fetch_allow: list[str] = msgspec.field(default_factory=list)
    network: NetworkConfig = msgspec.field(default_factory=NetworkConfig)


class ModelsConfig(msgspec.Struct):
    # Public keys (PEM files, relative to the config) whose signatures make a model servable;
    # empty = the project's own trust store, models/keys/*.pub.
    trusted_keys: list[str] = msgspec.field(default_factory=list)
    allow_unsigned: bool = False  # serve models without a manifest (with a warning)


class LimitsConfig(msgspec.Struct):
    # Ranges and defaults live in runtime/limits.py; parse_config checks these against them.
    cpu_ms: int = worker_limits.DEFAULTS["cpu_ms"]  # CPU time per request (Workers' default on paid plans)
    memory_mb: int = worker_limits.DEFAULTS["memory_mb"]  # per isolate, as on Workers
    subrequests: int = worker_limits.DEFAULTS["subrequests"]  # fetch() calls per request


class ServiceBindingConfig(msgspec.Struct):
    binding: str  # the name in env
    service: str  # another worker of the same account


# --- wrangler's keys -----------------------------------------------------------------------------
# The tables wrangler.json/jsonc/toml declare, named exactly as wrangler's keys (its
# packages/wrangler/src/config/environment.ts). Parsed and type-checked here; what serves them lives
# elsewhere (KV, D1, R2, queues, Durable Objects, crons, assets). Migrations are accepted as
# wrangler writes them; locally every bound class simply exists (its storage is created on
# first use).


class ObservabilityLogsConfig(msgspec.Struct, kw_only=True):
    enabled: bool | None = None
    head_sampling_rate: float | None = None
    invocation_logs: bool | None = None


class ObservabilityConfig(msgspec.Struct, kw_only=True):
    enabled: bool | None = None
    head_sampling_rate: float | None = None
    logs: ObservabilityLogsConfig | None = None


class KVNamespaceConfig(msgspec.Struct, kw_only=True):
    binding: str
    id: str
    preview_id: str | None = None


class D1DatabaseConfig(msgspec.Struct, kw_only=True):
    binding: str
    database_name: str
    database_id: str
    preview_database_id: str | None = None
    migrations_dir: str | None = None  # wrangler's default: "migrations", relative to the config
    migrations_table: str | None = None


class R2BucketConfig(msgspec.Struct, kw_only=True):
    binding: str
    bucket_name: str
    preview_bucket_name: str | None = None
    jurisdiction: str | None = None


class DurableObjectBindingConfig(msgspec.Struct, kw_only=True):
    name: str  # the name in env
    class_name: str
    script_name: str | None = None
    environment: str | None = None


class DurableObjectsConfig(msgspec.Struct, kw_only=True):
    bindings: list[DurableObjectBindingConfig] = msgspec.field(default_factory=list)


class RenamedClassConfig(msgspec.Struct, kw_only=True):
    from_: str = msgspec.field(name="from")
    to: str


class TransferredClassConfig(msgspec.Struct, kw_only=True):
    from_: str = msgspec.field(name="from")
    from_script: str
    to: str


class MigrationConfig(msgspec.Struct, kw_only=True):
    tag: str
    new_classes: list[str] = msgspec.field(default_factory=list)
    new_sqlite_classes: list[str] = msgspec.field(default_factory=list)
    renamed_classes: list[RenamedClassConfig] = msgspec.field(default_factory=list)
    deleted_classes: list[str] = msgspec.field(default_factory=list)
    transferred_classes: list[TransferredClassConfig] = msgspec.field(default_factory=list)


class QueueProducerConfig(msgspec.Struct, kw_only=True):
    binding: str
    queue: str
    delivery_delay: int | None = None


class QueueConsumerConfig(msgspec.Struct, kw_only=True):
    queue: str
    max_batch_size: int | None = None
    max_batch_timeout: float | None = None  # seconds
    max_retries: int | None = None
    dead_letter_queue: str | None = None
    max_concurrency: int | None = None
    retry_delay: int | None = None


class QueuesConfig(msgspec.Struct, kw_only=True):
    producers: list[QueueProducerConfig] = msgspec.field(default_factory=list)
    consumers: list[QueueConsumerConfig] = msgspec.field(default_factory=list)


class TriggersConfig(msgspec.Struct, kw_only=True):
    crons: list[str] = msgspec.field(default_factory=list)


class AssetsConfig(msgspec.Struct, kw_only=True):
    directory: str  # relative to the config
    binding: str | None = None
    html_handling: Literal["auto-trailing-slash", "force-trailing-slash", "drop-trailing-slash", "none"] = (
        "auto-trailing-slash"
    )
    not_found_handling: Literal["single-page-application", "404-page", "none"] = "none"
    run_worker_first: bool | list[str] = False


# --- end of wrangler's keys ----------------------------------------------------------------------


class WorkerConfig(msgspec.Struct, kw_only=True):
    name: str
    main: str
    compatibility_date: str
    account_id: str = "local"
    compatibility_flags: list[str] = msgspec.field(default_factory=list)
    ai: AIConfig | None = None
    vars: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    edge: EdgeConfig = msgspec.field(default_factory=EdgeConfig)
    models: ModelsConfig = msgspec.field(default_factory=ModelsConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    services: list[ServiceBindingConfig] = msgspec.field(default_factory=list)
    # wrangler's keys (the block above)
    observability: ObservabilityConfig | None = None
    kv_namespaces: list[KVNamespaceConfig] = msgspec.field(default_factory=list)
    d1_databases: list[D1DatabaseConfig] = msgspec.field(default_factory=list)
    r2_buckets: list[R2BucketConfig] = msgspec.field(default_factory=list)
    durable_objects: DurableObjectsConfig = msgspec.field(default_factory=DurableObjectsConfig)
    migrations: list[MigrationConfig] = msgspec.field(default_factory=list)
    queues: QueuesConfig = msgspec.field(default_factory=QueuesConfig)
    triggers: TriggersConfig = msgspec.field(default_factory=TriggersConfig)
    assets: AssetsConfig | None = None
    # Set by load_config: the folder relative paths are resolved against.
    base_dir: str = "."

    @property
    def main_path(self) -> Path:
        return (Path(self.base_dir) / self.main).resolve()

    @property
    def trusted_keys(self) -> list[str] | None:
        """Trusted key paths: [models] trusted_keys (resolved against the config's folder), else
        $EDGE_TRUSTED_KEYS, else the models folder's keys/*.pub; None: the engine's default store."""
        if self.models.trusted_keys:
            return [str((Path(self.base_dir) / k).resolve()) for k in self.models.trusted_keys]
        if os.environ.get("EDGE_TRUSTED_KEYS"):  # engine.verified_load.TRUSTED_KEYS_ENV reads it
            return None
        keys = self.models_dir / "keys"
        return [str(k) for k in sorted(keys.glob("*.pub"))] if keys.is_dir() else None

    @property
    def models_dir(self) -> Path:
        """[edge] models_dir (relative to the config), else $EDGE_MODELS_DIR, else the shipped models."""
        if self.edge.models_dir is not None:
            return (Path(self.base_dir) / self.edge.models_dir).resolve()
        env = os.environ.get(MODELS_DIR_ENV)
        return Path(env).resolve() if env else INSTALLED_MODELS_DIR

    @property
    def gpu_pops(self) -> list[str]:
        """[edge] pops; unset: DEFAULT_POPS with an AI binding, none (no engine loads) without."""
        if self.edge.pops is not None:
            return self.edge.pops
        return list(DEFAULT_POPS) if self.ai is not None else []

    @property
    def state_dir(self) -> Path:
        """Where the runtime keeps its database, API token and deployed scripts (never committed)."""
        return (Path(self.base_dir) / ".edge").resolve()


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _struct_in(annotation: Any) -> tuple[type | None, bool]:
    """The Struct an annotation holds (directly, in `X | None`, or as `list[X]`) and whether in a list."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation, False
    args = getattr(annotation, "__args__", None) or ()
    if getattr(annotation, "__origin__", None) is list and args:
        return _struct_in(args[0])[0], True
    for arg in args:
        found, in_list = _struct_in(arg)
        if found is not None:
            return found, in_list
    return None, False


def _unknown_keys(data: Any, struct: type, path: str = "") -> list[str]:
    """Keys in `data` that `struct` does not declare, as dotted paths (recursing into sub-structs
    and lists of them)."""
    if not isinstance(data, dict):
        return []
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    found = []
    for key, value in data.items():
        where = f"{path}{key}"
        field = fields.get(key)
        if field is None or (key == "base_dir" and struct is WorkerConfig):
            found.append(where)
            continue
        sub, in_list = _struct_in(field.type)
        if sub is None:
            continue
        if in_list and isinstance(value, list):
            for i, item in enumerate(value):
                found += _unknown_keys(item, sub, f"{where}.{i}.")
        else:
            found += _unknown_keys(value, sub, where + ".")
    return found


def _with_choices(message: str) -> str:
    """'assets.html_handling: invalid enum value 'x'' + the values that field accepts."""
    where, _, what = message.partition(": ")
    if not what.startswith("invalid enum value"):
        return message
    struct: type | None = WorkerConfig
    annotation: Any = None
    for part in where.split("."):
        if part.isdigit():
            continue
        fields = {f.encode_name: f for f in msgspec.structs.fields(struct)} if struct else {}
        if part not in fields:
            return message
        annotation = fields[part].type
        struct = _struct_in(annotation)[0]
    choices = getattr(annotation, "__args__", ())
    return f"{message}; expected one of {', '.join(map(repr, choices))}" if choices else message


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of `index` in `text`."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def strip_jsonc(text: str, source: str = "wrangler.jsonc") -> str:
    """JSONC -> JSON: comments (`//`, `/* */`) and trailing commas become spaces, so that every
    other character keeps its line and column; strings (with their escapes) are left untouched."""
    out = list(text)
    i, n = 0, len(text)
    pending_comma = None  # index of a comma outside strings, until the next significant character
    while i < n:
        c = text[i]
        if c == '"':
            pending_comma = None
            i += 1
            while i < n and text[i] != '"' and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            i += 1  # past the closing quote (an unterminated string is left to the JSON parser)
            continue
        if c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end == -1 else end
            out[i:end] = " " * (end - i)
            i = end
            continue
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end == -1:
                line, col = _position(text, i)
                raise ConfigError(
                    f"{source}: invalid JSON: unterminated /* comment at line {line}, column {col}"
                )
            for j in range(i, end + 2):
                if out[j] != "\n":
                    out[j] = " "
            i = end + 2
            continue
        if c in " \t\r\n":
            i += 1
            continue
        if c in "]}" and pending_comma is not None:
            out[pending_comma] = " "  # a trailing comma
        pending_comma = i if c == "," else None
        i += 1
    return "".join(out)


def parse_jsonc(text: str, source: str = "wrangler.jsonc") -> dict[str, Any]:
    """wrangler.json / wrangler.jsonc text (comments and trailing commas allowed in both, as in
    wrangler) -> a dict; errors give the line and column."""
    try:
        data = json.loads(strip_jsonc(text.removeprefix("\ufeff"), source))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


def _is_json(source: str) -> bool:
    return Path(source).suffix.lower() in (".json", ".jsonc")


def not_simulated(config: WorkerConfig) -> list[str]:
    """What the config declares that nothing serves yet: one line per binding."""
    found: list[str] = []
    found += [
        f"queues.producers.{i}.delivery_delay is not simulated yet; messages are ready at once "
        "unless send() passes delaySeconds"
        for i, q in enumerate(config.queues.producers)
        if q.delivery_delay
    ]
    return found


def _binding_names(config: WorkerConfig) -> list[tuple[str, str]]:
    """(key path, env name) of every binding the config declares."""
    names = [(f"vars.{k}", k) for k in config.vars]
    if config.ai is not None:
        names.append(("ai.binding", config.ai.binding))
    names += [(f"services.{i}.binding", b.binding) for i, b in enumerate(config.services)]
    names += [(f"kv_namespaces.{i}.binding", b.binding) for i, b in enumerate(config.kv_namespaces)]
    names += [(f"d1_databases.{i}.binding", b.binding) for i, b in enumerate(config.d1_databases)]
    names += [(f"r2_buckets.{i}.binding", b.binding) for i, b in enumerate(config.r2_buckets)]
    names += [
        (f"durable_objects.bindings.{i}.name", b.name) for i, b in enumerate(config.durable_objects.bindings)
    ]
    names += [(f"queues.producers.{i}.binding", b.binding) for i, b in enumerate(config.queues.producers)]
    if config.assets is not None and config.assets.binding is not None:
        names.append(("assets.binding", config.assets.binding))
    return names


def parse_config(
    text: str,
    source: str = DEFAULT_CONFIG,
    base_dir: Path | None = None,
    syntax: Literal["toml", "json"] | None = None,
) -> WorkerConfig:
    """Config text -> WorkerConfig. `syntax` defaults to the source's extension: .json and .jsonc
    are JSONC (as wrangler reads both), anything else TOML."""
    if syntax is None:
        syntax = "json" if _is_json(source) else "toml"
    if syntax == "json":
        data = parse_jsonc(text, source)
        data.pop("$schema", None)  # editors' schema hint, as wrangler's templates write it
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    for key in _unknown_keys(data, WorkerConfig):
        log.warning("%s: unknown key %r is ignored", source, key)
    data.pop("base_dir", None)
    try:
        config = msgspec.convert(data, WorkerConfig, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_with_choices(describe(exc))}") from None
    if not _DATE.match(config.compatibility_date):
        raise ConfigError(
            f"{source}: compatibility_date: expected YYYY-MM-DD, got {config.compatibility_date!r}"
        )
    seen: dict[str, str] = {}  # every name in env: an identifier, bound once
    for where, name in _binding_names(config):
        if not where.startswith("vars.") and not name.isidentifier():
            raise ConfigError(f"{source}: {where}: {name!r} is not a valid Python identifier")
        if name in seen:
            raise ConfigError(f"{source}: {where}: {name!r} is already bound by {seen[name]}")
        seen[name] = where
    for line in not_simulated(config):
        log.warning("%s: %s", source, line)
    for i, b in enumerate(config.durable_objects.bindings):
        if not b.class_name.isidentifier():
            raise ConfigError(
                f"{source}: durable_objects.bindings.{i}.class_name: {b.class_name!r} "
                "is not a Python class name"
            )
    try:
        worker_limits.validate(msgspec.structs.asdict(config.limits), "limits")
    except worker_limits.LimitError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    for i, entry in enumerate(config.edge.fetch_allow):
        try:
            parse_host_port(entry)
        except ValueError as exc:
            raise ConfigError(f"{source}: edge.fetch_allow.{i}: {exc}") from None
    if base_dir is not None:
        config = msgspec.structs.replace(config, base_dir=str(base_dir))
    return config


def find_config(folder: Path | None = None) -> Path | None:
    """The config in `folder` (default: the current one) by CONFIG_NAMES' order, or None."""
    folder = Path.cwd() if folder is None else folder
    found = [folder / name for name in CONFIG_NAMES if (folder / name).is_file()]
    if len(found) > 1:
        log.warning("%s: using %s; %s ignored", folder, found[0].name, ", ".join(p.name for p in found[1:]))
    return found[0] if found else None


def load_config(path: str | Path | None = None) -> WorkerConfig:
    """Read the config at `path`; None: the first of CONFIG_NAMES in the current folder."""
    if path is None:
        path = find_config()
        if path is None:
            raise ConfigError(
                f"no config in {Path.cwd()}: create one of {', '.join(CONFIG_NAMES)}, or pass --config PATH"
            )
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: not found; pass --config PATH or create one of {', '.join(CONFIG_NAMES)}"
        ) from None
    config = parse_config(text, source=str(path), base_dir=path.resolve().parent)
    if not config.main_path.is_file():
        raise ConfigError(f"{path}: main: {config.main!r} does not exist (looked for {config.main_path})")
    return config


def check_against_topology(config: WorkerConfig, topology: Topology) -> None:
    """The config's values that only the topology can judge (edge.client_location; edge.pops is
    checked where the GPU PoPs are built), as a ConfigError naming the key and what is accepted."""
    from edge_sim.topology import TopologyError

    try:
        topology.resolve_location(config.edge.client_location)
    except TopologyError as exc:
        raise ConfigError(f"edge.client_location: {exc}") from None
