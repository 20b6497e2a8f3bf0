"""The config's schema: wrangler's keys (the Workers' own names and shapes) and our own tables,
`edge`, `models` and `limits`, as typed structs. runtime.control.config reads a file into them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from runtime.control import limits as worker_limits
from runtime.control.rate_limit import DEFAULT_RPM

DEFAULT_POPS = ["ICN", "FRA", "IAD"]
MODELS_DIR_ENV = "EDGE_MODELS_DIR"
# The shipped miniatures and catalog: the repository's models/ in a checkout (the editable install,
# PYTHONPATH); a wheel installs that folder's data as runtime/shipped_models/ (setup.py).
_SHIPPED_MODELS = Path(__file__).resolve().parent.parent / "shipped_models"
INSTALLED_MODELS_DIR = _SHIPPED_MODELS if _SHIPPED_MODELS.is_dir() else _SHIPPED_MODELS.parents[1] / "models"


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


class AccountConfig(msgspec.Struct, forbid_unknown_fields=True):
    """[edge.accounts.NAME]: an account's settings (runtime.control.accounts), applied to the state at
    start; a key left out takes its default."""

    rpm: int = DEFAULT_RPM  # requests per minute per model
    tpm: int | None = None  # tokens per minute per model (prompt + completion); unset: unlimited
    weight: float = 1.0  # fair-share weight
    kv_share: float = 1.0  # fraction of a PoP's KV blocks the account may hold


class AIGatewayConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """[edge.ai_gateways.ID]: the settings of every account's AI Gateway of that id (a gateway not
    listed is made on first use with the defaults; runtime.ai.gateway)."""

    cache_ttl: int | None = None  # seconds a call without its own cacheTtl is cached (None: not cached)
    collect_logs: bool = True  # a call without its own collectLog is logged
    rate_limit: int | None = None  # requests per rate_limit_period_s, per account (None: unlimited)
    rate_limit_period_s: float = 60.0
    rate_limit_technique: str = "sliding"  # or "fixed": windows aligned to the period, as Cloudflare's


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
    # The origin clients reach the runtime at (https://edge.example.com), which URLs handed to a
    # worker start with (an AI Gateway's getUrl); unset: the address `edge dev` listens on. Never
    # taken from a request's Host header, which any client writes.
    public_url: str | None = None
    network: NetworkConfig = msgspec.field(default_factory=NetworkConfig)
    # Accounts by name, each with its settings; the config wins over the stored ones at start.
    accounts: dict[str, AccountConfig] = msgspec.field(default_factory=dict)
    # true: a Cloudflare model name the catalog neither ships nor aliases is 5007, instead of being
    # served by the closest stand-in (runtime.ai.cloudflare_names)
    strict_models: bool = False
    # seconds a Durable Object whose only open WebSockets are accepted with ctx.acceptWebSocket
    # stays idle before it hibernates (its isolate stopped; the runtime keeps the sockets)
    hibernate_s: float = 10.0
    ai_gateways: dict[str, AIGatewayConfig] = msgspec.field(default_factory=dict)


class ModelsConfig(msgspec.Struct):
    # Public keys (PEM files, relative to the config) whose signatures make a model servable;
    # empty = the project's own trust store, models/keys/*.pub.
    trusted_keys: list[str] = msgspec.field(default_factory=list)
    allow_unsigned: bool = False  # serve models without a manifest (with a warning)


class LimitsConfig(msgspec.Struct):
    # Ranges and defaults live in runtime/control/limits.py; parse_config checks these against them.
    cpu_ms: int = worker_limits.DEFAULTS["cpu_ms"]  # CPU time per request (Workers' default on paid plans)
    memory_mb: int = worker_limits.DEFAULTS["memory_mb"]  # per isolate, as on Workers
    subrequests: int = worker_limits.DEFAULTS["subrequests"]  # fetch() calls per request


class ServiceBindingConfig(msgspec.Struct):
    binding: str  # the name in env
    service: str  # another worker of the same account


# --- the binding kinds' tables ---------------------------------------------------------------------
# Which keys hold binding kinds' lists, and the struct of one entry, are the kinds' own
# (runtime.bindings.kinds.KINDS, which sits above control and registers itself here on import):
# WorkerConfig.bindings holds what parse_config read from them.
_binding_tables: Callable[[], dict[str, type]] | None = None


def provide_binding_tables(provider: Callable[[], dict[str, type]]) -> None:
    global _binding_tables
    _binding_tables = provider


def binding_tables() -> dict[str, type]:
    """Config key (dotted when nested: "queues.producers") -> the struct of one entry of its list."""
    if _binding_tables is None:
        raise RuntimeError("the binding kinds are not loaded: import runtime.bindings before a config")
    return _binding_tables()


# --- wrangler's keys -----------------------------------------------------------------------------
# The tables wrangler.json/jsonc/toml declare, named exactly as wrangler's keys (its
# packages/wrangler/src/config/environment.ts). Parsed and type-checked here (the binding kinds'
# lists by their own structs, above); what serves them lives elsewhere. Migrations are accepted as
# wrangler writes them; locally every bound class simply exists (its storage is created on first use).


# [observability] locally: `enabled = false` (or logs.enabled) keeps the workers' console lines out
# of edge dev's terminal (edge tail still has them); head_sampling_rate (logs' wins) is the fraction
# of events whose lines show there (runtime.isolate.console.configure). invocation_logs is accepted.
SamplingRate = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class ObservabilityLogsConfig(msgspec.Struct, kw_only=True):
    enabled: bool | None = None
    head_sampling_rate: SamplingRate | None = None
    invocation_logs: bool | None = None


class ObservabilityConfig(msgspec.Struct, kw_only=True):
    enabled: bool | None = None
    head_sampling_rate: SamplingRate | None = None
    logs: ObservabilityLogsConfig | None = None


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


class QueueConsumerConfig(msgspec.Struct, kw_only=True):
    queue: str
    max_batch_size: int | None = None
    max_batch_timeout: float | None = None  # seconds
    max_retries: int | None = None
    dead_letter_queue: str | None = None
    max_concurrency: int | None = None
    retry_delay: int | None = None


class QueuesConfig(msgspec.Struct, kw_only=True):
    # queues.producers is a binding kind's list (runtime.bindings.queues), read as the others are
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
    durable_objects: DurableObjectsConfig = msgspec.field(default_factory=DurableObjectsConfig)
    migrations: list[MigrationConfig] = msgspec.field(default_factory=list)
    queues: QueuesConfig = msgspec.field(default_factory=QueuesConfig)
    triggers: TriggersConfig = msgspec.field(default_factory=TriggersConfig)
    assets: AssetsConfig | None = None
    # Set by parse_config: each binding kind's entries by its config key (binding_tables()), e.g.
    # bindings["kv_namespaces"], bindings["queues.producers"]; the config's own key is refused.
    bindings: dict[str, list[Any]] = msgspec.field(default_factory=dict)
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
        if os.environ.get("EDGE_TRUSTED_KEYS"):  # engine.load.verified_load.TRUSTED_KEYS_ENV reads it
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
        """[edge] pops; unset: DEFAULT_POPS with an AI binding or an AI Search one (its answers
        are generated), none (no engine loads) without."""
        if self.edge.pops is not None:
            return self.edge.pops
        searches = ("ai_search", "ai_search_namespaces")
        answers = self.ai is not None or any(self.bindings.get(k) for k in searches)
        return list(DEFAULT_POPS) if answers else []

    @property
    def state_dir(self) -> Path:
        """Where the runtime keeps its database, API token and deployed scripts (never committed)."""
        return (Path(self.base_dir) / ".edge").resolve()
