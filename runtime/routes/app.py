"""The Starlette app: the runtime's routes, then every other path under its prefixes answered
404 or 405 here (so none ever reaches a worker), then the worker path for everything else."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route, WebSocketRoute
from starlette.websockets import WebSocket

from runtime.control.storage_errors import StorageUnavailable, storage_failure
from runtime.http.errors import (
    BAD_CONTROL_REQUEST,
    METHOD_NOT_ALLOWED,
    NO_ROUTE,
    STORAGE_UNAVAILABLE,
    error_response,
)
from runtime.routes.ai_rest import cf_error

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def assemble(
    served: list[BaseRoute],
    worker_path: Callable[[Request], Awaitable[Response]],
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
    websocket_path: Callable[[WebSocket], Awaitable[None]] | None = None,
) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await start()
        try:
            yield
        finally:
            await stop()

    return Starlette(
        routes=[
            *served,
            # Every other path under the runtime's prefixes, whatever the method, is answered here and
            # never reaches a worker (with the caller's API token). A later full match beats an
            # earlier method-only match in Starlette's router, so these decide 404 or 405 themselves.
            Route("/client/v4{rest:path}", _NotServed(served, _cf_shape)),
            Route("/cdn-cgi{rest:path}", _NotServed(served, _runtime_shape)),
            Route("/{path:path}", worker_path, methods=METHODS),
            *([WebSocketRoute("/{path:path}", websocket_path)] if websocket_path else []),
        ],
        lifespan=lifespan,
        exception_handlers={StorageUnavailable: _storage_unavailable, OSError: _disk_full},
    )


async def _storage_unavailable(request: Request, exc: StorageUnavailable) -> Response:
    """A state write that could not happen (runtime.control.storage_errors): 503 in the caller's shape."""
    if request.url.path.startswith("/client/v4"):
        return cf_error(STORAGE_UNAVAILABLE, str(exc), 503)
    return error_response(503, STORAGE_UNAVAILABLE, str(exc))


async def _disk_full(request: Request, exc: OSError) -> Response:
    """A bundle or token file the disk had no room for: 503 as above; any other OSError is a bug."""
    failure = storage_failure(exc, "the state directory")
    if failure is None:
        raise exc
    return await _storage_unavailable(request, failure)


def _cf_shape(status: int, message: str) -> Response:
    return cf_error(NO_ROUTE if status == 404 else METHOD_NOT_ALLOWED, message, status)


def _runtime_shape(status: int, message: str) -> Response:
    return error_response(status, BAD_CONTROL_REQUEST, message)


class _NotServed:
    """An ASGI app (so that its route matches every method) for a runtime path nothing serves:
    405 (with Allow) where a route has that path for other methods, else 404. It reads no body."""

    def __init__(self, served: list[BaseRoute], shape):
        self.served, self.shape = served, shape

    async def __call__(self, scope, receive, send) -> None:
        allowed: set[str] = set()
        for route in self.served:
            match, _ = route.matches(scope)
            if match == Match.PARTIAL:
                allowed |= getattr(route, "methods", None) or set()
        path = Request(scope).url.path
        if allowed:
            allow = ", ".join(sorted(allowed))
            response = self.shape(405, f"{scope['method']} is not allowed on {path}; use {allow}")
            response.headers["allow"] = allow
        else:
            response = self.shape(404, f"No route for that URI: nothing in this runtime serves {path}")
        await response(scope, receive, send)
