"""KV, D1, R2 and queue bindings as a worker sees them: `env.KV`, `env.DB`, `env.BUCKET`, `env.QUEUE`.

The shapes are Cloudflare's (Workers KV, D1 and R2 binding APIs) as its Python Workers expose
them: methods take Cloudflare's argument names, either as keywords (`put(k, v, expirationTtl=60)`)
or as the options dict (`put(k, v, {"expirationTtl": 60})`), and results can be read by attribute
(`result.results`, `result.meta.changes`) or by key (`result["results"]`); `.to_py()` gives plain
dicts and lists, as on a JsProxy.

Each class takes a transport, `async (method, args, kwargs) -> Any`, that carries the call to the
runtime, which holds the data (this package runs inside the isolate and imports nothing of ours).
"""

from __future__ import annotations

import json as _json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any

Transport = Callable[[str, list, dict], Awaitable[Any]]

KV_TYPES = ("text", "json", "arrayBuffer", "stream")
STREAM_CHUNK = 64 * 1024


class BindingError(Exception):
    """A KV, D1 or R2 call the runtime refused or that failed; `type` is e.g. "D1_ERROR"."""

    def __init__(self, type: str, message: str):  # noqa: A002 - the name Cloudflare's errors carry
        super().__init__(message)
        self.type = type


def binding_error(error_type: str, message: str) -> Exception:
    """The exception a failed call raises in the worker (TypeError / ValueError for bad arguments)."""
    if error_type == "TypeError":
        return TypeError(message)
    if error_type == "RangeError":
        return ValueError(message)
    return BindingError(error_type, message)


class JsObject(dict):
    """A result object: a dict whose keys are also attributes, as a JsProxy reads."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_py(self) -> dict:
        return _to_py(self)


def _to_py(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_py(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_py(v) for v in value]
    if isinstance(value, (R2Object,)):
        return value.to_py()
    return value


def _wrap(value: Any) -> Any:
    if isinstance(value, dict):
        return JsObject({k: _wrap(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _options(options: Any, kwargs: dict[str, Any], what: str) -> dict[str, Any]:
    """Cloudflare's options dict merged with keyword arguments (keywords win)."""
    if options is None:
        merged = {}
    elif isinstance(options, dict):
        merged = dict(options)
    else:
        raise TypeError(f"{what}: options must be a dict, got {type(options).__name__}")
    merged.update({k: v for k, v in kwargs.items() if v is not None})
    return merged


async def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if hasattr(value, "__aiter__"):  # a stream (e.g. request.body): read whole, it crosses in one frame
        return b"".join([c.encode() if isinstance(c, str) else bytes(c) async for c in value])
    raise TypeError(f"{what}: the value must be str, bytes or a stream of bytes, got {type(value).__name__}")


async def _stream(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), STREAM_CHUNK):
        yield data[start : start + STREAM_CHUNK]


# --- KV --------------------------------------------------------------------------------------------


class KVListResult(JsObject):
    """`{"keys": [...], "list_complete": bool, "cursor": str}`; `.keys` is the list of keys, as in JS."""

    @property
    def keys(self) -> list:  # type: ignore[override] - Cloudflare's field, not dict.keys()
        return self["keys"]


def _decode_kv(value: bytes | None, kind: str) -> Any:
    if value is None:
        return None
    if kind == "text":
        return value.decode("utf-8", errors="replace")
    if kind == "json":
        return _json.loads(value)
    if kind == "arrayBuffer":
        return value
    return _stream(value)


