"""The runtime's answers to an isolate's calls: AI, outbound fetch, bindings (KV, D1, R2) and
Durable Objects, at most MAX_CALLS of them at once, and the synchronous channel a Durable
Object's storage.sql.exec blocks on. Every reply is held to the size the isolate will take.

A call belongs to the request (the Invoke) that made it and never outlives it: when the request is
over (its RequestDone, its wall time spent, the client gone, the isolate stopped), every call it
still has in flight is cancelled (a queued store call dropped, a running statement interrupted, an
AI generation cancelled at its PoP) and the isolate told that its request has ended."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.isolate import ipc
from runtime.isolate.host import IsolateHost

log = logging.getLogger("edge.isolate")

BindingHandler = Callable[[ipc.BindingCall], Awaitable[ipc.BindingReply]]
Call = (
    ipc.AIRun
    | ipc.AIQuery
    | ipc.AIGatewayCall
    | ipc.AIGatewayRun
    | ipc.FetchCall
    | ipc.BindingCall
    | ipc.ObjectCall
)

MAX_CALLS = 64  # AI, fetch and binding calls one isolate may have outstanding at once
ENDED = "the request that made this call has ended"
TOO_MANY = f"more than {MAX_CALLS} AI, fetch, binding and Durable Object calls at once from one isolate"


class ProtocolError(Exception):
    """The isolate sent what the protocol does not allow: the runtime stops it."""


@dataclass(frozen=True)
class Link:
    """How the isolate's parts reach its process: `send` writes a message if the isolate is
    still connected; `deliver` does so and waits for the socket to take it, False when the
    isolate is gone; `spawn` runs a task the isolate holds on to."""

    send: Callable[[ipc.Message], None]
    deliver: Callable[[ipc.Message], Awaitable[bool]]
    spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task]


@dataclass(frozen=True)
class CallKind:
    """One kind of call in the table below: the host's method that answers it, and its refusal."""

    answer: Callable[[IsolateHost, Any], Awaitable[Any]]
    refusal: Callable[[int, str], ipc.Message]


# The isolate's calls, by message type: what answers each and how it is refused (too many at
# once, its request ended). An AI call's error is Workers AI's out-of-capacity code (3040).
CALLS: dict[type, CallKind] = {
    ipc.AIRun: CallKind(
        lambda host, call: host.ai(call),
        lambda call, why: ipc.AIReply(call, error_code=3040, error_message=why),
    ),
    ipc.AIQuery: CallKind(
        lambda host, call: host.ai_query(call),
        lambda call, why: ipc.BindingReply(call, error_type="Error", error_message=why),
    ),
    ipc.AIGatewayCall: CallKind(
        lambda host, call: host.ai_gateway(call),
        lambda call, why: ipc.BindingReply(call, error_type="Error", error_message=why),
    ),
    ipc.AIGatewayRun: CallKind(
        lambda host, call: host.ai_gateway_run(call),
        lambda call, why: ipc.AIReply(call, error_code=3040, error_message=why),
    ),
    ipc.FetchCall: CallKind(
        lambda host, call: host.fetch(call), lambda call, why: ipc.FetchReply(call, error=why)
    ),
    ipc.BindingCall: CallKind(
        lambda host, call: host.binding(call),
        lambda call, why: ipc.BindingReply(call, error_type="Error", error_message=why),
    ),
    ipc.ObjectCall: CallKind(
        lambda host, call: host.object(call),
        lambda call, why: ipc.ObjectReply(call, error_type="Error", error_message=why),
    ),
}


