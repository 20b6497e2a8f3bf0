"""The worker's config, read once into typed structs: wrangler.json, wrangler.jsonc or
wrangler.toml (wrangler's own files and keys), or wrangler-like.toml.

Unknown keys warn (naming the key); wrong types fail with the key's path; malformed TOML or JSON
fails with the line and column. Relative paths are resolved against the config file's folder.
Our own tables, `edge` and `models`, are the same in every format.
"""

from __future__ import annotations

import logging
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from runtime.control import limits as worker_limits
from runtime.control.accounts import AccountError, AccountSettings, check_name
from runtime.control.addresses import parse_host_port, parse_origin
from runtime.control.config_schema import (
    DEFAULT_POPS,
    INSTALLED_MODELS_DIR,
    MODELS_DIR_ENV,
    AccountConfig,
    AIConfig,
    AIGatewayConfig,
    AssetsConfig,
    ConfigError,
    DurableObjectBindingConfig,
    DurableObjectsConfig,
    EdgeConfig,
    LimitsConfig,
    MigrationConfig,
    ModelsConfig,
    NetworkConfig,
    ObservabilityConfig,
    ObservabilityLogsConfig,
    QueueConsumerConfig,
    QueuesConfig,
    RenamedClassConfig,
    ServiceBindingConfig,
    TransferredClassConfig,
    TriggersConfig,
    WorkerConfig,
    binding_tables,
)
from runtime.control.jsonc import parse_jsonc, strip_jsonc
from runtime.control.validation import describe
from workers.binding_values import close_name

if TYPE_CHECKING:
    from edge_sim.topology import Topology

log = logging.getLogger("edge.config")

__all__ = [  # the schema (runtime.control.config_schema) and JSONC reading (runtime.control.jsonc) included
    "AccountConfig",
    "AIConfig",
    "AssetsConfig",
    "CONFIG_NAMES",
    "ConfigError",
    "DEFAULT_CONFIG",
    "DEFAULT_POPS",
    "DurableObjectBindingConfig",
    "DurableObjectsConfig",
    "EdgeConfig",
    "INSTALLED_MODELS_DIR",
    "LimitsConfig",
    "MODELS_DIR_ENV",
    "MigrationConfig",
    "ModelsConfig",
    "NetworkConfig",
    "ObservabilityConfig",
    "ObservabilityLogsConfig",
    "QueueConsumerConfig",
    "QueuesConfig",
    "RenamedClassConfig",
    "ServiceBindingConfig",
    "TransferredClassConfig",
    "TriggersConfig",
    "WorkerConfig",
    "account_settings",
    "check_against_topology",
    "check_env_names",
    "find_config",
    "load_config",
    "not_simulated",
    "parse_config",
    "parse_jsonc",
    "strip_jsonc",
]

DEFAULT_CONFIG = "wrangler-like.toml"
# What `edge` looks for in the current folder when no --config is given, first found wins:
# wrangler's own order (packages/wrangler/src/config/config-helpers.ts, findWranglerConfig:
# wrangler.json, then wrangler.jsonc, then wrangler.toml), then ours.
CONFIG_NAMES = ("wrangler.json", "wrangler.jsonc", "wrangler.toml", DEFAULT_CONFIG)

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_SET_BY_US = ("base_dir", "bindings")  # WorkerConfig's fields that no config may set


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


def _unknown_keys(
    data: Any, struct: type, path: str = "", tables: Iterable[str] = ()
) -> list[tuple[str, str | None]]:
    """Keys in `data` that `struct` does not declare, as (dotted path, the declared key it is
    closest to, or None), recursing into sub-structs and lists of them. `tables`: the binding
    kinds' config keys ("kv_namespaces", "queues.producers"), read apart but close matches too."""
    if not isinstance(data, dict):
        return []
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    found: list[tuple[str, str | None]] = []
    for key, value in data.items():
        where = f"{path}{key}"
        field = fields.get(key)
        if field is None or (key in _SET_BY_US and struct is WorkerConfig):
            # a misspelt key is otherwise ignored in silence until what it meant is missing
            known = [k for k in fields if not (k in _SET_BY_US and struct is WorkerConfig)]
            known += [t[len(path) :].split(".")[0] for t in tables if t.startswith(path)]
            found.append((where, close_name(key, known)))
            continue
        sub, in_list = _struct_in(field.type)
        if sub is None:
            continue
        if getattr(field.type, "__origin__", None) is dict and isinstance(value, dict):  # tables by name
            for name, item in value.items():
                found += _unknown_keys(item, sub, f"{where}.{name}.", tables)
            continue
        if in_list and isinstance(value, list):
            for i, item in enumerate(value):
                found += _unknown_keys(item, sub, f"{where}.{i}.", tables)
        else:
            found += _unknown_keys(value, sub, where + ".", tables)
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


