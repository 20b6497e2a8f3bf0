"""`env.KV`: a Workers KV namespace binding (get, getWithMetadata, put, delete, list)."""

from __future__ import annotations

import json as _json
from typing import Any

from workers.binding_values import (
    JsObject,
    Transport,
    as_bytes,
    byte_stream,
    merge_options,
    wrap_result,
)

KV_TYPES = ("text", "json", "arrayBuffer", "stream")


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
    return byte_stream(value)


class KVNamespace:
    """`env.KV`: get / getWithMetadata / put / delete / list, as Workers KV."""

    def __init__(self, transport: Transport):
        self._call = transport

    @staticmethod
    def _type(type_or_options: Any, kwargs: dict[str, Any]) -> str:
        if isinstance(type_or_options, str):
            kind = type_or_options
        else:
            kind = merge_options(type_or_options, kwargs, "KV get").get("type", "text")
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
            value=_decode_kv(found["value"], kind),
            metadata=wrap_result(found.get("metadata")),
            cacheStatus=None,
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
        opts = merge_options(
            options,
            {"expirationTtl": expirationTtl, "expiration": expiration, "metadata": metadata},
            "KV put",
        )
        await self._call("put", [key, await as_bytes(value, "KV put")], opts)

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
        opts = merge_options(options, {"prefix": prefix, "limit": limit, "cursor": cursor}, "KV list")
        result = await self._call("list", [], opts)
        return KVListResult(
            keys=[wrap_result(k) for k in result["keys"]],
            list_complete=result["list_complete"],
            cursor=result.get("cursor"),
            cacheStatus=None,
        )
