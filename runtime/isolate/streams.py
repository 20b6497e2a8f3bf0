"""The bodies streamed between the runtime and one isolate, each way at most ipc.WINDOW chunks
of ipc.CHUNK bytes in flight: a request body goes out as the isolate acknowledges its chunks
(RequestAck); a response body comes in as its client takes it (BodyAck), and an isolate that
sends more than ipc.WINDOW chunks ahead breaks the protocol."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from runtime.isolate import ipc
from runtime.isolate.calls import Link, ProtocolError
from runtime.isolate.types import IsolateCrashed
from runtime.isolate.watchdog import Watchdog

log = logging.getLogger("edge.isolate")


class _Body:
    """A streamed response body on its way to the client: the chunks the isolate sent that the
    client has not taken. The isolate may send at most ipc.WINDOW of them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.unacked = 0
        self.failure: Exception | None = None  # why the runtime ended it (a limit, a crash)


class Streams:
    """One isolate's streamed bodies; the watchdog says which requests still run, and hears when
    a response body has been read (its waitUntil time starts)."""

    def __init__(self, name: str, watchdog: Watchdog, link: Link):
        self._name = name
        self._watchdog = watchdog
        self._send, self._deliver, self._spawn = link.send, link.deliver, link.spawn
        self._bodies: dict[int, _Body] = {}  # streamed response bodies in flight
        self._upload_credit: dict[int, asyncio.Semaphore] = {}  # streamed request bodies

    # --- request bodies, to the isolate -----------------------------------------------------------

    def upload(self, rid: int, body: bytes | AsyncIterator[bytes]) -> None:
        """Send request rid's body in chunks, as fast as the worker reads it."""
        self._upload_credit[rid] = asyncio.Semaphore(ipc.WINDOW)
        self._spawn(self._upload(rid, body))

    async def _upload(self, rid: int, body: bytes | AsyncIterator[bytes]) -> None:
        credit = self._upload_credit[rid]
        error = None
        try:
            async for piece in _pieces(body):
                await credit.acquire()
                if not self._watchdog.running(rid) or not await self._deliver(ipc.RequestChunk(rid, piece)):
                    return  # the request ended: the rest of the body is not wanted
        except Exception as exc:  # the client's body failed or was too large: the worker hears why
            error = str(exc) or type(exc).__name__
        finally:
            self._upload_credit.pop(rid, None)
        if self._watchdog.running(rid):
            self._send(ipc.RequestEnd(rid, error))

    def acked(self, rid: int) -> None:
        """The isolate took a chunk of request rid's body: one more may go."""
        credit = self._upload_credit.get(rid)
        if credit is not None:
            credit.release()

    def end(self, rid: int) -> None:
        """Request rid is over: what is left of its body is not sent."""
        self._upload_credit.pop(rid, None)

    # --- response bodies, from the isolate --------------------------------------------------------

    def started(self, rid: int) -> None:
        """Request rid's response began with InvokeStart: its body follows."""
        self._bodies.setdefault(rid, _Body())

    def received(self, msg: ipc.BodyChunk | ipc.BodyEnd) -> None:
        body = self._bodies.get(msg.id)
        if body is not None:
            if isinstance(msg, ipc.BodyChunk):
                body.unacked += 1
                if body.unacked > ipc.WINDOW:
                    raise ProtocolError(f"more than {ipc.WINDOW} body chunks sent ahead of the client")
            body.queue.put_nowait(msg)

    async def read(self, request_id: int) -> AsyncIterator[bytes]:
        """See Isolate.body."""
        body = self._bodies.setdefault(request_id, _Body())
        ended = False
        try:
            while True:
                msg = await body.queue.get()
                if isinstance(msg, ipc.BodyEnd):
                    ended = True
                    if msg.error:  # the client must not take a cut-off body for a whole one
                        log.warning("[%s] streamed body failed: %s", self._name, msg.error)
                        raise body.failure or IsolateCrashed(f"the response stream failed: {msg.error}")
                    return
                body.unacked -= 1
                self._send(ipc.BodyAck(request_id))
                yield msg.data
        finally:
            self._bodies.pop(request_id, None)
            self._watchdog.answered(request_id, streaming=False)  # waitUntil work's time starts
            if not ended:
                self._send(ipc.Cancel(request_id))

    def streaming(self) -> list[int]:
        """The requests whose response bodies are in flight."""
        return list(self._bodies)

    def fail(self, rid: int, exc: Exception) -> None:
        """End request rid's response body (if it has one) with exc."""
        body = self._bodies.get(rid)
        if body is not None:
            body.failure = exc
            body.queue.put_nowait(ipc.BodyEnd(rid, str(exc)))


async def _pieces(body: bytes | AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A body in frames of at most ipc.CHUNK bytes."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        view = memoryview(body)
        for start in range(0, len(view), ipc.CHUNK):
            yield bytes(view[start : start + ipc.CHUNK])
        return
    async for chunk in body:
        view = memoryview(chunk)
        for start in range(0, len(view), ipc.CHUNK):
            yield bytes(view[start : start + ipc.CHUNK])