class CallDesk:
    """Answers one isolate's calls on its main channel, each in a task of its own, by `host`."""

    def __init__(self, host: IsolateHost, link: Link):
        self._host = host
        self._send, self._deliver = link.send, link.deliver
        self._calls = 0  # calls being answered
        self._by_request: dict[int, set[asyncio.Task]] = {}  # each request's calls in flight
        self._by_call: dict[int, tuple[int, asyncio.Task]] = {}  # call id -> (its request, its task)

    def take(self, msg: Call) -> None:
        """A call from the isolate: answered in the background, as its request's, or refused at
        once when MAX_CALLS are already being answered."""
        kind = CALLS[type(msg)]
        if self._calls >= MAX_CALLS:
            self._send(kind.refusal(msg.call, TOO_MANY))
            return
        self._calls += 1
        task = asyncio.create_task(self._answer(msg, kind))  # held in _by_request until done
        calls = self._by_request.setdefault(msg.request, set())
        calls.add(task)
        self._by_call[msg.call] = (msg.request, task)
        task.add_done_callback(lambda done, rid=msg.request, cid=msg.call: self._forget(rid, cid, done))

    def cancel(self, call: int) -> None:
        """The isolate aborted call `call` (an AI call's AbortSignal, or the worker stopped reading
        its stream): cancelled as its request's end would cancel it, alone."""
        held = self._by_call.get(call)
        if held is not None:
            held[1].cancel()

    def in_flight(self, request: int) -> int:
        """The calls `request` has in flight."""
        return len(self._by_request.get(request, ()))

    def end(self, request: int) -> None:
        """`request` is over: its calls still in flight are cancelled (each answers ENDED)."""
        for task in self._by_request.pop(request, ()):
            task.cancel()

    def end_all(self) -> None:
        for request in list(self._by_request):
            self.end(request)

    def _forget(self, request: int, call: int, task: asyncio.Task) -> None:
        if self._by_call.get(call, (None, None))[1] is task:
            del self._by_call[call]
        calls = self._by_request.get(request)
        if calls is not None:
            calls.discard(task)
            if not calls:
                del self._by_request[request]

    async def _answer(self, call: Call, kind: CallKind) -> None:
        """One call answered by the host: its reply (an AI stream's chunks, each as the socket
        takes it); a failure on the runtime's side, or a reply too large for the isolate to take,
        comes back as an error; cancelled with its request, it answers ENDED."""
        try:
            try:
                reply = await kind.answer(self._host, call)
            except Exception as exc:  # the runtime's side failed: tell the worker, keep serving
                log.exception("%s failed", type(call).__name__)
                reply = kind.refusal(call.call, f"internal error: {type(exc).__name__}")
            if hasattr(reply, "__aiter__"):  # a stream: each chunk as the isolate's socket takes it
                try:
                    async for msg in reply:
                        if not await self._deliver(msg):
                            return
                finally:
                    await reply.aclose()  # cut here: its generation ends at the PoP now
                return
            if len(ipc.encode(reply)) > ipc.TO_ISOLATE:  # the isolate would take it as an attack
                reply = kind.refusal(call.call, "the result is too large to return")
            await self._deliver(reply)
        except asyncio.CancelledError:
            self._send(kind.refusal(call.call, ENDED))
            raise
        finally:
            self._calls -= 1


async def serve_sync(
    name: str, sock: socket.socket, on_binding: BindingHandler, stop: Callable[[], Awaitable[None]]
) -> None:
    """The synchronous channel: one BindingCall at a time, each answered before the next (the
    isolate is blocked meanwhile); anything else on it, or a frame over the limit, ends it and
    stops the isolate."""
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=ipc.CHUNK)
    try:
        while True:
            msg = await ipc.read_message(reader, ipc.FROM_ISOLATE)
            if not isinstance(msg, ipc.BindingCall):
                raise ProtocolError(f"{type(msg).__name__} on the synchronous channel")
            reply = await on_binding(msg)
            if not isinstance(reply, ipc.BindingReply):  # a streamed answer (AI Search's): not here
                if hasattr(reply, "aclose"):
                    await reply.aclose()
                reply = ipc.BindingReply(
                    msg.call, error_type="TypeError", error_message=f"{msg.method[:64]} cannot be called here"
                )
            frame = ipc.encode(reply)
            if len(frame) > ipc.TO_ISOLATE:
                frame = ipc.encode(
                    ipc.BindingReply(msg.call, error_type="Error", error_message="the result is too large")
                )
            writer.write(frame)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    except (ValueError, msgspec.DecodeError, ProtocolError) as exc:
        log.warning("isolate for %s broke the synchronous channel: %s", name, exc)
        await stop()
    finally:
        writer.close()
