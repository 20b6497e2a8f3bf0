"""`fetch`: outbound HTTP from a worker, carried by the runtime (the isolate itself has no network)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from workers.http import Headers, Request, Response

# Set by the runtime when the worker runs inside an isolate: (method, url, headers, body) -> Response.
Transport = Callable[[str, str, list[tuple[str, str]], bytes], Awaitable[Response]]
_transport: Transport | None = None


def _install(transport: Transport) -> None:
    global _transport
    _transport = transport


def _as_parts(resource: str | Request, method: str | None, headers, body) -> tuple[str, str, list, bytes]:
    if isinstance(resource, Request):
        url, method = resource.url, method or resource.method
        headers = headers if headers is not None else resource.headers
        body = body if body is not None else (resource._body or b"")
    else:
        url = resource
    hdrs = headers.items() if isinstance(headers, (Headers, Mapping)) else (headers or [])
    pairs = [(str(k), str(v)) for k, v in hdrs]
    if hasattr(body, "_body_and_type"):  # workers.FormData, Blob, File: sent with their content type
        body, content_type = body._body_and_type()
        if content_type and not any(k.lower() == "content-type" for k, _ in pairs):
            pairs.append(("content-type", content_type))
    data = body.encode("utf-8") if isinstance(body, str) else bytes(body or b"")
    return url, str(method or "GET").upper(), pairs, data


async def fetch(
    resource: str | Request,
    method: str | None = None,
    headers: Mapping[str, str] | Headers | Iterable[tuple[str, str]] | None = None,
    body: str | bytes | None = None,
    **other_options: Any,
) -> Response:
    """Send an HTTP request through the runtime; counts against the worker's subrequest limit.

    The body may also be a workers.FormData, Blob or File. Cloudflare's other fetch options
    (`redirect`, `cf`, `fetcher`) are accepted and have no effect here; others are a TypeError."""
    unknown = set(other_options) - {"redirect", "cf", "fetcher"}
    if unknown:
        raise TypeError(f"fetch() got unexpected keyword argument(s): {', '.join(sorted(unknown))}")
    if _transport is None:
        raise RuntimeError("fetch works inside the edge runtime (edge dev / a deployed worker)")
    url, verb, hdrs, data = _as_parts(resource, method, headers, body)
    return await _transport(verb, url, hdrs, data)
