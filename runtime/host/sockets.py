"""WebSockets: the runtime holds every client connection (uvicorn terminates it), the worker
holds the server end, and frames cross the isolate channel between the two, bounded both ways.

    client --ws--> WorkerFront.handle_websocket -> the worker's fetch (a GET with Upgrade) ->
      Response(status=101, web_socket=client) -> ServerSocket, owned by that worker's isolate
      (or by a Durable Object, whose accepted sockets outlive its isolate: hibernation)

Each client message is an event for the worker (SocketEvent), run one at a time per socket, in
order; at most INBOX_FRAMES / INBOX_BYTES wait for it, past which the client is cut (1008: it
sends faster than the worker reads). What the worker sends waits in an outbox of at most
OUTBOX_FRAMES / OUTBOX_BYTES for the client to take, past which the client is cut (1008: it
does not read). A message over MESSAGE_BYTES is cut with 1009. One isolate or object holds at
most PER_OWNER sockets, one account ACCOUNT_SOCKETS; a socket an object answered stub.fetch with
that its worker does not pass on to a client within OFFER_S is cut (1011) and counted no longer.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.responses import Response
from starlette.websockets import WebSocket

from runtime.isolate import ipc
from workers.websocket import ATTACHMENT_BYTES, MESSAGE_BYTES, TAG_CHARS, TAGS

log = logging.getLogger("edge.websockets")

WIRE_BYTES = 4 * MESSAGE_BYTES  # uvicorn's own frame limit (over it the protocol closes 1009)
WIRE_QUEUE = 4  # frames uvicorn buffers before it stops reading the client
INBOX_FRAMES, INBOX_BYTES = 64, 4 * MESSAGE_BYTES  # client messages waiting for the worker
OUTBOX_FRAMES, OUTBOX_BYTES = 256, 4 * MESSAGE_BYTES  # worker messages waiting for the client
PER_OWNER = 64  # sockets one worker isolate or one Durable Object holds at once
ACCOUNT_SOCKETS = 512  # sockets of one account at once
OFFER_S = 30.0  # a socket an object answered stub.fetch with must reach a client within this
CLOSE_S = 5.0  # a client's close handshake may take this long

_encoder = msgspec.msgpack.Encoder()

# (socket, event) -> None: run the event in the worker or object that holds the socket
Deliver = Callable[["ServerSocket", "SocketEvent"], Awaitable[None]]


class SocketEvent(msgspec.Struct, frozen=True):
    kind: str  # "message" | "close" | "error"
    text: str | None = None
    data: bytes | None = None
    code: int = 1005
    reason: str = ""
    was_clean: bool = True

    def message(self, rid: int, ws: int) -> ipc.SocketEvent:
        return ipc.SocketEvent(
            rid, ws, self.kind, self.text, self.data, self.code, self.reason, self.was_clean
        )


def _size(text: str | None, data: bytes | None) -> int:
    return len(text.encode("utf-8", "surrogatepass")) if text is not None else len(data or b"")


class ServerSocket:
    """One WebSocket as the runtime holds it: the client connection (once attached), what waits
    for each side, and for an object's accepted socket its tags and attachment."""

    def __init__(self, owner: SocketOwner, ws: int, generation: int, tags: list[str] | None, attachment: Any):
        self.owner, self.ws, self.generation = owner, ws, generation
        self.tags, self.attachment = tags, attachment
        self.client: WebSocket | None = None
        self.closed = False
        self.outbox: deque[tuple[str, Any]] = deque()
        self.out_bytes = 0
        self.out_ready = asyncio.Event()
        self.inbox: deque[SocketEvent] = deque()
        self.in_bytes = 0
        self.in_ready = asyncio.Event()

    @property
    def hibernatable(self) -> bool:
        return self.tags is not None

    # --- from the worker ------------------------------------------------------------------------

    def send(self, text: str | None, data: bytes | None) -> None:
        if self.closed or (text is None) == (data is None):
            return
        size = _size(text, data)
        if size > MESSAGE_BYTES:  # the SDK refuses these; an isolate that sends one anyway: cut
            self.cut(1009, f"the worker sent a message of {size} bytes, over {MESSAGE_BYTES // 2**20} MiB")
            return
        if len(self.outbox) >= OUTBOX_FRAMES or self.out_bytes + size > OUTBOX_BYTES:
            self.cut(
                1008,
                f"the client is not reading: over {OUTBOX_FRAMES} messages or {OUTBOX_BYTES // 2**20} MiB "
                "wait to be sent to it",
            )
            return
        self.outbox.append(("text", text) if text is not None else ("bytes", data))
        self.out_bytes += size
        self.out_ready.set()

    def close_by_worker(self, code: int, reason: str) -> None:
        if self.closed:
            return
        code = code if code == 1000 or 3000 <= code <= 4999 else 1000
        self._end(code, reason[:123])

    def cut(self, code: int, reason: str, tell_worker: bool = True) -> None:
        """The runtime ends the socket: the client gets `code` and `reason`; the worker, unless
        it is gone, a close event with them."""
        if self.closed:
            return
        log.warning("WebSocket of %s closed (%d): %s", self.owner.label, code, reason)
        self.outbox.clear()
        self.out_bytes = 0
        told = tell_worker and self.client is not None  # a client's session delivers the close
        self._end(code, reason, forget=not told)
        if told:
            self.inbox.clear()
            self.in_bytes = 0
            self.inbox.append(SocketEvent("close", code=code, reason=reason, was_clean=False))
            self.in_ready.set()

    def _end(self, code: int, reason: str, forget: bool = True) -> None:
        """Closed: the client is sent the close; the owner forgets it now, or (`forget` False)
        once the worker has had its close event (a woken object gets the socket back for it)."""
        self.closed = True
        self.outbox.append(("close", (code, reason)))
        self.out_ready.set()
        self.in_ready.set()
        if forget:
            self.owner.forget(self)

    # --- from the client ------------------------------------------------------------------------

    def received(self, text: str | None, data: bytes | None) -> None:
        size = _size(text, data)
        if size > MESSAGE_BYTES:
            self.cut(1009, f"a message of {size} bytes is over the {MESSAGE_BYTES // 2**20} MiB limit")
            return
        if len(self.inbox) >= INBOX_FRAMES or self.in_bytes + size > INBOX_BYTES:
            self.cut(
                1008,
                f"over {INBOX_FRAMES} messages wait for the worker: the client sends faster than the worker "
                "reads; wait for replies, or send less",
            )
            return
        self.inbox.append(SocketEvent("message", text, data))
        self.in_bytes += size
        self.in_ready.set()

    def client_left(self, code: int, reason: str) -> None:
        if self.closed:
            return
        self.closed = True  # forgotten once the worker has had the close event
        self.out_ready.set()  # the writer has nothing more to wait for
        if code == 1006:  # gone without a close frame: an error (webSocketError), not a close
            self.inbox.append(SocketEvent("error", code=code, reason=reason or "the connection broke"))
        else:
            self.inbox.append(SocketEvent("close", code=code, reason=reason, was_clean=True))
        self.in_ready.set()