class KVNamespace:
    """`env.KV`: get / getWithMetadata / put / delete / list, as Workers KV."""

    def __init__(self, transport: Transport):
        self._call = transport

    @staticmethod
    def _type(type_or_options: Any, kwargs: dict[str, Any]) -> str:
        if isinstance(type_or_options, str):
            kind = type_or_options
        else:
            kind = _options(type_or_options, kwargs, "KV get").get("type", "text")
        if kind not in KV_TYPES:
            raise TypeError(f"KV get: type must be one of {', '.join(KV_TYPES)}, got {kind!r}")
        return kind

    async def get(self, key: str, type: Any = None, **options: Any) -> Any:  # noqa: A002
        """The value, or None: `type` is "text" (default), "json", "arrayBuffer" (bytes) or
        "stream" (an async iterator of bytes), or an options dict {"type": ..., "cacheTtl": ...}."""
        kind = self._type(type, options)
        found = await self._call("get", [key], {})
        return None if found is None else _decode_kv(found["value"], kind)

    async def getWithMetadata(self, key: str, type: Any = None, **options: Any) -> JsObject:  # noqa: A002, N802
        """`{"value", "metadata", "cacheStatus"}`; value and metadata are None for a missing key."""
        kind = self._type(type, options)
        found = await self._call("get", [key], {})
        if found is None:
            return JsObject(value=None, metadata=None, cacheStatus=None)
        return JsObject(
            value=_decode_kv(found["value"], kind), metadata=_wrap(found.get("metadata")), cacheStatus=None
        )

    get_with_metadata = getWithMetadata

    async def put(
        self,
        key: str,
        value: Any,
        options: dict[str, Any] | None = None,
        *,
        expirationTtl: int | None = None,  # noqa: N803 - Cloudflare's names
        expiration: int | None = None,
        metadata: Any = None,
    ) -> None:
        opts = _options(
            options,
            {"expirationTtl": expirationTtl, "expiration": expiration, "metadata": metadata},
            "KV put",
        )
        await self._call("put", [key, await _as_bytes(value, "KV put")], opts)

    async def delete(self, key: str) -> None:
        await self._call("delete", [key], {})

    async def list(
        self,
        options: dict[str, Any] | None = None,
        *,
        prefix: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> KVListResult:
        """`{"keys": [{"name", "expiration"?, "metadata"?}], "list_complete", "cursor"}`, by key."""
        opts = _options(options, {"prefix": prefix, "limit": limit, "cursor": cursor}, "KV list")
        result = await self._call("list", [], opts)
        return KVListResult(
            keys=[_wrap(k) for k in result["keys"]],
            list_complete=result["list_complete"],
            cursor=result.get("cursor"),
            cacheStatus=None,
        )


# --- D1 --------------------------------------------------------------------------------------------


def _params(values: Iterable[Any]) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, (bytearray, memoryview)):
            v = bytes(v)
        if v is not None and not isinstance(v, (bool, int, float, str, bytes)):
            raise TypeError(
                f"D1_TYPE_ERROR: type {type(v).__name__!r} not supported for value {v!r}: "
                "bind None, bool, int, float, str or bytes"
            )
        out.append(v)
    return out


def _d1_result(raw: dict, rows: bool = True) -> JsObject:
    columns = raw["columns"]
    results = [JsObject(zip(columns, row, strict=True)) for row in raw["rows"]] if rows else []
    return JsObject(success=True, meta=JsObject(raw["meta"]), results=results)


class D1PreparedStatement:
    """`env.DB.prepare(sql)`: `.bind(*values)` returns a bound copy; `all`, `first`, `run`, `raw`."""

    def __init__(self, transport: Transport, sql: str, params: list[Any] | None = None):
        if not isinstance(sql, str):
            raise TypeError(f"D1 prepare: the query must be a string, got {type(sql).__name__}")
        self._call, self.sql, self.params = transport, sql, params or []

    def bind(self, *values: Any) -> D1PreparedStatement:
        return D1PreparedStatement(self._call, self.sql, _params(values))

    def _wire(self) -> list[Any]:
        return [self.sql, self.params]

    async def all(self) -> JsObject:
        """`{"results": [row dicts], "success": True, "meta": {...}}`."""
        return _d1_result(await self._call("query", self._wire(), {}))

    async def run(self) -> JsObject:
        """As all(): Cloudflare's run returns the same D1Result."""
        return _d1_result(await self._call("query", self._wire(), {}))

    async def first(self, column: str | None = None, /, **kwargs: Any) -> Any:
        """The first row (a dict), or that row's `column`; None when there is no row."""
        column = column if column is not None else kwargs.get("colName", kwargs.get("column"))
        raw = await self._call("query", self._wire(), {"first": True})
        if not raw["rows"]:
            return None
        row = JsObject(zip(raw["columns"], raw["rows"][0], strict=True))
        if column is None:
            return row
        if column not in row:
            raise BindingError("D1_COLUMN_NOTFOUND", f"D1_COLUMN_NOTFOUND: column not found ({column})")
        return row[column]

    async def raw(self, options: dict[str, Any] | None = None, *, columnNames: bool = False) -> list[list]:  # noqa: N803
        """Rows as lists; with columnNames=True the first list is the column names."""
        names = bool(_options(options, {"columnNames": columnNames or None}, "D1 raw").get("columnNames"))
        raw = await self._call("query", self._wire(), {})
        rows = [list(r) for r in raw["rows"]]
        return [list(raw["columns"]), *rows] if names else rows

    def __repr__(self) -> str:
        return f"D1PreparedStatement({self.sql!r}, {len(self.params)} parameter(s))"


