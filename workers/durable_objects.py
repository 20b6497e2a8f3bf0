"""Durable Objects as a worker sees them: `env.NS` (a namespace), its ids and stubs, and an
object's `ctx` (`self.ctx.id`, `self.ctx.storage`).

    stub = env.COUNTER.getByName("a")       # or env.COUNTER.get(env.COUNTER.idFromName("a"))
    n = await stub.increment(2)             # RPC: runs Counter.increment in the object's isolate
    r = await stub.fetch("https://x/path")  # the object's fetch handler

Ids are Cloudflare-shaped: 64 hex characters. The first 48 are the id's own (a hash of the name,
or random for newUniqueId), the last 16 a hash of them with the namespace's key, so that
idFromString refuses an id of another namespace, as Cloudflare's does. The runtime checks every
id again: nothing here is trusted by it.

The storage lives in the runtime, not in the isolate: `storage.sql.exec(...)` is synchronous as
on Cloudflare (it blocks on a channel of its own while the runtime runs the statement), the rest
of `storage` is awaited as on Cloudflare; `blockConcurrencyWhile` only awaits its callback (calls
to one object already run one at a time).

This package runs inside the isolate and imports nothing of the runtime's.
"""

from __future__ import annotations

import builtins
import hashlib
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from workers.rpc_values import check_rpc_value
from workers.websocket import accept_hibernatable, forwarded, hibernatable

ID_CHARS = 64
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

# (binding, id, method, args, kwargs) -> result: carried to the runtime as ipc.ObjectCall
ObjectTransport = Callable[[str, str, str, list, dict], Awaitable[Any]]
# (method, args, kwargs) -> result: the object's own storage, carried as ipc.BindingCall
StorageTransport = Callable[[str, list, dict], Awaitable[Any]]
SyncStorageTransport = Callable[[str, list, dict], Any]

_REMOTE_ERRORS = {
    name: getattr(builtins, name)
    for name in ("TypeError", "ValueError", "KeyError", "IndexError", "LookupError", "RuntimeError",
                 "ZeroDivisionError", "AssertionError", "NotImplementedError", "PermissionError")
}  # fmt: skip


class DurableObjectError(Exception):
    """An RPC call failed in the object (its exception's type was not a builtin one) or the runtime
    refused it; the message is "Type: message"."""


def remote_error(error_type: str, message: str) -> Exception:
    """The exception a failed call raises in the caller: the object's builtin exception type
    again (ValueError stays ValueError), else DurableObjectError."""
    if error_type == "RangeError":
        return ValueError(message)
    cls = _REMOTE_ERRORS.get(error_type)
    return cls(message) if cls is not None else DurableObjectError(message)


# --- ids -------------------------------------------------------------------------------------------


def _tag(namespace_key: str, own: str) -> str:
    return hashlib.sha256(f"edge-do-id\0{namespace_key}\0{own}".encode()).hexdigest()[:16]


def id_from_name(namespace_key: str, name: str) -> str:
    """The id `name` always has in the namespace: the same name, the same object."""
    own = hashlib.sha256(f"edge-do-name\0{namespace_key}\0{name}".encode("utf-8", "surrogatepass"))
    head = own.hexdigest()[:48]
    return head + _tag(namespace_key, head)


def new_unique_id(namespace_key: str) -> str:
    head = secrets.token_hex(24)
    return head + _tag(namespace_key, head)


def valid_id(namespace_key: str, value: Any) -> bool:
    """`value` is an id of this namespace (64 lowercase hex characters, its tag matching)."""
    return (
        isinstance(value, str) and bool(_HEX64.match(value)) and value[48:] == _tag(namespace_key, value[:48])
    )