class SocketOwner:
    """The sockets one worker isolate, or one Durable Object, holds; `deliver` runs an event in it."""

    def __init__(self, hub: SocketHub, account: str, label: str, deliver: Deliver):
        self.hub, self.account, self.label, self.deliver = hub, account, label, deliver
        self.sockets: dict[int, ServerSocket] = {}
        self.next_id = 1  # ids a new isolate of this owner gives its pairs start here

    def open(self, offer: ipc.SocketOffer, generation: int) -> ServerSocket | str:
        """A socket the worker's 101 response carried out; a string says why it is refused."""
        if not isinstance(offer.ws, int) or offer.ws < 1 or offer.ws in self.sockets:
            return "the response's WebSocket is not a new one of this worker"
        self.hub.expire_offers()  # what was offered and never passed on counts no longer
        if len(self.sockets) >= PER_OWNER:
            return f"more than {PER_OWNER} WebSockets open in this worker or object; close some first"
        if self.hub.count(self.account) >= ACCOUNT_SOCKETS:
            return f"more than {ACCOUNT_SOCKETS} WebSockets open in this account"
        tags = offer.tags
        if tags is not None and (
            len(tags) > TAGS or not all(isinstance(t, str) and 0 < len(t) <= TAG_CHARS for t in tags)
        ):
            return f"acceptWebSocket: at most {TAGS} tags of 1-{TAG_CHARS} characters"
        if not _attachment_fits(offer.attachment):
            return f"serializeAttachment: at most {ATTACHMENT_BYTES} bytes"
        sock = ServerSocket(self, offer.ws, generation, tags, offer.attachment)
        self.sockets[offer.ws] = sock
        self.next_id = max(self.next_id, offer.ws + 1)
        self.hub.opened(self.account)
        return sock

    def from_isolate(self, msg: ipc.SocketSend | ipc.SocketClose | ipc.SocketAttach) -> None:
        sock = self.sockets.get(msg.ws)
        if sock is None:  # closed meanwhile, or never this isolate's: nothing to do
            return
        if isinstance(msg, ipc.SocketSend):
            sock.send(msg.text, msg.data)
        elif isinstance(msg, ipc.SocketClose):
            sock.close_by_worker(msg.code, msg.reason)
        elif _attachment_fits(msg.value):
            sock.attachment = msg.value
        else:
            sock.cut(1011, f"serializeAttachment: the attachment is over {ATTACHMENT_BYTES} bytes")

    def forget(self, sock: ServerSocket) -> None:
        if self.sockets.get(sock.ws) is sock:
            del self.sockets[sock.ws]
            self.hub.closed(self.account)

    def held(self) -> list[ipc.HeldSocket]:
        """The sockets a new isolate of this owner gets back (those accepted for hibernation)."""
        return [
            ipc.HeldSocket(s.ws, list(s.tags), s.attachment) for s in self.sockets.values() if s.hibernatable
        ]

    def isolate_gone(self) -> None:
        """The isolate stopped: a socket it held itself ends with it (1012); an object's accepted
        (hibernatable) ones stay, for its next isolate."""
        for sock in [s for s in self.sockets.values() if not s.hibernatable]:
            sock.cut(1012, "the worker's isolate stopped", tell_worker=False)

    def close_all(self, code: int, reason: str) -> None:
        for sock in list(self.sockets.values()):
            sock.cut(code, reason, tell_worker=False)


