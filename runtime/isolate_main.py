"""The isolate process: loads one worker script and serves its fetch handler over IPC.

Started by runtime.isolate as `python -m runtime.isolate_main --fd N`; N is its end of a Unix
socket pair. It imports only the workers SDK and the IPC structs (no torch, no runtime state),
and holds only its own worker's env.
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import contextvars
import importlib.util
import inspect
import itertools
import logging
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

import msgspec

from runtime import ipc, sandbox
from workers import AIError, Request, Response, WorkerEntrypoint
from workers.fetch import _install as install_fetch

WAIT_UNTIL_SECONDS = 30.0  # as on Workers: work continues this long after the response

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
        task = asyncio.ensure_future(asyncio.wait_for(awaitable, WAIT_UNTIL_SECONDS))
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
        # every message for this call lands here: AIChunk(s) of a stream, then the AIReply
        queue: asyncio.Queue = asyncio.Queue()
        self._pending[call] = queue
        try:
            self.send(ipc.AICall(call, request, model, inputs, options))
        except (TypeError, msgspec.EncodeError) as exc:
            del self._pending[call]
            raise AIError(5004, f"inputs must be JSON-like (dicts, lists, strings, numbers): {exc}") from None
        first = await queue.get()
        if isinstance(first, ipc.AIReply):
            self._pending.pop(call, None)
            if first.error_code is not None:
                raise AIError(first.error_code, first.error_message or "AI request failed")
            return first.result
        return self._stream(call, first, queue)  # stream: True -> an async iterator of SSE bytes

    async def _stream(self, call: int, first: ipc.AIChunk, queue: asyncio.Queue):
        try:
            msg = first
            while isinstance(msg, ipc.AIChunk):
                yield msg.data
                msg = await queue.get()
            if msg.error_code is not None:
                raise AIError(msg.error_code, msg.error_message or "AI request failed")
        finally:
            self._pending.pop(call, None)

    def resolve(self, msg: ipc.AIReply | ipc.AIChunk | ipc.FetchReply) -> None:
        queue = self._pending.get(msg.call)
        if queue is not None:
            queue.put_nowait(msg)

    async def fetch(
        self, method: str, url: str, headers: list[tuple[str, str]], body: bytes, service: str | None = None
    ) -> Response:
        """Outbound HTTP (or a service binding call) carried by the runtime."""
        request = _current_request.get()
        if request is None:
            raise RuntimeError("fetch can only be called while handling a request")
        call = next(self._calls)
        queue: asyncio.Queue = asyncio.Queue()
        self._pending[call] = queue
        self.send(ipc.FetchCall(call, request, method, url, headers, body, service))
        try:
            reply: ipc.FetchReply = await queue.get()
        finally:
            self._pending.pop(call, None)
        if reply.error:
            raise RuntimeError(reply.error)
        return Response(reply.body, status=reply.status, headers=reply.headers)

    def log(self, level: str, message: str) -> None:
        self.send(ipc.Log(_current_request.get() or 0, level, message))


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


class ServiceBinding:
    """`env.NAME` for a [[services]] binding: `await env.NAME.fetch(url_or_request)` calls that worker."""

    def __init__(self, channel: Channel, name: str):
        self._channel, self._name = channel, name

    async def fetch(self, resource: Any, method: str | None = None, headers: Any = None, body: Any = None):
        from workers.fetch import _as_parts

        url, verb, hdrs, data = _as_parts(resource, method, headers, body)
        return await self._channel.fetch(verb, url, hdrs, data, service=self._name)


class _LogToRuntime(logging.Handler):
    def __init__(self, channel: Channel):
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.channel.log(record.levelname.lower(), self.format(record))
        except Exception:  # a log line must never break the request
            pass


def capture_logs(channel: Channel) -> None:
    """print() and logging inside the worker reach the runtime (edge tail), tagged by request."""
    real_print = builtins.print

    def worker_print(*args, sep=" ", end="\n", file=None, flush=False):
        if file not in (None, sys.stdout, sys.stderr):
            return real_print(*args, sep=sep, end=end, file=file, flush=flush)
        channel.log("error" if file is sys.stderr else "log", sep.join(str(a) for a in args))

    builtins.print = worker_print
    root = logging.getLogger()
    root.handlers = [_LogToRuntime(channel)]
    root.setLevel(logging.INFO)


def sandbox_paths(script: Path) -> list[str]:
    """What a worker may read: its own folder, Python itself, and the SDK it imports."""
    import site

    import runtime
    import workers

    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        str(Path(workers.__file__).parent),
        str(Path(runtime.__file__).parent),
    }
    # the worker's own folder, but not the runtime's state kept beside it (.edge: database, token,
    # other workers' scripts) nor other tooling folders
    hidden = {".edge", ".git", ".venv"}
    paths.update(str(p) for p in script.parent.iterdir() if p.name not in hidden)
    paths.update(site.getsitepackages())
    paths.update(
        (
            "/usr/lib",
            "/usr/lib64",
            "/lib",
            "/lib64",
            "/usr/local/lib",
            "/etc/ld.so.cache",
            "/etc/localtime",
            "/usr/share/zoneinfo",
        )
    )
    return sorted(paths)


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
        if hasattr(response.body, "__aiter__"):  # stream it: headers now, the body as it comes
            channel.send(ipc.InvokeStart(inv.id, response.status, response.headers.items()))
            await channel.writer.drain()
            error = None
            try:
                async for chunk in response.body:
                    channel.send(
                        ipc.BodyChunk(
                            inv.id, chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
                        )
                    )
                    await channel.writer.drain()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            channel.send(ipc.BodyEnd(inv.id, error))
        else:
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
    for name in init.services:
        values[name] = ServiceBinding(channel, name)
    capture_logs(channel)
    install_fetch(lambda method, url, headers, body: channel.fetch(method, url, headers, body))
    try:
        script = Path(init.script)
        if init.memory_mb:
            sandbox.limit_memory(init.memory_mb)
        if init.sandbox:  # from here the kernel confines what the script can touch
            sandbox.restrict(sandbox_paths(script), writable=["/dev/null"])
        entry, handler = load_entry(script, Env(values))
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
        elif isinstance(msg, (ipc.AIReply, ipc.AIChunk, ipc.FetchReply)):
            channel.resolve(msg)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    asyncio.run(main(parser.parse_args().fd))