class D1Database:
    """`env.DB`: prepare / batch / exec, as D1. The runtime runs the SQL (never the isolate)."""

    def __init__(self, transport: Transport):
        self._call = transport

    def prepare(self, query: str) -> D1PreparedStatement:
        return D1PreparedStatement(self._call, query)

    async def batch(self, statements: list[D1PreparedStatement]) -> list[JsObject]:
        """Run the statements in order in one transaction: all succeed, or none is applied."""
        if not all(isinstance(s, D1PreparedStatement) for s in statements):
            raise TypeError("D1 batch: pass a list of statements made by env.DB.prepare(...)")
        raw = await self._call("batch", [[s._wire() for s in statements]], {})
        return [_d1_result(r) for r in raw]

    async def exec(self, query: str) -> JsObject:
        """Run one or more statements (no parameters): `{"count", "duration"}`."""
        if not isinstance(query, str):
            raise TypeError(f"D1 exec: the query must be a string, got {type(query).__name__}")
        return JsObject(await self._call("exec", [query], {}))

    async def dump(self) -> bytes:
        raise BindingError("D1_ERROR", "D1_ERROR: dump() is not supported here; use `edge d1 execute`")


# --- R2 --------------------------------------------------------------------------------------------


class R2Object:
    """An object's metadata (head, put, list): key, size, etag, httpEtag, uploaded, version,
    httpMetadata, customMetadata, storageClass; readable by attribute or by key."""

    _FIELDS = (
        "key", "version", "size", "etag", "httpEtag", "uploaded", "httpMetadata", "customMetadata",
        "storageClass", "checksums",
    )  # fmt: skip

    def __init__(self, meta: dict[str, Any]):
        self.key: str = meta["key"]
        self.version: str = meta["version"]
        self.size: int = meta["size"]
        self.etag: str = meta["etag"]
        self.httpEtag: str = f'"{self.etag}"'  # noqa: N815 - Cloudflare's names
        self.uploaded = datetime.fromtimestamp(meta["uploaded"], tz=UTC)
        self.httpMetadata = JsObject(meta.get("httpMetadata") or {})  # noqa: N815
        self.customMetadata = JsObject(meta.get("customMetadata") or {})  # noqa: N815
        self.storageClass = "Standard"  # noqa: N815
        self.checksums = JsObject(md5=self.etag)

    def __getitem__(self, name: str) -> Any:
        if name not in self._FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def writeHttpMetadata(self, headers: Any) -> None:  # noqa: N802
        """Set the stored HTTP metadata (content-type, cache-control, ...) on `headers`."""
        names = {
            "contentType": "content-type",
            "contentLanguage": "content-language",
            "contentDisposition": "content-disposition",
            "contentEncoding": "content-encoding",
            "cacheControl": "cache-control",
        }
        for field, header in names.items():
            if self.httpMetadata.get(field):
                headers[header] = self.httpMetadata[field]

    def to_py(self) -> dict[str, Any]:
        return {f: _to_py(getattr(self, f)) for f in self._FIELDS}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key!r} {self.size} bytes>"


class R2ObjectBody(R2Object):
    """What get() returns: the metadata and the body (`text()`, `json()`, `arrayBuffer()`,
    `bytes()`, or `body`, an async iterator of bytes)."""

    def __init__(self, meta: dict[str, Any], data: bytes):
        super().__init__(meta)
        self._data = data
        self.bodyUsed = False  # noqa: N815

    @property
    def body(self) -> AsyncIterator[bytes]:
        self.bodyUsed = True
        return _stream(self._data)

    async def arrayBuffer(self) -> bytes:  # noqa: N802
        self.bodyUsed = True
        return self._data

    bytes = arrayBuffer

    async def text(self) -> str:
        return (await self.arrayBuffer()).decode("utf-8", errors="replace")

    async def json(self) -> Any:
        return _json.loads(await self.arrayBuffer())