def _attachment_fits(value: Any) -> bool:
    try:
        return len(_encoder.encode(value)) <= ATTACHMENT_BYTES
    except (TypeError, OverflowError):
        return False


class SocketUpgrade(Response):
    """A worker's 101: the socket its client is to be attached to (only a WebSocket request can
    take it; an HTTP one gets an error instead)."""

    def __init__(self, socket: ServerSocket, headers: list[tuple[str, str]]):
        super().__init__(b"", status_code=101)
        self.socket = socket
        self.upgrade_headers = headers


class SocketHub:
    """Every socket of the runtime: counts per account, the sockets offered by an object through
    stub.fetch until the worker passes them on, and the client sessions."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._open: dict[str, int] = {}
        # token -> (account, socket, until, the timer that expires it where a loop runs)
        self._offers: dict[str, tuple[str, ServerSocket, float, asyncio.TimerHandle | None]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._clock = clock

    def count(self, account: str) -> int:
        return self._open.get(account, 0)

    def opened(self, account: str) -> None:
        self._open[account] = self._open.get(account, 0) + 1

    def closed(self, account: str) -> None:
        self._open[account] = max(0, self._open.get(account, 0) - 1)

    def offer(self, sock: ServerSocket) -> str:
        """An object answered stub.fetch with a socket: a token its worker's response passes on.
        Not passed on within OFFER_S, it expires: cut, and no longer counted (a timer does it;
        every check of the counts sweeps too, so a late timer never refuses a socket)."""
        self.expire_offers()
        token = secrets.token_urlsafe(24)
        try:
            timer = asyncio.get_running_loop().call_later(OFFER_S, self._expire, token)
        except RuntimeError:  # no loop (a test): the sweeps alone expire it
            timer = None
        self._offers[token] = (sock.owner.account, sock, self._clock() + OFFER_S, timer)
        return token

    def claim(self, token: Any, account: str) -> ServerSocket | None:
        """The socket behind a token, once, for a worker of the same account, within OFFER_S."""
        self.expire_offers()
        if not isinstance(token, str) or token not in self._offers or self._offers[token][0] != account:
            return None
        _, sock, _, timer = self._offers.pop(token)
        if timer is not None:
            timer.cancel()
        return sock

    def expire_offers(self) -> None:
        """Cut every offered socket whose time to be passed on is over."""
        now = self._clock()
        for token in [t for t, (_, _, until, _) in self._offers.items() if until <= now]:
            self._expire(token)

    def _expire(self, token: str) -> None:
        entry = self._offers.pop(token, None)
        if entry is None:  # claimed, or swept, meanwhile
            return
        _, sock, _, timer = entry
        if timer is not None:
            timer.cancel()
        sock.cut(1011, "the WebSocket was never passed on to a client")

    # --- a client's session -----------------------------------------------------------------------

    async def serve_client(self, websocket: WebSocket, upgrade: SocketUpgrade) -> None:
        """Attach the client to its socket and carry frames both ways until either side ends it."""
        sock = upgrade.socket
        protocol = next(
            (v for k, v in upgrade.upgrade_headers if k.lower() == "sec-websocket-protocol"), None
        )
        try:
            await websocket.accept(subprotocol=protocol)
        except Exception:  # the client left during the handshake
            sock.cut(1006, "the client left during the handshake")
            raise
        sock.client = websocket
        writer = asyncio.create_task(self._write(websocket, sock))
        self._spawn(self._deliver(sock))
        try:
            while not sock.closed:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    sock.client_left(int(message.get("code") or 1005), str(message.get("reason") or ""))
                    break
                sock.received(message.get("text"), message.get("bytes"))
        except Exception as exc:  # the connection broke
            sock.client_left(1006, f"{type(exc).__name__}")
        finally:
            try:
                await asyncio.wait_for(asyncio.shield(writer), CLOSE_S)
            except (TimeoutError, Exception):
                writer.cancel()

    async def _write(self, websocket: WebSocket, sock: ServerSocket) -> None:
        while True:
            if not sock.outbox:
                if sock.closed:
                    return
                sock.out_ready.clear()
                await sock.out_ready.wait()
                continue
            kind, value = sock.outbox.popleft()
            try:
                if kind == "close":
                    await websocket.close(*value)
                    return
                sock.out_bytes -= _size(value if kind == "text" else None, value if kind == "bytes" else None)
                if kind == "text":
                    await websocket.send_text(value)
                else:
                    await websocket.send_bytes(value)
            except Exception:  # the client is gone: the reader sees it too
                return

    async def _deliver(self, sock: ServerSocket) -> None:
        """The client's events for the worker, one at a time, in order, until the close."""
        while True:
            if not sock.inbox:
                if sock.closed:  # closed by the worker (or cut without telling it): nothing more
                    return
                sock.in_ready.clear()
                await sock.in_ready.wait()
                continue
            event = sock.inbox.popleft()
            if event.kind == "message":
                sock.in_bytes -= _size(event.text, event.data)
            try:
                await sock.owner.deliver(sock, event)
            except Exception:
                log.exception("WebSocket event of %s failed", sock.owner.label)
            finally:
                if event.kind != "message":
                    sock.owner.forget(sock)
            if event.kind != "message":
                return

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for _, _, _, timer in self._offers.values():
            if timer is not None:
                timer.cancel()
        for task in list(self._tasks):
            task.cancel()
