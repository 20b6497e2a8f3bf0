"""The worker path: every request outside the runtime's own prefixes goes to a worker.

Locate the client (request.cf), serve the dev worker's static assets first where they match,
pick the worker and its version, pass the body on (bytes when small, else as it arrives, capped at
MAX_BODY_BYTES) and answer with cf-ray; a network that is emulated really waits the client's
round trip."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.websockets import WebSocket

from edge_sim.topology import TopologyError
from runtime.host.addressing import Locator, target
from runtime.host.assets import AssetResponse, AssetServer
from runtime.host.registry import WorkerRegistry
from runtime.host.services import NetworkMode
from runtime.host.sockets import SocketHub, SocketUpgrade
from runtime.http.errors import (
    BAD_LOCATION,
    BODY_TOO_LARGE,
    NO_SUCH_WORKER,
    WORKER_EXCEPTION,
    ClientBody,
    error_response,
    ray_id,
)
from runtime.http.headers import LOCATION_HEADER
from runtime.isolate import ipc

MAX_BODY_BYTES = 100 * 1024 * 1024  # Cloudflare's request body limit on the Free and Pro plans


class WorkerFront:
    def __init__(
        self,
        locator: Locator,
        workers: WorkerRegistry,
        assets: AssetServer | None,
        network: NetworkMode,
        sockets: SocketHub | None = None,
    ):
        self.locator, self.workers, self.assets, self.network = locator, workers, assets, network
        self.sockets = sockets or SocketHub()

    async def _client_body(self, request: Request) -> bytes | ClientBody | None:
        """The body as the worker will read it: bytes when it is small, else a stream that is
        passed on as it arrives (never held whole here); None when it is declared too large."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > MAX_BODY_BYTES:
                return None
            if int(declared) <= ipc.CHUNK:
                return await request.body()
        elif "transfer-encoding" not in request.headers:
            return b""  # no body at all
        return ClientBody(request.stream(), MAX_BODY_BYTES)

    async def handle(self, request: Request) -> Response:
        try:
            ctx = self.locator.locate(request)
        except TopologyError as exc:
            return error_response(400, BAD_LOCATION, f"{LOCATION_HEADER}: {exc}")
        ray = {"cf-ray": f"{ray_id()}-{ctx.ingress.code}"}
        addressed = target(request)
        if self.assets is not None and addressed is None:  # the dev worker's assets first
            served = self.assets.serve(
                request.method, request.scope["path"], request.headers, request.url.query
            )
            if served is not None:
                return _asset_response(served, ray)
        too_large = f"request body exceeds {MAX_BODY_BYTES // (1024 * 1024)} MB; send less"
        body = await self._client_body(request)
        if body is None:
            return error_response(413, BODY_TOO_LARGE, too_large, ray)
        handle = self.workers.dev if addressed is None else self.workers.worker(*addressed, request=request)
        if handle is None:
            account, worker = addressed
            return error_response(
                404,
                NO_SUCH_WORKER,
                f"no worker {worker!r} is deployed in account {account!r}; deploy it with `edge deploy`",
                ray,
            )
        if self.network.emulate:  # the request's half of the client round trip, really waited
            await asyncio.sleep(ctx.client_rtt_ms / 2000)
        response = await handle.serve(request, body, ctx, ray)
        if isinstance(response, SocketUpgrade):  # 101 to a request that cannot take a WebSocket
            response.socket.cut(1002, "the request was not a WebSocket upgrade", tell_worker=False)
            return error_response(
                500, WORKER_EXCEPTION, "Worker answered 101 to a request that is no WebSocket upgrade", ray
            )
        if isinstance(body, ClientBody) and body.exceeded:  # it grew past the limit on the way
            if isinstance(response, StreamingResponse):
                await response.body_iterator.aclose()
            return error_response(413, BODY_TOO_LARGE, too_large, ray)
        return response

    async def handle_websocket(self, websocket: WebSocket) -> None:
        """A WebSocket request: the worker's fetch gets it as a GET with `Upgrade: websocket`; a
        101 with a socket attaches the client to it, anything else is the handshake's answer."""
        path = websocket.scope["path"]
        if path.startswith(("/cdn-cgi", "/client/v4")):  # the runtime's own: never a worker's
            await websocket.close(1008, "no WebSocket is served under the runtime's own paths")
            return
        request = _UpgradeRequest(websocket)
        try:
            ctx = self.locator.locate(request)
        except TopologyError as exc:
            await _deny(websocket, error_response(400, BAD_LOCATION, f"{LOCATION_HEADER}: {exc}"))
            return
        ray = {"cf-ray": f"{ray_id()}-{ctx.ingress.code}"}
        addressed = target(request)
        handle = self.workers.dev if addressed is None else self.workers.worker(*addressed, request=request)
        if handle is None:
            await _deny(
                websocket, error_response(404, NO_SUCH_WORKER, f"no worker {addressed[1]!r} is deployed")
            )
            return
        response = await handle.serve(request, b"", ctx, ray)
        if isinstance(response, SocketUpgrade):
            await self.sockets.serve_client(websocket, response)
        else:
            await _deny(websocket, response)


class _UpgradeRequest:
    """A WebSocket request as the worker path reads a request: a GET at its http(s) URL."""

    method = "GET"

    def __init__(self, websocket: WebSocket):
        self.scope, self.headers = websocket.scope, websocket.headers
        url = str(websocket.url)
        self.url = URL("http" + url[2:] if url.startswith("ws") else url)


async def _deny(websocket: WebSocket, response: Response) -> None:
    """The worker did not take the socket: its response answers the handshake where the server
    can send one, else the socket closes with its status in the reason. The answer is rebuilt
    whole: its body read (a stream's, up to DENIAL_BYTES within DENIAL_S), its headers but
    those of the connection and the body's framing, and one Content-Length of its own (an object's
    response passed on by a worker carries its own, which the server must not see twice)."""
    body = await _denial_body(response)
    if "websocket.http.response" not in websocket.scope.get("extensions", {}):
        await websocket.close(1008, f"the worker answered {response.status_code}, not 101")
        return
    denial = Response(body, status_code=response.status_code)
    denial.raw_headers.extend(
        (name, value) for name, value in response.raw_headers if name.lower() not in _FRAMING
    )
    await websocket.send_denial_response(denial)


DENIAL_BYTES = 64 * 1024  # of a streamed answer to a WebSocket request, what its client is sent
DENIAL_S = 10.0  # how long a streamed answer to a WebSocket request may take to arrive
# set by the server for the answer it sends, never passed on from the worker's
_FRAMING = {b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"upgrade"}


async def _denial_body(response: Response) -> bytes:
    """A response's body, whole: a streaming one read (and closed) up to the bounds above."""
    if not hasattr(response, "body_iterator"):
        return bytes(response.body)
    chunks, size = [], 0
    iterator = response.body_iterator
    try:
        async with asyncio.timeout(DENIAL_S):
            async for chunk in iterator:
                data = chunk.encode() if isinstance(chunk, str) else bytes(chunk)
                chunks.append(data[: DENIAL_BYTES - size])
                size += len(chunks[-1])
                if size >= DENIAL_BYTES:
                    break
    except Exception:  # slow, or failed on the way: what arrived is the answer
        pass
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
    return b"".join(chunks)


def _asset_response(served: AssetResponse, headers: dict[str, str]) -> Response:
    response = Response(served.body, status_code=served.status)
    for name, value in [*served.headers, *headers.items()]:
        response.headers[name] = value
    return response