class DurableObjectId:
    """An object's id: `str(id)` / `id.toString()` is its 64 hex characters; `id.name` the name
    it was made from (None for newUniqueId / idFromString)."""

    def __init__(self, hex_id: str, name: str | None = None):
        self._hex, self.name = hex_id, name

    def toString(self) -> str:  # noqa: N802 - Cloudflare's name
        return self._hex

    to_string = toString

    def equals(self, other: Any) -> bool:
        return isinstance(other, DurableObjectId) and other._hex == self._hex

    def __str__(self) -> str:
        return self._hex

    def __repr__(self) -> str:
        return f"DurableObjectId({self._hex!r})"

    def __eq__(self, other: object) -> bool:
        return self.equals(other)

    def __hash__(self) -> int:
        return hash(self._hex)


class DurableObjectNamespace:
    """`env.NS` for a `durable_objects.bindings` entry."""

    def __init__(self, binding: str, namespace_key: str, transport: ObjectTransport):
        self._binding, self._key, self._transport = binding, namespace_key, transport

    def idFromName(self, name: str) -> DurableObjectId:  # noqa: N802 - Cloudflare's name
        if not isinstance(name, str):
            raise TypeError(f"idFromName: the name must be a string, got {type(name).__name__}")
        return DurableObjectId(id_from_name(self._key, name), name)

    def newUniqueId(self, options: Any = None) -> DurableObjectId:  # noqa: N802 - Cloudflare's name
        return DurableObjectId(new_unique_id(self._key))

    def idFromString(self, value: str) -> DurableObjectId:  # noqa: N802 - Cloudflare's name
        if not valid_id(self._key, value):
            raise TypeError(
                f"Invalid Durable Object ID: {str(value)[:80]!r} is not an id of env.{self._binding} "
                f"({ID_CHARS} hex characters, as str(id) gives)"
            )
        return DurableObjectId(value)

    def get(self, object_id: DurableObjectId, options: Any = None) -> DurableObjectStub:
        if not isinstance(object_id, DurableObjectId):
            raise TypeError(
                f"env.{self._binding}.get: pass an id from idFromName, newUniqueId or idFromString"
            )
        return DurableObjectStub(self, object_id)

    def getByName(self, name: str, options: Any = None) -> DurableObjectStub:  # noqa: N802
        return self.get(self.idFromName(name))

    id_from_name = idFromName
    new_unique_id = newUniqueId
    id_from_string = idFromString
    get_by_name = getByName


class DurableObjectStub:
    """A stub: `await stub.method(*args, **kwargs)` runs the object's method (one call at a time
    per object, in arrival order); `await stub.fetch(url_or_request)` its fetch handler."""

    def __init__(self, namespace: DurableObjectNamespace, object_id: DurableObjectId):
        self._namespace, self.id = namespace, object_id
        self.name = object_id.name

    async def fetch(self, resource: Any, method: str | None = None, headers: Any = None, body: Any = None):
        from workers.fetch import _as_parts
        from workers.http import Response

        url, verb, hdrs, data = _as_parts(resource, method, headers, body)
        ns = self._namespace
        status, out_headers, out_body, *socket = await ns._transport(
            ns._binding, str(self.id), "fetch", [verb, url, [list(h) for h in hdrs], data], {}
        )
        if status == 101 and socket:  # the object accepted a WebSocket: the worker may return it
            return Response(None, 101, [tuple(h) for h in out_headers], web_socket=forwarded(socket[0]))
        return Response(out_body, status=status, headers=[tuple(h) for h in out_headers])

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        if method.startswith("_"):
            raise AttributeError(method)
        ns = self._namespace

        async def call(*args: Any, **kwargs: Any) -> Any:
            check_rpc_value(list(args), f"{method}: arguments")
            check_rpc_value(kwargs, f"{method}: keyword arguments")
            return await ns._transport(ns._binding, str(self.id), method, list(args), kwargs)

        call.__name__ = method
        return call

    def __repr__(self) -> str:
        return f"DurableObjectStub({self.id!r})"


# --- an object's own state ---------------------------------------------------------------------------


