"""WebSockets as a worker sees them: `WebSocketPair` (also `js.WebSocketPair`), the server end's
`accept()`, `send()`, `close()`, `addEventListener("message" | "close" | "error", handler)`, and
for Durable Objects `ctx.acceptWebSocket(ws, tags)` / `ctx.getWebSockets(tag)` with
`serializeAttachment` / `deserializeAttachment`.

    client, server = WebSocketPair.new().object_values()   # or: client, server = WebSocketPair()
    server.accept()
    server.addEventListener("message", lambda event: server.send(event.data))
    return Response(None, status=101, web_socket=client)

The runtime holds the client's connection; frames cross to it through the transport the isolate
installs (`_install`). Each message delivered to the worker is an event of its own (its own CPU
budget and binding calls). A message is at most MESSAGE_BYTES, as on Cloudflare.

This package runs inside the isolate and imports nothing of the runtime's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from workers.rpc_values import check_rpc_value

MESSAGE_BYTES = 1024 * 1024  # Cloudflare's limit on one WebSocket message
ATTACHMENT_BYTES = 2048  # serializeAttachment: Cloudflare's limit (the runtime checks it encoded)
TAGS, TAG_CHARS = 10, 256  # acceptWebSocket: at most 10 tags of at most 256 characters
HELD_MAX = 32768  # hibernated sockets one object may get back (Cloudflare's per-object limit)
EVENTS = ("message", "close", "error", "open")
CONNECTING, OPEN, CLOSING, CLOSED = 0, 1, 2, 3


class SocketTransport:
    """How a server end reaches the runtime (set by the isolate; None outside one)."""

    def send(self, ws: int, data: str | bytes) -> None:  # pragma: no cover - the isolate's
        raise NotImplementedError

    def close(self, ws: int, code: int, reason: str) -> None:  # pragma: no cover
        raise NotImplementedError

    def attach(self, ws: int, value: Any) -> None:  # pragma: no cover
        raise NotImplementedError


_transport: SocketTransport | None = None
_ids = itertools.count(1)
# the server ends of this isolate that a 101 carried out (the runtime holds their clients), by id;
# a pair never returned is only the script's, and goes with its last reference
sockets: dict[int, WebSocket] = {}


def _install(transport: SocketTransport, first_id: int = 1) -> None:
    global _transport, _ids
    _transport, _ids = transport, itertools.count(max(1, int(first_id)))


def check_close(code: Any, reason: Any) -> tuple[int, str]:
    if code is None:
        code = 1000
    if not isinstance(code, int) or isinstance(code, bool) or not (code == 1000 or 3000 <= code <= 4999):
        raise TypeError(f"close: the code must be 1000 or in 3000-4999, got {code!r}")
    reason = "" if reason is None else str(reason)
    if len(reason.encode()) > 123:
        raise ValueError("close: the reason is at most 123 bytes")
    return code, reason


class WebSocket:
    """One end of a WebSocketPair. The client end is only handed to Response(web_socket=...);
    the server end is the worker's."""

    def __init__(self, ws_id: int, server: bool):
        self._id, self._server = ws_id, server
        self.readyState = CONNECTING if server else OPEN  # noqa: N815 - Cloudflare's name
        self._listeners: dict[str, list[Callable]] = {}
        self._accepted = False
        self._tags: list[str] | None = None  # set: accepted by ctx.acceptWebSocket (hibernatable)
        self._attachment: Any = None
        self._live = False  # the runtime holds a client connection for it
        self._token: str | None = None  # a socket another worker's object answered with (stub.fetch)
        self._pending: list[tuple[str, Any]] = []  # sent before the response carried it out
        self._peer: WebSocket | None = None  # a client end's server end

    # --- the server end -----------------------------------------------------------------------------

    def accept(self) -> None:
        self._must_be_server("accept")
        if self._accepted:
            raise RuntimeError("accept: this WebSocket is already accepted")
        self._accepted = True
        self.readyState = OPEN

    def send(self, message: str | bytes | bytearray | memoryview) -> None:
        self._must_be_server("send")
        if not self._accepted:
            raise RuntimeError("send: accept() the WebSocket (or ctx.acceptWebSocket it) first")
        if self.readyState != OPEN:
            raise RuntimeError("send: the WebSocket is closed")
        if isinstance(message, (bytearray, memoryview)):
            message = bytes(message)
        if not isinstance(message, (str, bytes)):
            raise TypeError(f"send: a message is str or bytes, got {type(message).__name__}")
        size = len(message.encode("utf-8", "surrogatepass")) if isinstance(message, str) else len(message)
        if size > MESSAGE_BYTES:
            raise ValueError(
                f"send: a message is at most {MESSAGE_BYTES // 2**20} MiB, this one {size} bytes"
            )
        if self._live and _transport is not None:
            _transport.send(self._id, message)
        elif len(self._pending) < 64:
            self._pending.append(("send", message))
        else:
            raise RuntimeError("send: at most 64 messages before the 101 response carries the socket out")

    def close(self, code: int | None = 1000, reason: str | None = None) -> None:
        self._must_be_server("close")
        code, reason = check_close(code, reason)
        if self.readyState in (CLOSING, CLOSED):
            return
        self.readyState = CLOSED
        sockets.pop(self._id, None)
        if self._live and _transport is not None:
            _transport.close(self._id, code, reason)
        else:
            self._pending.append(("close", (code, reason)))

    def addEventListener(self, kind: str, handler: Callable) -> None:  # noqa: N802 - Cloudflare's name
        self._must_be_server("addEventListener")
        if kind not in EVENTS:
            raise TypeError(f"addEventListener: the event is one of {', '.join(EVENTS)}, got {kind!r}")
        if not callable(handler):
            raise TypeError("addEventListener: the handler must be callable")
        listeners = self._listeners.setdefault(kind, [])
        if len(listeners) >= 64:
            raise RuntimeError("addEventListener: at most 64 listeners per event")
        listeners.append(handler)

    def removeEventListener(self, kind: str, handler: Callable) -> None:  # noqa: N802
        if handler in self._listeners.get(kind, []):
            self._listeners[kind].remove(handler)

    def serializeAttachment(self, value: Any) -> None:  # noqa: N802 - Cloudflare's name
        """Keep a JSON-like value with the socket (at most ATTACHMENT_BYTES): it survives the
        object's hibernation, as the socket does."""
        check_rpc_value(value, "serializeAttachment")
        self._attachment = value
        if self._live and _transport is not None:
            _transport.attach(self._id, value)

    def deserializeAttachment(self) -> Any:  # noqa: N802 - Cloudflare's name
        return self._attachment

    def _must_be_server(self, what: str) -> None:
        if not self._server:
            raise TypeError(f"{what}: this is the client end; use the server end of the pair")

    def _gone_live(self) -> None:
        """The response carried it out: the runtime holds its client now; send what waited."""
        self._live = True
        if self.readyState == OPEN:  # a pair joins the isolate's sockets only once it is carried out
            sockets[self._id] = self
        pending, self._pending = self._pending, []
        for kind, value in pending:
            if _transport is None:
                break
            if kind == "send":
                _transport.send(self._id, value)
            else:
                _transport.close(self._id, *value)

    # --- snake_case, as the SDK also reads ----------------------------------------------------------

    add_event_listener = addEventListener
    remove_event_listener = removeEventListener
    serialize_attachment = serializeAttachment
    deserialize_attachment = deserializeAttachment

    def __repr__(self) -> str:
        return f"WebSocket({'server' if self._server else 'client'} {self._id})"


