"""The type names of Cloudflare's SDK (`workers.types`): what a body, a fetch's options and a
context may be here."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol, TypedDict, runtime_checkable

from workers.http import Response

# Cloudflare: "js.Blob | JsBuffer | js.FormData | js.ReadableStream | js.URLSearchParams"
JSBody = "Blob | bytes | FormData | AsyncIterator[bytes]"
Body = "str | FormData | JSBody"

# Cloudflare's fetch returns a Response deriving from FetchResponse; here they are one class.
FetchResponse = Response


@runtime_checkable
class Context(Protocol):
    """What `ctx` offers a worker: waitUntil (and wait_until) keep work running after the response."""

    def waitUntil(self, other: Awaitable[Any]) -> None: ...  # noqa: N802 - Cloudflare's name


# https://developers.cloudflare.com/workers/runtime-apis/request/#the-cf-property-requestinitcfproperties
# (accepted by fetch; the edge runtime has no cache in front of fetch, so they change nothing)
class RequestInitCfProperties(TypedDict, total=False):
    apps: bool | None
    cacheEverything: bool | None
    cacheKey: str | None
    cacheTags: list[str] | None
    cacheTtl: int
    cacheTtlByStatus: dict[str, int]
    image: Any | None
    mirage: bool | None
    polish: str | None
    resolveOverride: str | None
    scrapeShield: bool | None
    webp: bool | None


# https://developers.cloudflare.com/workers/runtime-apis/request/#options
class FetchKwargs(TypedDict, total=False):
    headers: Any
    body: Any
    method: str | None
    redirect: str | None
    cf: RequestInitCfProperties | None
    fetcher: Any