class SqlCursor:
    """What `await storage.sql.exec(query, *bindings)` gives: iterate it for rows (dicts), or
    `toArray()`, `one()` (exactly one row, else an error), `raw()` (rows as lists),
    `columnNames`, `rowsRead`, `rowsWritten`."""

    def __init__(self, fetch: Callable[[], Awaitable[dict]]):
        self._fetch = fetch
        self._result: dict | None = None
        self._at = 0

    def __await__(self):
        return self._load().__await__()

    async def _load(self) -> SqlCursor:
        if self._result is None:
            self._result = await self._fetch()
        return self

    def _loaded(self) -> dict:
        if self._result is None:
            raise RuntimeError(
                "await the cursor first: `cursor = await self.ctx.storage.sql.exec(...)` (here the "
                "storage is the runtime's, so each exec crosses to it)"
            )
        return self._result

    @property
    def columnNames(self) -> list[str]:  # noqa: N802 - Cloudflare's name
        return list(self._loaded()["columns"])

    @property
    def rowsRead(self) -> int:  # noqa: N802 - Cloudflare's name
        return self._loaded()["rowsRead"]

    @property
    def rowsWritten(self) -> int:  # noqa: N802 - Cloudflare's name
        return self._loaded()["rowsWritten"]

    def _row(self, values: list) -> Any:
        from workers.binding_values import JsObject

        return JsObject(zip(self._loaded()["columns"], values, strict=False))

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        rows = self._loaded()["rows"]
        if self._at >= len(rows):
            raise StopIteration
        self._at += 1
        return self._row(rows[self._at - 1])

    def next(self) -> dict:
        """Cloudflare's iterator step: {"value": row, "done": False} or {"done": True}."""
        try:
            return {"value": next(self), "done": False}
        except StopIteration:
            return {"done": True}

    def toArray(self) -> list:  # noqa: N802 - Cloudflare's name
        return list(self)

    def one(self) -> Any:
        rows = self._loaded()["rows"][self._at :]
        if len(rows) != 1:
            raise RuntimeError(f"Expected exactly one result from SQL query, but got {len(rows)}")
        self._at += 1
        return self._row(rows[0])

    def raw(self):
        rows = self._loaded()["rows"]
        while self._at < len(rows):
            self._at += 1
            yield list(rows[self._at - 1])

    to_array = toArray


class SqlStorage:
    """`ctx.storage.sql`: `exec(query, *bindings)` runs the statement at once and returns its
    SqlCursor, synchronously as on Cloudflare (the call blocks on the runtime's answer); the
    cursor may also be awaited, for code written against the asynchronous shape."""

    def __init__(self, transport: StorageTransport, sync_transport: SyncStorageTransport | None = None):
        self._transport, self._sync = transport, sync_transport

    def exec(self, query: str, *bindings: Any) -> SqlCursor:
        cursor = SqlCursor(lambda: self._transport("sql.exec", [query, list(bindings)], {}))
        if self._sync is not None:
            cursor._result = self._sync("sql.exec", [query, list(bindings)], {})
        return cursor


