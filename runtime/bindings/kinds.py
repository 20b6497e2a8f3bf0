"""The binding kinds, listed once (Miniflare's PLUGINS): adding a kind is its module here (which
names its SDK client), the client in workers/ and a line in KINDS. Everything that handles bindings
by kind loops over this list: the config's tables (runtime.control.config reads them through the
provider registered below, since control sits under bindings), binding_refs, the stores, the deploy
upload's fields and `edge deploy`'s payload, the worker specs of the dev worker and of deployed
versions, and the SDK clients the isolate builds (sdk_clients)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from runtime.bindings.ai_search import INSTANCE as AI_SEARCH
from runtime.bindings.ai_search import NAMESPACE as AI_SEARCH_NAMESPACE
from runtime.bindings.d1 import KIND as D1
from runtime.bindings.kind import BindingKind, BindingRef
from runtime.bindings.kv import KIND as KV
from runtime.bindings.queues import KIND as QUEUE
from runtime.bindings.r2 import KIND as R2
from runtime.bindings.ratelimit import KIND as RATELIMIT
from runtime.bindings.vectorize import KIND as VECTORIZE
from runtime.bindings.workflows import KIND as WORKFLOW
from runtime.control import config_schema

KINDS: list[BindingKind] = [KV, D1, R2, QUEUE, RATELIMIT, WORKFLOW, VECTORIZE, AI_SEARCH_NAMESPACE, AI_SEARCH]


def kind(name: str) -> BindingKind | None:
    return next((k for k in KINDS if k.name == name), None)


def sdk_clients(refs: Mapping[str, BindingRef]) -> dict[str, str]:
    """Env name -> the SDK client the isolate builds for it ("workers.kv:KVNamespace")."""
    clients = {k.name: k.client for k in KINDS}
    return {name: clients[ref.kind] for name, ref in refs.items()}


def at(data: Any, path: str) -> Any:
    """The value at a dotted key path of nested dicts (`queues.producers`), or None."""
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def tables_of(stored: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Each kind's entries in a nested config dict (what a deployed version stores), by config key."""
    return {k.config_key: list(at(stored, k.config_key) or []) for k in KINDS}


def binding_refs(tables: Mapping[str, Iterable[Any]], where: str = "") -> dict[str, BindingRef]:
    """Env name -> BindingRef for each kind's entries (config structs or stored dicts), by config
    key; ValueError naming the entry whose id is missing. Names are checked where the config is
    read (runtime.control.config.check_env_names)."""
    refs: dict[str, BindingRef] = {}
    for k in KINDS:
        for i, entry in enumerate(tables.get(k.config_key, ())):
            ref = k.ref(f"{where}{k.config_key}.{i}", entry)
            refs[k.env_name(entry)] = ref
    return refs


def nested_fields(lists: Mapping[str, type], name: str, **struct: Any) -> list[tuple[str, Any, Any]]:
    """msgspec.defstruct fields for lists of entry structs by dotted key (`queues.producers`), each
    defaulting to []; a dotted key becomes a sub-struct (its own `struct` options) holding the list."""
    tree: dict[str, Any] = {}
    for path, entry in lists.items():
        *parents, leaf = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = entry

    def build(node: dict[str, Any], prefix: str) -> list[tuple[str, Any, Any]]:
        out: list[tuple[str, Any, Any]] = []
        for key, value in node.items():
            if isinstance(value, dict):
                sub_name = prefix + key.title().replace("_", "")
                sub = msgspec.defstruct(sub_name, build(value, sub_name), **struct)
                out.append((key, sub, msgspec.field(default_factory=sub)))
            else:
                out.append((key, list[value], msgspec.field(default_factory=list)))
        return out

    return build(tree, name)


def upload_fields(extra: Mapping[str, type] = {}) -> list[tuple[str, Any, Any]]:  # noqa: B006 - read only
    """The deploy upload's fields for every kind's list (and `extra` lists by dotted key)."""
    lists = {k.config_key: k.upload for k in KINDS} | dict(extra)
    return nested_fields(lists, "Deploy", forbid_unknown_fields=True)


def upload_payload(tables: Mapping[str, Iterable[Any]]) -> dict[str, Any]:
    """Each kind's config entries as the deploy upload carries them, nested by config key."""
    out: dict[str, Any] = {}
    for k in KINDS:
        *parents, leaf = k.config_key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = [k.upload_entry(e) for e in tables.get(k.config_key, ())]
    return out


# the wrangler config's binding tables, read at each parse so that the list above is the one truth
config_schema.provide_binding_tables(lambda: {k.config_key: k.config for k in KINDS})
