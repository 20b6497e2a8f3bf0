"""A worker's service-binding fetch: `env.<binding>.fetch(...)` reaches another worker of the same
account (its active version), or the dev worker's static assets (the [assets] binding)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from starlette.responses import Response

from runtime.host.assets import ASSETS_SERVICE, AssetServer
from runtime.host.invocation import Invocation
from runtime.host.sockets import SocketUpgrade
from runtime.host.spec import WorkerSpec
from runtime.http.errors import InternalRequest
from runtime.isolate import ipc


class Served(Protocol):
    async def serve(self, request, body: bytes, ctx: Invocation, headers_out: dict) -> Response: ...


class ServiceBindings:
    """`workers(account, name)` finds the worker a binding names (None: no such worker)."""

    def __init__(self, workers: Callable[[str, str], Served | None], assets: AssetServer | None):
        self.workers, self.assets = workers, assets

    async def call(self, caller: WorkerSpec, call: ipc.FetchCall, ctx: Invocation) -> ipc.FetchReply:
        service = caller.services.get(call.service)
        if service == ASSETS_SERVICE and self.assets is not None and caller.version is None:
            served = self.assets.fetch(call.method, call.url, {k.lower(): v for k, v in call.headers})
            if len(served.body) > ipc.TO_ISOLATE - ipc.CHUNK:  # one reply frame carries it
                return ipc.FetchReply(
                    call.call,
                    error=f"{call.service}.fetch: the asset is over {ipc.TO_ISOLATE // 2**20 - 1} MiB",
                )
            return ipc.FetchReply(call.call, served.status, served.headers, served.body)
        handle = self.workers(caller.account, service) if service else None
        if handle is None:
            return ipc.FetchReply(
                call.call,
                error=f"service binding {call.service}: no worker {service!r} in account {caller.account!r}",
            )
        fake = InternalRequest(call.method, call.url, call.headers)
        response = await handle.serve(fake, call.body, ctx.sub(call.method, call.url), {})
        if isinstance(response, SocketUpgrade):  # no token crosses a service binding: refused, freed
            response.socket.cut(1011, "a WebSocket cannot be passed through a service binding", False)
            return ipc.FetchReply(
                call.call,
                error=f"service binding {call.service}: {service!r} answered with a WebSocket; WebSockets "
                "are passed on from Durable Objects only (stub.fetch), not through service bindings",
            )
        body = (
            response.body
            if hasattr(response, "body")
            else b"".join([c async for c in response.body_iterator])
        )
        return ipc.FetchReply(call.call, response.status_code, list(response.headers.items()), bytes(body))