def _is_json(source: str) -> bool:
    return Path(source).suffix.lower() in (".json", ".jsonc")


def not_simulated(config: WorkerConfig) -> list[str]:
    """What the config declares that nothing serves yet: one line per binding (an entry whose
    struct has a not_simulated() says so itself)."""
    found: list[str] = []
    for key, entries in config.bindings.items():
        for i, entry in enumerate(entries):
            line = entry.not_simulated() if hasattr(entry, "not_simulated") else None
            if line:
                found.append(f"{key}.{i}.{line}")
    return found


def _env_key(entry: msgspec.Struct) -> str:
    """The key an entry's env name has in the config (`binding`; a kind may rename it: `name`)."""
    return next((f.encode_name for f in msgspec.structs.fields(entry) if f.name == "binding"), "binding")


def _binding_names(config: WorkerConfig) -> list[tuple[str, str]]:
    """(key path, env name) of every binding the config declares but its vars."""
    names = [("ai.binding", config.ai.binding)] if config.ai is not None else []
    names += [(f"services.{i}.binding", b.binding) for i, b in enumerate(config.services)]
    for key, entries in config.bindings.items():
        names += [(f"{key}.{i}.{_env_key(b)}", b.binding) for i, b in enumerate(entries)]
    names += [
        (f"durable_objects.bindings.{i}.name", b.name) for i, b in enumerate(config.durable_objects.bindings)
    ]
    if config.assets is not None and config.assets.binding is not None:
        names.append(("assets.binding", config.assets.binding))
    return names


def check_env_names(vars: Any, bound: list[tuple[str, str]], where: str = "") -> None:
    """The one check of a worker's env names, for the config and the deploy upload alike: every
    binding (`bound`: key path, name) is an identifier, and no name is bound twice, nor shared
    with a var (`vars`: their names). ValueError naming both key paths otherwise."""
    seen: dict[str, str] = {name: f"{where}vars.{name}" for name in vars}
    for path, name in bound:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{where}{path}: {name!r} is not a valid Python identifier")
        if name in seen:
            raise ValueError(f"{where}{path}: {name!r} is already bound by {seen[name]}")
        seen[name] = f"{where}{path}"


def _read_path(data: Any, path: str) -> Any:
    """The value at a dotted key path of nested dicts, or None."""
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _read_tables(data: dict[str, Any], tables: dict[str, type], source: str) -> dict[str, list[Any]]:
    """Each binding kind's list (config key -> entry struct), typed; ConfigError naming the path."""
    read: dict[str, list[Any]] = {}
    for key, struct in tables.items():
        value = _read_path(data, key)
        try:
            read[key] = msgspec.convert(value if value is not None else [], list[struct], strict=True)
        except msgspec.ValidationError as exc:
            at = str(exc).rsplit(" - at `$", 1)
            message = f"{at[0]} - at `$.{key}{at[1]}" if len(at) == 2 else f"{exc} - at `$.{key}`"
            raise ConfigError(f"{source}: {describe(msgspec.ValidationError(message))}") from None
    return read


