"""The one interface every binding kind implements, as Miniflare's `Plugin`: what a kind module
(kv.py, d1.py, r2.py, queues.py) declares next to its store, and what the rest of the runtime
reads instead of naming a kind. The list of kinds is runtime/bindings/kinds.py; the SDK client a
worker sees is the kind's pair in workers/, named by `client` (the isolate imports it from there):
adding a kind is its module here, its client in workers/ and its line in KINDS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

ID_BYTES = 256


class BindingRef(msgspec.Struct, frozen=True):
    """What a binding name stands for: its kind and the id of the resource (a KV namespace id, a
    D1 database id or name, an R2 bucket, a queue's name), under the worker's account."""

    kind: str
    id: str


class Store(Protocol):
    """A kind's store: every account's resources of that kind under the state dir."""

    def call(self, account: str, ident: str, method: str, args: list, kwargs: dict) -> Any: ...

    def close(self) -> None: ...


def field(entry: Any, name: str) -> Any:
    """A field of a config entry: a struct (the wrangler config) or the dict a deployed version stores."""
    return entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)


@dataclass(frozen=True)
class BindingKind:
    """One binding kind. Every entry struct of its config list holds its env name in the attribute
    `binding`, under the key `env_key` as wrangler writes it (`binding`; `name` for ratelimits:
    a msgspec rename)."""

    name: str  # BindingRef.kind: "kv"
    config_key: str  # wrangler's key for its list, dotted when nested: "kv_namespaces", "queues.producers"
    config: type  # one entry of that list in the wrangler config (a msgspec Struct)
    upload: type  # one entry in the deploy upload (a msgspec Struct, forbid_unknown_fields)
    id_fields: tuple[str, ...]  # the fields that name the resource, the first one set wins
    open: Callable[[Path, float], Store]  # its store under the state dir (and D1's statement time)
    client: str  # the SDK class a worker sees, "module:Class" in workers/: "workers.kv:KVNamespace"
    one_call_at_a_time: bool = False  # calls to one resource take turns (D1: one statement at a time)
    env_key: str = "binding"  # the entry's key for its env name, as wrangler writes it
    ident: Callable[[Any], Any] | None = None  # the resource id when more than one field makes it

    def env_name(self, entry: Any) -> Any:
        """The env name an entry binds (a config struct, or the dict a deployed version stores)."""
        return entry.get(self.env_key) if isinstance(entry, dict) else entry.binding

    def ref(self, where: str, entry: Any) -> BindingRef:
        """The BindingRef an entry stands for; ValueError naming `where` when no id is given."""
        if self.ident is not None:
            ident = self.ident(entry)
        else:
            ident = next((v for v in map(lambda f: field(entry, f), self.id_fields) if v), None)
        if not isinstance(ident, str) or len(ident.encode("utf-8", "replace")) > ID_BYTES:
            raise ValueError(
                f"{where}: {self.env_name(entry)} needs an id (a non-empty string of at most "
                f"{ID_BYTES} bytes)"
            )
        return BindingRef(self.name, ident)

    def upload_entry(self, entry: Any) -> dict[str, Any]:
        """A config entry as the deploy upload carries it: the upload struct's fields, by the names
        they take on the wire."""
        return {
            f.encode_name: msgspec.to_builtins(field(entry, f.name))
            for f in msgspec.structs.fields(self.upload)
        }
