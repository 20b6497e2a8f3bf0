"""The runtime's own HTTP answers: its error codes and body shape, cf-ray ids, and the two
request stand-ins (a client body read as it arrives, a call between workers shaped as a request)."""

from __future__ import annotations

import secrets as pysecrets
from collections.abc import AsyncIterator

from starlette.datastructures import URL, Headers
from starlette.responses import JSONResponse

# Worker outcomes (Cloudflare's codes).
WORKER_EXCEPTION = 1101
WORKER_LIMITS = 1102
WORKER_UNAVAILABLE = 1103
# Runtime error codes (Cloudflare's where one exists).
BAD_LOCATION = 1110
BODY_TOO_LARGE = 1113
BAD_CONTROL_REQUEST = 1120  # also: no /cdn-cgi/ endpoint at that path (404) or for that method (405)
NO_SUCH_WORKER = 1121
ADMIN_AUTH = 1124  # a control endpoint without the admin token (401) or with a wrong one (403)
STORAGE_UNAVAILABLE = 1125  # a state write refused: its file locked elsewhere, or the disk full (503)
# /client/v4/ paths no API serves, in the Cloudflare envelope
NO_ROUTE = 7000  # Cloudflare's "No route for that URI"
METHOD_NOT_ALLOWED = 7001


def error_response(
    status: int, code: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def ray_id() -> str:
    return pysecrets.token_hex(8)


class BodyTooLarge(Exception):
    pass


class ClientBody:
    """A client's request body as it arrives, passed on chunk by chunk; past `limit` bytes it
    stops with BodyTooLarge (the worker's read fails and the client gets 413)."""

    def __init__(self, stream: AsyncIterator[bytes], limit: int):
        self._stream, self.limit = stream, limit
        self.size, self.exceeded = 0, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self.size += len(chunk)
            if self.size > self.limit:
                self.exceeded = True
                raise BodyTooLarge(f"the request body is over {self.limit // (1024 * 1024)} MB")
            if chunk:
                yield chunk


class InternalRequest:
    """A call between workers (a service binding, a Durable Object's stub.fetch) presented to
    WorkerHandle.serve like an incoming request."""

    def __init__(self, method: str, url: str, headers: list[tuple[str, str]]):
        self.method = method
        self.url = URL(url)
        self.headers = Headers(raw=[(k.lower().encode(), v.encode()) for k, v in headers])