def forwarded(token: str) -> WebSocket:
    """The client end of a socket a Durable Object answered stub.fetch with: the worker may
    return it in its own Response(status=101, web_socket=...)."""
    ws = WebSocket(0, server=False)
    ws._token = token
    return ws


def held(ws_id: int, tags: list[str] | None, attachment: Any) -> WebSocket:
    """A socket the runtime held while the object hibernated, as the woken object sees it again."""
    ws = WebSocket(ws_id, server=True)
    ws._accepted, ws.readyState, ws._live = True, OPEN, True
    ws._tags, ws._attachment = tags, attachment
    sockets[ws_id] = ws
    return ws


class WebSocketPair:
    """`WebSocketPair()` / `WebSocketPair.new()`: a (client, server) pair; `object_values()`,
    `pair[0]` / `pair[1]` and unpacking (`client, server = WebSocketPair()`) all give both."""

    def __init__(self) -> None:
        ws_id = next(_ids)
        self.client, self.server = WebSocket(ws_id, server=False), WebSocket(ws_id, server=True)
        self.client._peer = self.server  # what a 101 with this client end carries out

    @classmethod
    def new(cls) -> WebSocketPair:
        return cls()

    def object_values(self) -> tuple[WebSocket, WebSocket]:
        return self.client, self.server

    def __iter__(self):
        return iter((self.client, self.server))

    def __getitem__(self, index: int) -> WebSocket:
        return (self.client, self.server)[index]


def accept_hibernatable(ws: Any, tags: Any = None) -> None:
    """ctx.acceptWebSocket(ws, tags): the object accepts the server end so that it may hibernate
    while the socket stays open; its events come to webSocketMessage / webSocketClose /
    webSocketError."""
    if not isinstance(ws, WebSocket) or not ws._server:
        raise TypeError("acceptWebSocket: pass the server end of a WebSocketPair")
    tags = list(tags or [])
    if len(tags) > TAGS or not all(isinstance(t, str) and 0 < len(t) <= TAG_CHARS for t in tags):
        raise TypeError(f"acceptWebSocket: at most {TAGS} tags, each a string of 1-{TAG_CHARS} characters")
    ws.accept()
    ws._tags = tags


def hibernatable(tag: str | None = None) -> list[WebSocket]:
    """ctx.getWebSockets(tag): the object's open sockets accepted with acceptWebSocket."""
    return [
        ws for ws in sockets.values()
        if ws._tags is not None and ws.readyState == OPEN and (tag is None or tag in ws._tags)
    ]  # fmt: skip