class DurableObjectStorage:
    """`ctx.storage`: the object's own key-value storage (values JSON-like, as RPC's) and SQL,
    kept by the runtime in the object's own SQLite file; nothing here can name another's."""

    def __init__(self, transport: StorageTransport, sync_transport: SyncStorageTransport | None = None):
        self._transport = transport
        self.sql = SqlStorage(transport, sync_transport)

    async def get(self, keys: str | list[str], options: Any = None) -> Any:
        """One key: its value or None; a list of keys: a dict of those found."""
        return await self._transport("get", [list(keys) if isinstance(keys, (list, tuple)) else keys], {})

    async def put(self, key_or_entries: str | dict[str, Any], value: Any = None, options: Any = None) -> None:
        if isinstance(key_or_entries, dict):
            check_rpc_value(key_or_entries, "storage.put: the values")
            await self._transport("put", [key_or_entries], {})
        else:
            check_rpc_value(value, "storage.put: the value")
            await self._transport("put", [key_or_entries, value], {})

    async def delete(self, keys: str | list[str], options: Any = None) -> bool | int:
        """One key: whether it existed; a list: how many of them did."""
        return await self._transport("delete", [list(keys) if isinstance(keys, (list, tuple)) else keys], {})

    async def deleteAll(self, options: Any = None) -> None:  # noqa: N802 - Cloudflare's name
        await self._transport("deleteAll", [], {})

    async def list(self, options: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """Keys in order with their values: prefix, start (inclusive), startAfter, end (exclusive),
        limit, reverse; as options dict or keywords."""
        merged = dict(options or {})
        merged.update({k: v for k, v in kwargs.items() if v is not None})
        return await self._transport("list", [], merged)

    # --- the alarm: one per object, kept in its storage, fired by the runtime --------------------------

    async def getAlarm(self, options: Any = None) -> int | None:  # noqa: N802 - Cloudflare's name
        """When the alarm is set for (ms since the epoch), or None; None too while the alarm
        handler runs, unless it set a new one."""
        return await self._transport("getAlarm", [], {})

    async def setAlarm(self, scheduled_time: Any, options: Any = None) -> None:  # noqa: N802
        """Set (or move) the object's one alarm: a datetime, or ms since the epoch as Cloudflare
        takes it; a time in the past fires at once. The object's `alarm(self, alarm_info)` runs then."""
        await self._transport("setAlarm", [alarm_time_ms(scheduled_time)], {})

    async def deleteAlarm(self, options: Any = None) -> None:  # noqa: N802 - Cloudflare's name
        await self._transport("deleteAlarm", [], {})

    delete_all = deleteAll
    get_alarm = getAlarm
    set_alarm = setAlarm
    delete_alarm = deleteAlarm


def alarm_time_ms(when: Any) -> int:
    """A setAlarm time as ms since the epoch: a datetime (naive ones are UTC, as Date's are), or a
    number of ms; TypeError names what else was given."""
    import datetime

    if isinstance(when, datetime.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return int(when.timestamp() * 1000)
    if hasattr(when, "getTime"):  # a js.Date stand-in
        when = when.getTime()
    if isinstance(when, (int, float)) and not isinstance(when, bool) and when == when:
        if not 0 <= when < 2**53:
            raise TypeError(f"setAlarm: {when} ms is not a time (0 <= ms < 2**53)")
        return int(when)
    raise TypeError(f"setAlarm: pass a datetime or ms since the epoch (int), got {type(when).__name__}")


class DurableObjectState:
    """An object's `ctx`: `id`, `storage`, `waitUntil`, `blockConcurrencyWhile`."""

    def __init__(self, object_id: DurableObjectId, storage: DurableObjectStorage, wait_until: Callable):
        self.id, self.storage, self._wait_until = object_id, storage, wait_until

    def waitUntil(self, awaitable: Any) -> None:  # noqa: N802 - Cloudflare's name
        self._wait_until(awaitable)

    async def blockConcurrencyWhile(self, callback: Callable[[], Awaitable[Any]]) -> Any:  # noqa: N802
        return await callback()

    def acceptWebSocket(self, ws: Any, tags: list[str] | None = None) -> None:  # noqa: N802
        """Accept the server end of a WebSocketPair for the object: it may then hibernate (its
        isolate stopped) while the runtime holds the connection; each message wakes it for
        `webSocketMessage(self, ws, message)`, a close for `webSocketClose(ws, code, reason,
        wasClean)`."""
        accept_hibernatable(ws, tags)

    def getWebSockets(self, tag: str | None = None) -> list:  # noqa: N802 - Cloudflare's name
        return hibernatable(tag)

    def getTags(self, ws: Any) -> list[str]:  # noqa: N802 - Cloudflare's name
        return list(getattr(ws, "_tags", None) or [])

    wait_until = waitUntil
    block_concurrency_while = blockConcurrencyWhile
    accept_web_socket = acceptWebSocket
    get_web_sockets = getWebSockets
    get_tags = getTags
