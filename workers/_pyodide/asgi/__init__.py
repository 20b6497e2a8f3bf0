"""`asgi` for the edge runtime: the bridge Cloudflare's Python Workers use to run an ASGI app
(FastAPI, Starlette) inside a fetch handler, `return await asgi.fetch(app, request, self.env)`.

`fetch(app, request, env)` runs the app under ASGI 3: an `http` scope (method, path, raw_path,
query_string, headers as bytes, scheme, server, client, root_path, and `env`, as Cloudflare puts
the bindings in `request.scope["env"]`), the request body fed to `receive` chunk by chunk, and
`http.response.start` / `http.response.body` collected into a `workers.Response`: one body
message gives a plain body, more (`more_body`) a body streamed as the app sends it. An app that
speaks the lifespan protocol gets `lifespan.startup` once per isolate, before its first request.

A request with `Upgrade: websocket` runs the app under a `websocket` scope instead: `websocket.connect`
first, then each client message as `websocket.receive` (one at a time: the next waits until the app
has taken this one) and its close as `websocket.disconnect`; the app's `websocket.accept` answers
101 with a WebSocketPair's client end, `websocket.send` / `websocket.close` go to the client, and a
close before the accept answers 403. The app's handler keeps running after the 101, outside the
request that started it: its own binding calls after that are refused (the request has ended).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import workers

__all__ = ["fetch", "env"]

ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}
_END = object()  # the app's last body message
# (event loop, app) -> its lifespan startup: once per isolate (an isolate runs one loop)
_started: dict[tuple[int, int], asyncio.Future] = {}
_sockets: set[asyncio.Future] = set()  # the apps' WebSocket handlers still running
_alive: list[Any] = []  # the started apps, their loops and lifespan tasks: ids are never reused


def _scope(request: Any, env: Any, state: dict[str, Any]) -> dict[str, Any]:
    url = urllib.parse.urlsplit(request.url)
    scheme = url.scheme or "http"
    port = url.port or (443 if scheme == "https" else 80)
    path = urllib.parse.unquote(url.path or "/")
    headers = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in request.headers.items()]
    if not any(k == b"host" for k, _ in headers) and url.hostname:
        headers.insert(0, (b"host", url.netloc.encode("latin-1")))
    client = request.headers.get("cf-connecting-ip")
    return {
        "type": "http",
        "asgi": dict(ASGI_VERSION),
        "http_version": "1.1",
        "method": request.method,
        "scheme": scheme,
        "path": path,
        "raw_path": (url.path or "/").encode("latin-1"),
        "query_string": url.query.encode("latin-1"),
        "root_path": "",
        "headers": headers,
        "server": (url.hostname or "localhost", port),
        "client": (client, 0) if client else None,
        "state": dict(state),
        "env": env,
    }


async def _lifespan(app: Any) -> dict[str, Any]:
    """Start the app's lifespan once per isolate; its state dict is copied into every request's
    scope. An app that does not speak lifespan (raises, or returns at once) is simply started."""
    loop = asyncio.get_running_loop()
    key = (id(loop), id(app))
    if key not in _started:
        _alive.extend((loop, app))
        _started[key] = asyncio.ensure_future(_start(app))
    return await asyncio.shield(_started[key])


async def _start(app: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    done: asyncio.Future = asyncio.get_running_loop().create_future()
    shutdown = asyncio.Event()  # never set: an isolate ends without a shutdown event
    sent_startup = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_startup
        if not sent_startup:
            sent_startup = True
            return {"type": "lifespan.startup"}
        await shutdown.wait()
        return {"type": "lifespan.shutdown"}

    async def send(message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "lifespan.startup.complete" and not done.done():
            done.set_result(None)
        elif kind == "lifespan.startup.failed" and not done.done():
            done.set_exception(RuntimeError(f"ASGI lifespan startup failed: {message.get('message', '')}"))

    async def run() -> None:
        try:
            await app({"type": "lifespan", "asgi": dict(ASGI_VERSION), "state": state}, receive, send)
        except Exception as exc:  # an app without lifespan support raises on the unknown scope
            if not done.done():
                done.set_result(exc)
        else:
            if not done.done():
                done.set_result(None)

    _alive.append(asyncio.ensure_future(run()))  # runs for the isolate's life
    await done
    return state


async def _request_messages(request: Any) -> AsyncIterator[dict[str, Any]]:
    async for chunk in request.body:
        if chunk:
            yield {"type": "http.request", "body": bytes(chunk), "more_body": True}
    yield {"type": "http.request", "body": b"", "more_body": False}


async def _websocket(app: Any, request: Any, scope: dict[str, Any]) -> workers.Response:
    """The app under a websocket scope, its socket the server end of a WebSocketPair."""
    from workers.websocket import WebSocketPair

    scope.pop("method", None)
    scope["type"] = "websocket"
    scope["scheme"] = "wss" if scope["scheme"] == "https" else "ws"
    offered = request.headers.get("sec-websocket-protocol") or ""
    scope["subprotocols"] = [p.strip() for p in offered.split(",") if p.strip()]
    client, server = WebSocketPair()
    incoming: asyncio.Queue = asyncio.Queue(maxsize=16)
    answered: asyncio.Future = asyncio.get_running_loop().create_future()
    connected = False

    async def receive() -> dict[str, Any]:
        nonlocal connected
        if not connected:
            connected = True
            return {"type": "websocket.connect"}
        return await incoming.get()

    async def send(message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "websocket.accept":
            if answered.done():
                raise RuntimeError("ASGI app sent websocket.accept after its answer")
            server.accept()
            answered.set_result(message)
        elif kind == "websocket.send":
            if not answered.done() or answered.result().get("type") != "websocket.accept":
                raise RuntimeError("ASGI app sent websocket.send before websocket.accept")
            text = message.get("text")
            server.send(text if text is not None else bytes(message.get("bytes") or b""))
        elif kind == "websocket.close":
            if not answered.done():
                answered.set_result(message)
                return
            code, reason = message.get("code", 1000), message.get("reason") or ""
            try:
                server.close(code, reason)
            except TypeError:  # a code a worker may not send (1001-2999): closed as 1000
                server.close(1000, reason)
        else:
            raise RuntimeError(f"ASGI app sent {kind!r} on a WebSocket")

    async def on_message(event: Any) -> None:  # awaited: the next message waits for this one
        key = "text" if isinstance(event.data, str) else "bytes"
        await incoming.put({"type": "websocket.receive", key: event.data})

    async def on_close(event: Any) -> None:
        await incoming.put({"type": "websocket.disconnect", "code": event.code, "reason": event.reason})

    server.addEventListener("message", on_message)
    server.addEventListener("close", on_close)
    task = asyncio.ensure_future(app(scope, receive, send))
    waiting = asyncio.ensure_future(answered)
    await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
    if not answered.done():
        waiting.cancel()
        task.result()  # its exception, if any
        raise RuntimeError("ASGI app returned without websocket.accept or websocket.close")
    message = answered.result()
    if message.get("type") != "websocket.accept":
        return workers.Response("", status=403)
    _sockets.add(task)  # the app's handler runs on for the socket's life
    task.add_done_callback(_sockets.discard)
    headers = [
        (bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in message.get("headers") or []
    ]
    if message.get("subprotocol"):
        headers.append(("sec-websocket-protocol", str(message["subprotocol"])))
    return workers.Response(None, status=101, headers=headers, web_socket=client)


async def fetch(app: Any, request: Any, env: Any = None, ctx: Any = None) -> workers.Response:
    """Run one request through the ASGI app; returns its response (streamed if the app streams)."""
    request = getattr(request, "js_object", request)
    state = await _lifespan(app)
    scope = _scope(request, env, state)
    if (request.headers.get("upgrade") or "").lower() == "websocket":
        return await _websocket(app, request, scope)
    messages = _request_messages(request)
    disconnected = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if disconnected.is_set():
            return {"type": "http.disconnect"}
        try:
            return await messages.__anext__()
        except StopAsyncIteration:
            await disconnected.wait()  # after the body, the next message is the client leaving
            return {"type": "http.disconnect"}

    start: asyncio.Future = asyncio.get_running_loop().create_future()
    chunks: asyncio.Queue = asyncio.Queue(maxsize=16)  # the app waits while the client is slow
    complete = False  # the app has sent its last body message

    async def send(message: dict[str, Any]) -> None:
        nonlocal complete
        kind = message.get("type")
        if kind == "http.response.start":
            if start.done():
                raise RuntimeError("ASGI app sent http.response.start twice")
            start.set_result(message)
        elif kind == "http.response.body":
            if not start.done():
                raise RuntimeError("ASGI app sent http.response.body before http.response.start")
            if disconnected.is_set():
                raise OSError("the client has gone")
            if complete:
                raise RuntimeError("ASGI app sent http.response.body after its last one")
            await chunks.put(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                complete = True
                await chunks.put(_END)
        # other messages (http.response.trailers, pathsend...) are not simulated: ignored

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            disconnected.set()
            if start.done() and not complete:
                await chunks.put(_END)  # ends the body if the app returned without more_body=False

    task = asyncio.ensure_future(run())
    waiting = asyncio.ensure_future(start)
    await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
    if not start.done():  # the app ended (or raised) before it started a response
        waiting.cancel()
        task.result()  # its exception, if any
        raise RuntimeError("ASGI app returned without sending http.response.start")
    message = start.result()
    headers = workers.Headers(
        [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in message.get("headers", [])]
    )
    status = int(message["status"])
    # a body complete by now (one message, the usual case) is sent whole; else it streams as sent
    body: list[bytes] = []
    while not chunks.empty():
        item = await chunks.get()
        if item is _END:
            await task
            return workers.Response(b"".join(body), status=status, headers=headers)
        body.append(item)
    if task.done():  # ended without a last body message: what it sent is the body
        task.result()
        return workers.Response(b"".join(body), status=status, headers=headers)

    async def stream() -> AsyncIterator[bytes]:
        try:
            for item in body:
                if item:
                    yield item
            while (item := await chunks.get()) is not _END:
                if item:
                    yield item
            await task
        finally:
            if not task.done():
                disconnected.set()
                task.cancel()

    return workers.Response(stream(), status=status, headers=headers)


def __getattr__(name: str) -> Any:
    """`asgi.env`: as in Cloudflare's bridge, a FastAPI dependency giving `request.scope["env"]`
    (`async def route(env=asgi.env)`); only where FastAPI is importable."""
    if name == "env":
        from fastapi import Depends, Request

        async def _env(request: Request) -> Any:
            return request.scope["env"]

        return Depends(_env)
    raise AttributeError(f"module 'asgi' has no attribute {name!r}")
