"""The isolate process: loads one worker script and serves its fetch handler over IPC.

Started by runtime.isolate as `python -m runtime.isolate_main --fd N`; N is its end of a Unix
socket pair. It imports only the workers SDK and the IPC structs (no torch, no runtime state),
and holds only its own worker's env.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import importlib.util
import inspect
import itertools
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

import msgspec

from runtime import ipc
from workers import AIError, Request, Response, WorkerEntrypoint

_current_request: contextvars.ContextVar[int | None] = contextvars.ContextVar("edge_request", default=None)


class Env:
    """`env` as the worker sees it: vars and bindings as attributes (and by name with `env["X"]`)."""

    def __init__(self, values: dict[str, Any]):
        self.__dict__.update(values)

    def __getitem__(self, name: str) -> Any:
        return self.__dict__[name]

    def __contains__(self, name: str) -> bool:
        return name in self.__dict__

    def __repr__(self) -> str:
        return f"Env({', '.join(sorted(self.__dict__))})"


class Context:
    """`ctx`: waitUntil keeps work running after the response has been sent."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def waitUntil(self, awaitable: Any) -> None:  # noqa: N802 - Cloudflare's name
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    wait_until = waitUntil

    def passThroughOnException(self) -> None:  # noqa: N802 - Cloudflare's name
        pass


class Channel:
    """This process's end of the socket: sends frames, matches AI replies to their calls."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self._calls = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}

    def send(self, msg: ipc.Message) -> None:
        self.writer.write(ipc.encode(msg))

    async def call_ai(self, model: str, inputs: Any, options: Any) -> Any:
        request = _current_request.get()
        if request is None:
            raise AIError(5004, "env.AI.run can only be called while handling a request")
        call = next(self._calls)
        future = asyncio.get_running_loop().create_future()
        self._pending[call] = future
        try:
            self.send(ipc.AICall(call, request, model, inputs, options))
        except (TypeError, msgspec.EncodeError) as exc:
            del self._pending[call]
            raise AIError(5004, f"inputs must be JSON-like (dicts, lists, strings, numbers): {exc}") from None
        reply: ipc.AIReply = await future
        if reply.error_code is not None:
            raise AIError(reply.error_code, reply.error_message or "AI request failed")
        return reply.result

    def resolve(self, reply: ipc.AIReply) -> None:
        future = self._pending.pop(reply.call, None)
        if future is not None and not future.done():
            future.set_result(reply)


class AIBinding:
    """`env.AI`: `await env.AI.run(model, inputs, options=None)` crosses to the runtime's AI service."""

    def __init__(self, channel: Channel):
        self._channel = channel

    async def run(self, model: str, inputs: dict[str, Any], options: dict[str, Any] | None = None) -> Any:
        if not isinstance(model, str):
            raise AIError(
                5004, f"model must be a string such as '@edge/moonshotai/kimi-k2-mini', got {model!r}"
            )
        return await self._channel.call_ai(model, inputs, options)


def load_entry(script: Path, env: Env):
    """Import the script and return `handler(request, ctx) -> Response`, or raise with what to fix."""
    sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(script.stem, script)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[script.stem] = module
    spec.loader.exec_module(module)

    default = getattr(module, "Default", None)
    on_fetch = getattr(module, "on_fetch", None)
    if default is not None and on_fetch is not None:
        raise TypeError(f"{script.name} defines both class Default and on_fetch; keep one entry point")
    if default is not None:
        if not (inspect.isclass(default) and issubclass(default, WorkerEntrypoint)):
            raise TypeError(f"{script.name}: Default must be a class deriving from workers.WorkerEntrypoint")
        if not inspect.iscoroutinefunction(getattr(default, "fetch", None)):
            raise TypeError(f"{script.name}: Default must define `async def fetch(self, request)`")

        async def handle_default(request: Request, ctx: Context) -> Any:
            return await default(ctx, env).fetch(request)

        return "Default.fetch", handle_default
    if on_fetch is not None:
        if not inspect.iscoroutinefunction(on_fetch):
            raise TypeError(f"{script.name}: on_fetch must be `async def on_fetch(request, env)`")
        takes_ctx = len(inspect.signature(on_fetch).parameters) >= 3

        async def handle_on_fetch(request: Request, ctx: Context) -> Any:
            return await (on_fetch(request, env, ctx) if takes_ctx else on_fetch(request, env))

        return "on_fetch", handle_on_fetch
    raise TypeError(
        f"{script.name} has no entry point: define `class Default(WorkerEntrypoint)` with "
        "`async def fetch(self, request)`, or `async def on_fetch(request, env)`"
    )


async def _body_bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if hasattr(body, "__aiter__"):
        chunks = []
        async for chunk in body:
            chunks.append(chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk))
        return b"".join(chunks)
    raise TypeError(
        f"Response body must be str, bytes or an async iterator of bytes, got {type(body).__name__}"
    )


async def serve_invoke(channel: Channel, handler, inv: ipc.Invoke) -> None:
    _current_request.set(inv.id)
    ctx = Context()
    try:
        request = Request(inv.url, inv.method, inv.headers, inv.body, inv.cf)
        response = await handler(request, ctx)
        if not isinstance(response, Response):
            raise TypeError(f"fetch must return a workers.Response, got {type(response).__name__}")
        body = await _body_bytes(response.body)
        channel.send(ipc.InvokeResult(inv.id, response.status, response.headers.items(), body))
    except Exception as exc:  # the worker's own failure: reported, the isolate stays up
        channel.send(ipc.InvokeError(inv.id, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    await channel.writer.drain()


async def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=ipc.MAX_FRAME)
    channel = Channel(reader, writer)
    init = await ipc.read_message(reader)
    if not isinstance(init, ipc.Init):
        raise SystemExit("isolate: expected Init first")
    values: dict[str, Any] = dict(init.vars)
    if init.ai_binding:
        values[init.ai_binding] = AIBinding(channel)
    try:
        entry, handler = load_entry(Path(init.script), Env(values))
    except BaseException as exc:  # noqa: BLE001 - any import failure is reported, then we exit
        channel.send(ipc.LoadFailed(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        await writer.drain()
        return
    channel.send(ipc.Ready(entry))
    await writer.drain()

    tasks: set[asyncio.Task] = set()
    while True:
        try:
            msg = await ipc.read_message(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the runtime has gone; so do we
        if isinstance(msg, ipc.Invoke):
            task = asyncio.create_task(serve_invoke(channel, handler, msg))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        elif isinstance(msg, ipc.AIReply):
            channel.resolve(msg)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    asyncio.run(main(parser.parse_args().fd))
