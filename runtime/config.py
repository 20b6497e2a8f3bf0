"""wrangler-like.toml, read once into typed structs.

Unknown keys warn (naming the key); wrong types fail with the key's path; malformed TOML fails
with the line and column. Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from runtime import limits as worker_limits
from runtime.fetch_guard import parse_host_port
from runtime.validation import describe

if TYPE_CHECKING:
    from edge_sim.topology import Topology

log = logging.getLogger("edge.config")

DEFAULT_CONFIG = "wrangler-like.toml"


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
    # GPU PoPs that run an in-process engine in this session (IATA codes of the topology).
    pops: list[str] = msgspec.field(default_factory=lambda: ["ICN", "FRA", "IAD"])
    # Catalog names every GPU PoP serves; empty = every model in the catalog.
    models: list[str] = msgspec.field(default_factory=list)
    models_dir: str = "models"
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


class WorkerConfig(msgspec.Struct, kw_only=True):
    name: str
    main: str
    compatibility_date: str
    account_id: str = "local"
    ai: AIConfig | None = None
    vars: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    edge: EdgeConfig = msgspec.field(default_factory=EdgeConfig)
    models: ModelsConfig = msgspec.field(default_factory=ModelsConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    services: list[ServiceBindingConfig] = msgspec.field(default_factory=list)
    # Set by load_config: the folder relative paths are resolved against.
    base_dir: str = "."

    @property
    def main_path(self) -> Path:
        return (Path(self.base_dir) / self.main).resolve()

    @property
    def trusted_keys(self) -> list[str] | None:
        """Trusted key paths resolved against the config's folder (None: the default store)."""
        if not self.models.trusted_keys:
            return None
        return [str((Path(self.base_dir) / k).resolve()) for k in self.models.trusted_keys]

    @property
    def models_dir(self) -> Path:
        return (Path(self.base_dir) / self.edge.models_dir).resolve()

    @property
    def state_dir(self) -> Path:
        """Where the runtime keeps its database, API token and deployed scripts (never committed)."""
        return (Path(self.base_dir) / ".edge").resolve()


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _unknown_keys(data: Any, struct: type, path: str = "") -> list[str]:
    """Keys in `data` that `struct` does not declare, as dotted paths (recursing into sub-structs)."""
    if not isinstance(data, dict):
        return []
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    found = []
    for key, value in data.items():
        where = f"{path}{key}"
        field = fields.get(key)
        if field is None or key == "base_dir":
            found.append(where)
            continue
        sub = field.type
        if isinstance(sub, type) and issubclass(sub, msgspec.Struct):
            found += _unknown_keys(value, sub, where + ".")
        elif getattr(sub, "__args__", None):
            structs = [a for a in sub.__args__ if isinstance(a, type) and issubclass(a, msgspec.Struct)]
            if structs:
                found += _unknown_keys(value, structs[0], where + ".")
    return found


def parse_config(text: str, source: str = DEFAULT_CONFIG, base_dir: Path | None = None) -> WorkerConfig:
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
        raise ConfigError(f"{source}: {describe(exc)}") from None
    if not _DATE.match(config.compatibility_date):
        raise ConfigError(
            f"{source}: compatibility_date: expected YYYY-MM-DD, got {config.compatibility_date!r}"
        )
    for i, svc in enumerate(config.services):
        if not svc.binding.isidentifier():
            raise ConfigError(
                f"{source}: services.{i}.binding: {svc.binding!r} is not a valid Python identifier"
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
    if config.ai is not None and not config.ai.binding.isidentifier():
        raise ConfigError(f"{source}: ai.binding: {config.ai.binding!r} is not a valid Python identifier")
    if base_dir is not None:
        config = msgspec.structs.replace(config, base_dir=str(base_dir))
    return config


def load_config(path: str | Path = DEFAULT_CONFIG) -> WorkerConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found; pass --config PATH or create {DEFAULT_CONFIG}") from None
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
