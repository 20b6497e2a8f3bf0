"""The runtime's answers to an isolate's calls: AI, outbound fetch, bindings (KV, D1, R2) and
Durable Objects, at most MAX_CALLS of them at once, and the synchronous channel a Durable
Object's storage.sql.exec blocks on. Every reply is held to the size the isolate will take."""

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


class ProtocolError(Exception):
    """The isolate sent what the protocol does not allow: the runtime stops it."""


@dataclass(frozen=True)
class Link:
    """How the isolate's parts reach its process: `send` writes a message if the isolate is
    still connected; `deliver` does so and waits for the socket to take it, False when the
    isolate is gone; `spawn` runs a task the isolate holds on to."""

    send: Callable[[ipc.Message], None]
    deliver: Callable[[ipc.Message], Awaitable[bool]]
    spawn: Callable[[Coroutine[Any, Any, None]], None]


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

    def take(self, msg: Call) -> None:
        """A call from the isolate: answered in the background, or refused at once when
        MAX_CALLS are already being answered."""
        if self._calls >= MAX_CALLS:
            self._refuse_call(msg)
            return
        self._calls += 1
        if isinstance(msg, ipc.ObjectCall):
            self._spawn(self._answer_object(msg))
        elif isinstance(msg, ipc.BindingCall):
            self._spawn(self._answer_binding(msg))
        elif isinstance(msg, ipc.AICall):
            self._spawn(self._answer_ai(msg))
        else:
            self._spawn(self._answer_fetch(msg))

    def _refuse_call(self, msg: Call) -> None:
        why = f"more than {MAX_CALLS} AI, fetch, binding and Durable Object calls at once from one isolate"
        if isinstance(msg, ipc.ObjectCall):
            self._send(ipc.ObjectReply(msg.call, error_type="Error", error_message=why))
        elif isinstance(msg, ipc.BindingCall):
            self._send(ipc.BindingReply(msg.call, error_type="Error", error_message=why))
        elif isinstance(msg, ipc.AICall):
            self._send(ipc.AIReply(msg.call, error_code=3040, error_message=why))
        else:
            self._send(ipc.FetchReply(msg.call, error=why))

    async def _answer_ai(self, call: ipc.AICall) -> None:
        try:
            reply = await self._ai(call)
            messages = reply if hasattr(reply, "__aiter__") else _single(reply)
            async for msg in messages:
                if not await self._deliver(msg):
                    return
        finally:
            self._calls -= 1

    async def _answer_fetch(self, call: ipc.FetchCall) -> None:
        try:
            try:
                reply = await self._on_fetch(call)
            except Exception as exc:  # the runtime's side failed: tell the worker, keep serving
                reply = ipc.FetchReply(call.call, error=f"fetch failed: {type(exc).__name__}: {exc}")
            await self._deliver(reply)
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