class R2Bucket:
    """`env.BUCKET`: put / get / head / list / delete, as R2."""

    def __init__(self, transport: Transport):
        self._call = transport

    async def put(
        self,
        key: str,
        value: Any,
        options: dict[str, Any] | None = None,
        *,
        httpMetadata: dict[str, Any] | None = None,  # noqa: N803 - Cloudflare's names
        customMetadata: dict[str, str] | None = None,
    ) -> R2Object:
        opts = _options(options, {"httpMetadata": httpMetadata, "customMetadata": customMetadata}, "R2 put")
        data = b"" if value is None else await _as_bytes(value, "R2 put")
        return R2Object(await self._call("put", [key, data], opts))

    async def get(self, key: str, options: dict[str, Any] | None = None) -> R2ObjectBody | None:
        found = await self._call("get", [key], {})
        return None if found is None else R2ObjectBody(found["meta"], found["body"])

    async def head(self, key: str) -> R2Object | None:
        found = await self._call("head", [key], {})
        return None if found is None else R2Object(found)

    async def delete(self, keys: str | list[str]) -> None:
        await self._call("delete", [keys if isinstance(keys, str) else list(keys)], {})

    async def list(
        self,
        options: dict[str, Any] | None = None,
        *,
        prefix: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        delimiter: str | None = None,
        include: list[str] | None = None,
    ) -> JsObject:
        """`{"objects": [R2Object], "truncated", "cursor"?, "delimitedPrefixes"}`, by key."""
        opts = _options(
            options, {"prefix": prefix, "limit": limit, "cursor": cursor, "delimiter": delimiter}, "R2 list"
        )
        opts.pop("include", None)  # metadata is always included here
        result = await self._call("list", [], opts)
        out = JsObject(
            objects=[R2Object(m) for m in result["objects"]],
            truncated=result["truncated"],
            delimitedPrefixes=list(result["delimitedPrefixes"]),
        )
        if result.get("cursor"):
            out["cursor"] = result["cursor"]
        return out


# --- Queues (producer) -----------------------------------------------------------------------------


def _queue_body(body: Any) -> Any:
    return bytes(body) if isinstance(body, (bytearray, memoryview)) else body


class Queue:
    """`env.QUEUE`: send / sendBatch, as a Queues producer binding. The runtime checks and stores
    each message (128 KB each; a batch at most 100 messages and 256 KB)."""

    def __init__(self, transport: Transport):
        self._call = transport

    async def send(
        self,
        body: Any,
        options: dict[str, Any] | None = None,
        *,
        contentType: str | None = None,  # noqa: N803 - Cloudflare's names
        delaySeconds: int | None = None,
    ) -> None:
        """Queue one message: `contentType` "text", "bytes", "json" or "v8" (the default: any
        JSON-like value or bytes, delivered as it was sent); `delaySeconds` up to 43,200."""
        opts = _options(options, {"contentType": contentType, "delaySeconds": delaySeconds}, "Queue send")
        await self._call("send", [_queue_body(body)], opts)

    async def sendBatch(  # noqa: N802 - Cloudflare's name
        self,
        messages: Iterable[Any],
        options: dict[str, Any] | None = None,
        *,
        delaySeconds: int | None = None,  # noqa: N803
    ) -> None:
        """Queue messages given as `{"body": ..., "contentType"?: ..., "delaySeconds"?: ...}`, all or none."""
        opts = _options(options, {"delaySeconds": delaySeconds}, "Queue sendBatch")
        entries = []
        for entry in messages:
            if not isinstance(entry, dict):
                raise TypeError("Queue sendBatch: each message is a dict such as {'body': ...}")
            entries.append({k: _queue_body(v) if k == "body" else v for k, v in entry.items()})
        await self._call("sendBatch", [entries], opts)

    send_batch = sendBatch


BINDING_CLASSES = {"kv": KVNamespace, "d1": D1Database, "r2": R2Bucket, "queue": Queue}
