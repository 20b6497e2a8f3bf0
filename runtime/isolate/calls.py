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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.isolate import ipc

log = logging.getLogger("edge.isolate")

# An AI call is answered with an AIReply, or (stream: true) with AIChunks ending in an AIReply.
AIHandler = Callable[[ipc.AICall], Awaitable[ipc.AIReply | AsyncIterator[ipc.AIChunk | ipc.AIReply]]]
FetchHandler = Callable[[ipc.FetchCall], Awaitable[ipc.FetchReply]]
BindingHandler = Callable[[ipc.BindingCall], Awaitable[ipc.BindingReply]]
ObjectHandler = Callable[[ipc.ObjectCall], Awaitable[ipc.ObjectReply]]
Call = ipc.AICall | ipc.FetchCall | ipc.BindingCall | ipc.ObjectCall

MAX_CALLS = 64  # AI, fetch and binding calls one isolate may have outstanding at once
ENDED = "the request that made this call has ended"


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


async def no_fetch(call: ipc.FetchCall) -> ipc.FetchReply:
    return ipc.FetchReply(call.call, error="outbound fetch is not available here")


async def no_object(call: ipc.ObjectCall) -> ipc.ObjectReply:
    return ipc.ObjectReply(
        call.call, error_type="Error", error_message="Durable Objects are not available here"
    )


async def no_binding(call: ipc.BindingCall) -> ipc.BindingReply:
    return ipc.BindingReply(call.call, error_type="Error", error_message="bindings are not available here")


class CallDesk:
    """Answers one isolate's calls on its main channel, each in a task of its own."""

    def __init__(
        self,
        ai: AIHandler,
        on_fetch: FetchHandler,
        on_binding: BindingHandler,
        on_object: ObjectHandler,
        link: Link,
    ):
        self._ai = ai
        self._on_fetch = on_fetch
        self._on_binding = on_binding
        self._on_object = on_object
        self._send, self._deliver, self._spawn = link.send, link.deliver, link.spawn
        self._calls = 0  # calls being answered
        self._by_request: dict[int, set[asyncio.Task]] = {}  # each request's calls in flight

    def take(self, msg: Call) -> None:
        """A call from the isolate: answered in the background, as its request's, or refused at
        once when MAX_CALLS are already being answered."""
        if self._calls >= MAX_CALLS:
            self._refuse_call(
                msg,
                f"more than {MAX_CALLS} AI, fetch, binding and Durable Object calls at once from one isolate",
            )
            return
        self._calls += 1
        if isinstance(msg, ipc.ObjectCall):
            task = self._spawn(self._answer_object(msg))
        elif isinstance(msg, ipc.BindingCall):
            task = self._spawn(self._answer_binding(msg))
        elif isinstance(msg, ipc.AICall):
            task = self._spawn(self._answer_ai(msg))
        else:
            task = self._spawn(self._answer_fetch(msg))
        calls = self._by_request.setdefault(msg.request, set())
        calls.add(task)
        task.add_done_callback(lambda done, rid=msg.request: self._forget(rid, done))

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

    def _forget(self, request: int, task: asyncio.Task) -> None:
        calls = self._by_request.get(request)
        if calls is not None:
            calls.discard(task)
            if not calls:
                del self._by_request[request]

    def _refuse_call(self, msg: Call, why: str) -> None:
        if isinstance(msg, ipc.ObjectCall):
            self._send(ipc.ObjectReply(msg.call, error_type="Error", error_message=why))
        elif isinstance(msg, ipc.BindingCall):
            self._send(ipc.BindingReply(msg.call, error_type="Error", error_message=why))
        elif isinstance(msg, ipc.AICall):
            self._send(ipc.AIReply(msg.call, error_code=3040, error_message=why))
        else:
            self._send(ipc.FetchReply(msg.call, error=why))

    def _ended(self, msg: Call) -> None:
        """A call cancelled with its request: the isolate hears so (if it still listens)."""
        if isinstance(msg, ipc.AICall):
            self._send(ipc.AIReply(msg.call, error_code=3007, error_message=ENDED))
        else:
            self._refuse_call(msg, ENDED)

    async def _answer_ai(self, call: ipc.AICall) -> None:
        try:
            reply = await self._ai(call)
            messages = reply if hasattr(reply, "__aiter__") else _single(reply)
            try:
                async for msg in messages:
                    if not await self._deliver(msg):
                        return
            finally:
                if hasattr(messages, "aclose"):
                    await messages.aclose()  # a stream cut here ends its generation at the PoP now
        except asyncio.CancelledError:
            self._ended(call)
            raise
        finally:
            self._calls -= 1

    async def _answer_fetch(self, call: ipc.FetchCall) -> None:
        try:
            try:
                reply = await self._on_fetch(call)
            except Exception as exc:  # the runtime's side failed: tell the worker, keep serving
                reply = ipc.FetchReply(call.call, error=f"fetch failed: {type(exc).__name__}: {exc}")
            await self._deliver(reply)
        except asyncio.CancelledError:
            self._ended(call)
            raise
        finally:
            self._calls -= 1

    async def _answer_binding(self, call: ipc.BindingCall) -> None:
        await self._answer_call(call, self._on_binding, _binding_error, "binding call")

    async def _answer_object(self, call: ipc.ObjectCall) -> None:
        await self._answer_call(call, self._on_object, _object_error, "Durable Object call")

    async def _answer_call(self, call, handler, error: Callable[[int, str], ipc.Message], what: str) -> None:
        """A binding or Durable Object call answered by the runtime: a failure on its side, or a
        reply too large for the isolate to take, comes back as an error message."""
        try:
            try:
                reply = await handler(call)
                if len(ipc.encode(reply)) > ipc.TO_ISOLATE:  # the isolate would take it as an attack
                    reply = error(call.call, "the result is too large to return")
            except Exception as exc:  # the runtime's side failed: tell the worker, keep serving
                log.exception("%s failed", what)
                reply = error(call.call, f"internal error: {type(exc).__name__}")
            await self._deliver(reply)
        except asyncio.CancelledError:
            self._ended(call)
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


async def _single(msg):
    yield msg


def _binding_error(call: int, message: str) -> ipc.BindingReply:
    return ipc.BindingReply(call, error_type="Error", error_message=message)


def _object_error(call: int, message: str) -> ipc.ObjectReply:
    return ipc.ObjectReply(call, error_type="Error", error_message=message)
