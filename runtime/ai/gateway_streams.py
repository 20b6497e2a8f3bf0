"""A streamed answer through AI Gateway: recorded while it streams (for the cache and the log), a
cached one replayed, and its first event read before it is handed on (requestTimeoutMs bounds
it; an error in it is raised, so that a stream is retried as a whole answer is).

A stream is cached as the event-stream bytes it sent, and only when it ended whole: the client read
it to its end, no event in it was an error (`data: {"error": ...}`, as runtime.ai.shapes sends a
failure that comes after the first event), and it is within the cache's size. A hit replays those
bytes unchanged, so a client reads the same events (and the same final `data: [DONE]`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from workers import AIError


@dataclass
class StreamOutcome:
    """What a stream turned out to be, once it ended: whole (read to its end without an error
    event), its error when one came, the usage its last event carried."""

    whole: bool = False
    error: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None


def read_outcome(data: bytes, whole: bool) -> StreamOutcome:
    """The error and usage in a recorded event stream (Workers AI's or OpenAI's shape)."""
    outcome = StreamOutcome(whole=whole)
    for line in data.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        try:
            event = json.loads(line[5:].strip())
        except ValueError:  # "[DONE]", or a line the recorder only saw part of
            continue
        if not isinstance(event, dict):
            continue
        if "error" in event:
            error = event["error"]
            outcome.error = str(error.get("message", error) if isinstance(error, dict) else error)[:1000]
            outcome.whole = False
        usage = event.get("usage")
        if isinstance(usage, dict):
            outcome.tokens_in = usage.get("prompt_tokens", outcome.tokens_in)
            outcome.tokens_out = usage.get("completion_tokens", outcome.tokens_out)
    return outcome


async def recorded(
    stream: AsyncIterator[bytes],
    limit: int,
    ended: Callable[[bytes | None, StreamOutcome], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """`stream` as it comes, recorded up to `limit` bytes; `ended(bytes, outcome)` when it ends
    (bytes None when more than `limit` came, so it cannot be replayed), also when the client left
    early or the stream failed (then never whole)."""
    seen: bytearray | None = bytearray()
    whole = False
    try:
        async for chunk in stream:
            if seen is not None:
                seen += chunk
                if len(seen) > limit:
                    seen = None
            yield chunk
        whole = True
    finally:
        if not whole and hasattr(stream, "aclose"):
            await stream.aclose()  # cut: the generation behind it ends now
        data = None if seen is None else bytes(seen)
        outcome = read_outcome(data or b"", whole)
        # the bookkeeping must finish even when the client cut the stream (this generator is closing)
        await asyncio.shield(ended(data, outcome))


async def replay(body: bytes) -> AsyncIterator[bytes]:
    """A cached stream, its bytes as recorded (split at its events, as it was sent)."""
    for event in body.split(b"\n\n"):
        if event:
            yield event + b"\n\n"


async def opened(stream: AsyncIterator[bytes], timeout: float | None) -> AsyncIterator[bytes]:
    """`stream` with its first event read now: within `timeout` seconds (requestTimeoutMs; raises
    TimeoutError, the stream closed, when it does not come), and raised as AIError when it is an
    error (a PoP out of capacity before it started), so that a stream is retried as a whole answer is."""
    iterator = aiter(stream)
    try:
        first = await asyncio.wait_for(anext(iterator), timeout)
    except StopAsyncIteration:
        return _empty()
    except BaseException:
        if hasattr(iterator, "aclose"):
            await iterator.aclose()
        raise
    failure = _error_event(first)
    if failure is not None:
        if hasattr(iterator, "aclose"):
            await iterator.aclose()
        raise failure

    async def rest() -> AsyncIterator[bytes]:
        try:
            yield first
            async for chunk in iterator:
                yield chunk
        finally:
            if hasattr(iterator, "aclose"):
                await iterator.aclose()

    return rest()


def _error_event(chunk: bytes) -> AIError | None:
    """The AIError a stream's first event carries (Workers AI's `{"error", "code"}` or OpenAI's
    `{"error": {"message", "code"}}`), or None."""
    line = chunk.split(b"\n", 1)[0]
    if not line.startswith(b"data:"):
        return None
    try:
        event = json.loads(line[5:].strip())
    except ValueError:
        return None
    if not isinstance(event, dict) or "error" not in event:
        return None
    error = event["error"]
    code = error.get("code") if isinstance(error, dict) else event.get("code")
    message = str(error.get("message", "") if isinstance(error, dict) else error)
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    return AIError(code, message.removeprefix(f"{code}: ")[:1000])


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""
