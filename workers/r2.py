"""`env.BUCKET`: an R2 bucket binding (head, get, put, delete, list) and its objects."""

from __future__ import annotations

import json as _json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from workers.binding_values import (
    JsObject,
    Transport,
    as_bytes,
    byte_stream,
    merge_options,
    to_py_value,
)


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
        return {f: to_py_value(getattr(self, f)) for f in self._FIELDS}

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
        return byte_stream(self._data)

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
        opts = merge_options(
            options, {"httpMetadata": httpMetadata, "customMetadata": customMetadata}, "R2 put"
        )
        data = b"" if value is None else await as_bytes(value, "R2 put")
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
        opts = merge_options(
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