def _without(data: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """`data` with the dotted key paths left out (the dicts along them copied, never changed)."""
    out = dict(data)
    for path in paths:
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                break
            node[part] = node = dict(node[part])
        else:
            node.pop(leaf, None)
    return out


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
        except RecursionError:
            raise ConfigError(f"{source}: invalid TOML: arrays or tables nested too deep") from None
    _check_account_tables(data, source)
    tables = binding_tables()
    unknown = _unknown_keys(_without(data, list(tables)), WorkerConfig, tables=tables)
    for key, struct in tables.items():
        entries = _read_path(data, key)
        if isinstance(entries, list):
            for i, item in enumerate(entries):
                unknown += _unknown_keys(item, struct, f"{key}.{i}.")
    for key, close in unknown:
        hint = f"; did you mean {close!r}?" if close else ""
        log.warning("%s: unknown key %r is ignored%s", source, key, hint)
    for key in _SET_BY_US:
        data.pop(key, None)
    try:
        config = msgspec.convert(data, WorkerConfig, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_with_choices(describe(exc))}") from None
    config = msgspec.structs.replace(config, bindings=_read_tables(data, tables, source))
    if not _DATE.match(config.compatibility_date):
        raise ConfigError(
            f"{source}: compatibility_date: expected YYYY-MM-DD, got {config.compatibility_date!r}"
        )
    try:  # every name in env: an identifier, bound once
        check_env_names(config.vars, _binding_names(config))
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
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
    if not 0.1 <= config.edge.hibernate_s <= 3600:
        raise ConfigError(
            f"{source}: edge.hibernate_s: {config.edge.hibernate_s} is not between 0.1 and 3600 s"
        )
    for gid, gw in config.edge.ai_gateways.items():
        where = f"{source}: edge.ai_gateways.{gid}"
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", gid):
            raise ConfigError(f"{where}: a gateway id is 1 to 64 letters, digits, '-' or '_'")
        if gw.cache_ttl is not None and not 0 <= gw.cache_ttl <= 30 * 24 * 3600:
            raise ConfigError(f"{where}.cache_ttl: give 0 to 2592000 seconds (30 days)")
        if gw.rate_limit is not None and not 1 <= gw.rate_limit <= 1_000_000:
            raise ConfigError(f"{where}.rate_limit: give 1 to 1000000 requests per period")
        if not 1 <= gw.rate_limit_period_s <= 86400:
            raise ConfigError(f"{where}.rate_limit_period_s: give 1 to 86400 seconds")
        if gw.rate_limit_technique not in ("sliding", "fixed"):
            raise ConfigError(f'{where}.rate_limit_technique: give "sliding" or "fixed"')
    for i, entry in enumerate(config.edge.fetch_allow):
        try:
            parse_host_port(entry)
        except ValueError as exc:
            raise ConfigError(f"{source}: edge.fetch_allow.{i}: {exc}") from None
    if config.edge.public_url is not None:
        try:
            parse_origin(config.edge.public_url)
        except ValueError as exc:
            raise ConfigError(f"{source}: edge.public_url: {exc}") from None
    for name in config.edge.accounts:
        try:
            account_settings(config, name)
        except AccountError as exc:
            raise ConfigError(f"{source}: edge.accounts.{name}: {exc}") from None
    if base_dir is not None:
        config = msgspec.structs.replace(config, base_dir=str(base_dir))
    return config


def _check_account_tables(data: dict[str, Any], source: str) -> None:
    """[edge.accounts.NAME] and [edge.ai_gateways.ID] tables: unknown keys refused (a misspelt limit
    must not go unnoticed) and each table typed, the errors naming the table (msgspec's paths do not)."""
    edge = data.get("edge")
    for key, kind in (("accounts", AccountConfig), ("ai_gateways", AIGatewayConfig)):
        tables = edge.get(key) if isinstance(edge, dict) else None
        if not isinstance(tables, dict):
            continue  # absent, or the wrong type: the whole config's conversion says so
        keys = ", ".join(kind.__struct_fields__)
        for name, table in tables.items():
            where = f"{source}: edge.{key}.{name}"
            if not isinstance(table, dict):
                raise ConfigError(f"{where}: expected a table of {keys}")
            unknown = sorted(set(table) - set(kind.__struct_fields__))
            if unknown:
                raise ConfigError(
                    f"{where}: unknown key {', '.join(map(repr, unknown))}; the keys are {keys}"
                )
            try:
                msgspec.convert(table, kind, strict=True)
            except msgspec.ValidationError as exc:
                raise ConfigError(f"{where}.{describe(exc)}") from None


def account_settings(config: WorkerConfig, name: str) -> AccountSettings:
    """[edge.accounts.NAME] as checked settings; AccountError says what to change."""
    check_name(name)
    return AccountSettings(**msgspec.structs.asdict(config.edge.accounts[name])).checked()


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
