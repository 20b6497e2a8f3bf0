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
import struct
import sys
import traceback
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec

from runtime import ipc, sandbox
from workers import AIError, DurableObject, Request, Response, WorkerEntrypoint
from workers.bindings import BINDING_CLASSES, binding_error
from workers.context import _install as install_context
from workers.durable_objects import (
    DurableObjectId,
    DurableObjectNamespace,
    DurableObjectState,
    DurableObjectStorage,
    check_rpc_value,
    remote_error,
)
from workers.fetch import _install as install_fetch
from workers.queues import MessageBatch

WAIT_UNTIL_SECONDS = 30.0  # as on Workers: work continues this long after the response
LOG_LINES, LOG_BYTES, LOG_LINE_CHARS = 256, 256 * 1024, 16 * 1024  # per request, as the runtime keeps
FETCH_BODY_BYTES = 1024 * 1024  # an outbound request body crosses to the runtime in one frame
ERROR_CHARS = 64 * 1024  # of an exception's message and of its traceback

_current_request: contextvars.ContextVar[int | None] = contextvars.ContextVar("edge_request", default=None)
# the request's ctx, for the SDK's module-level wait_until (workers.context)
_current_ctx: contextvars.ContextVar[Any] = contextvars.ContextVar("edge_ctx", default=None)


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
    """`ctx`: waitUntil keeps work running after the response has been sent (at most
    WAIT_UNTIL_SECONDS); the request counts as running, CPU included, until that work ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def waitUntil(self, awaitable: Any) -> None:  # noqa: N802 - Cloudflare's name
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    wait_until = waitUntil

    def passThroughOnException(self) -> None:  # noqa: N802 - Cloudflare's name
        pass

    async def settle(self) -> None:
        """Wait for the waitUntil work, cancelling what is still running after the limit."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=WAIT_UNTIL_SECONDS)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the runtime has gone")
        data += chunk
    return bytes(data)


class Channel:
    """This process's end of the socket: sends frames, matches AI replies to their calls."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.sync: socket.socket | None = None  # the synchronous channel (blocking), if given
        self._calls = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self.request_bodies: dict[int, asyncio.Queue] = {}  # streamed request bodies arriving
        self.credits: dict[int, asyncio.Semaphore] = {}  # response chunks we may still send
        self.tasks: dict[int, asyncio.Task] = {}  # request id -> the task serving it
        self._log_budget: dict[int, list[int]] = {}  # request -> [lines left, bytes left]

    def send(self, msg: ipc.Message) -> None:
        frame = ipc.encode(msg)
        if len(frame) > ipc.FROM_ISOLATE:  # the runtime would take a bigger one as an attack
            raise ValueError(f"message of {len(frame)} bytes is over the {ipc.FROM_ISOLATE}-byte limit")
        self.writer.write(frame)

    async def request_body(self, rid: int) -> AsyncIterator[bytes]:
        """A streamed request body, chunk by chunk; each chunk taken gives the runtime credit."""
        queue = self.request_bodies[rid]
        try:
            while True:
                msg = await queue.get()
                if isinstance(msg, ipc.RequestEnd):
                    if msg.error:
                        raise OSError(f"the request body could not be read: {msg.error}")
                    return
                self.send(ipc.RequestAck(rid))
                yield msg.data
        finally:
            self.request_bodies.pop(rid, None)

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
        except ValueError:
            del self._pending[call]
            raise AIError(3006, f"inputs are larger than {ipc.FROM_ISOLATE // 2**20} MB; send less") from None
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

    def resolve(
        self, msg: ipc.AIReply | ipc.AIChunk | ipc.FetchReply | ipc.BindingReply | ipc.ObjectReply
    ) -> None:
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
        if len(body) > FETCH_BODY_BYTES:
            raise ValueError(f"fetch body of {len(body)} bytes is over the {FETCH_BODY_BYTES}-byte limit")
        call = next(self._calls)
        queue: asyncio.Queue = asyncio.Queue()
        self._pending[call] = queue
        try:
            self.send(ipc.FetchCall(call, request, method, url, headers, body, service))
        except ValueError:
            del self._pending[call]
            raise
        try:
            reply: ipc.FetchReply = await queue.get()
        finally:
            self._pending.pop(call, None)
        if reply.error:
            raise RuntimeError(reply.error)
        return Response(reply.body, status=reply.status, headers=reply.headers)

    def call_binding_sync(self, binding: str, method: str, args: list, kwargs: dict) -> Any:
        """The same call, blocking on the synchronous channel (for the API Cloudflare makes
        synchronous: a Durable Object's storage.sql.exec); the event loop waits meanwhile."""
        request = _current_request.get()
        if request is None or self.sync is None:
            raise RuntimeError(f"{binding}.{method} can only be called while handling a request")
        frame = ipc.encode(ipc.BindingCall(next(self._calls), request, binding, method, list(args), kwargs))
        if len(frame) > ipc.FROM_ISOLATE:
            raise ValueError(
                f"{binding}.{method}: the call is over the {ipc.FROM_ISOLATE // 2**20} MiB limit"
            )
        self.sync.sendall(frame)
        (length,) = struct.unpack(">I", _recv_exactly(self.sync, 4))
        if length > ipc.TO_ISOLATE:
            raise ConnectionError("the runtime's reply is over the frame limit")
        reply = ipc.decode(_recv_exactly(self.sync, length))
        if not isinstance(reply, ipc.BindingReply):
            raise ConnectionError("the synchronous channel answered out of turn")
        if reply.error_type is not None:
            raise binding_error(reply.error_type, reply.error_message or f"{binding}.{method} failed")
        return reply.result

    async def _round_trip(self, what: str, message: Callable[[int, int], ipc.Message]) -> Any:
        """Send one call (built from its call id and the current request) and wait for the
        runtime's reply; what cannot be sent says why in the worker's terms."""
        request = _current_request.get()
        if request is None:
            raise RuntimeError(f"{what} can only be called while handling a request")
        call = next(self._calls)
        queue: asyncio.Queue = asyncio.Queue()
        self._pending[call] = queue
        try:
            self.send(message(call, request))
        except (TypeError, msgspec.EncodeError) as exc:
            del self._pending[call]
            raise TypeError(
                f"{what}: arguments must be str, bytes, numbers, None, lists or dicts: {exc}"
            ) from None
        except ValueError:
            del self._pending[call]
            raise ValueError(
                f"{what}: the call is over the {ipc.FROM_ISOLATE // 2**20} MiB one call may carry to the "
                "runtime; send less per call"
            ) from None
        try:
            return await queue.get()
        finally:
            self._pending.pop(call, None)

    async def call_binding(self, binding: str, method: str, args: list, kwargs: dict) -> Any:
        """env.BINDING.method(...) on a KV, D1 or R2 binding, answered by the runtime's store."""
        if not all(isinstance(k, str) for k in kwargs):
            raise TypeError(f"env.{binding}.{method}: option names must be strings")
        reply: ipc.BindingReply = await self._round_trip(
            f"env.{binding}.{method}",
            lambda call, request: ipc.BindingCall(call, request, binding, method, list(args), dict(kwargs)),
        )
        if reply.error_type is not None:
            raise binding_error(reply.error_type, reply.error_message or f"env.{binding}.{method} failed")
        return reply.result

    async def call_object(self, binding: str, object_id: str, method: str, args: list, kwargs: dict) -> Any:
        """`await env.NS.get(id).method(...)`: the runtime runs it in that object's isolate."""
        reply: ipc.ObjectReply = await self._round_trip(
            f"env.{binding} {method}",
            lambda call, request: ipc.ObjectCall(call, request, binding, object_id, method, args, kwargs),
        )
        if reply.error_type is not None:
            raise remote_error(reply.error_type, reply.error_message or f"env.{binding} {method} failed")
        return reply.result

    def log(self, level: str, message: str) -> None:
        """A line for the tail; past the per-request budget lines are dropped here (the runtime
        enforces the same budget, since it trusts nothing an isolate sends)."""
        rid = _current_request.get() or 0
        budget = self._log_budget.setdefault(rid, [LOG_LINES, LOG_BYTES])
        if budget[0] <= 0 or budget[1] <= 0:
            return
        message = message[:LOG_LINE_CHARS]
        budget[0] -= 1
        budget[1] -= len(message)
        self.send(ipc.Log(rid, level, message))

    def forget(self, rid: int) -> None:
        self._log_budget.pop(rid, None)
        self.credits.pop(rid, None)
        self.tasks.pop(rid, None)


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


def sandbox_paths(script: Path, deps: str = "") -> list[str]:
    """What a worker may read: its own folder, Python itself, the SDK it imports and the
    project's installed dependencies (`deps`)."""
    import site

    import asgi
    import js
    import pyodide
    import runtime
    import workers

    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        *(str(Path(m.__file__).parent) for m in (workers, runtime, pyodide, js, asgi)),
    }
    if deps:
        paths.add(deps)
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


def _arity(fn: Any, most: int, method: bool) -> int:
    """How many of up to `most` positional arguments `fn` declares (self not counted): Cloudflare's
    shapes range from `fetch(self)` to `on_fetch(request, env, ctx)`, read once at load."""
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return most
    count = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    return max(0, min(most, count - (1 if method else 0)))


class Handlers:
    """The script's handlers: `fetch(request, ctx)`, `scheduled(controller, ctx)` and
    `queue(batch, ctx)` (None where the script has none), each calling the user's function with
    the arguments it declares."""

    def __init__(self, entry: str, fetch: Any = None, scheduled: Any = None, queue: Any = None):
        self.entry, self.fetch, self.scheduled, self.queue = entry, fetch, scheduled, queue


def _import_script(script: Path) -> Any:
    sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(script.stem, script)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[script.stem] = module
    spec.loader.exec_module(module)
    return module


def load_object(
    script: Path, env: Env, class_name: str, state: DurableObjectState
) -> tuple[str, Handlers, Any]:
    """Import the script and build the one instance of its Durable Object class `class_name`
    this isolate serves; its `fetch(request)` (if any) is the Handlers' fetch."""
    module = _import_script(script)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise TypeError(
            f"{script.name} has no class {class_name}: durable_objects.bindings names it as class_name"
        )
    if not (inspect.isclass(cls) and issubclass(cls, DurableObject)):
        raise TypeError(f"{script.name}: {class_name} must be a class deriving from workers.DurableObject")
    instance = cls(state, env)
    handlers = Handlers(class_name)
    fetch = getattr(type(instance), "fetch", None)
    if fetch is not None:
        if not inspect.iscoroutinefunction(fetch):
            raise TypeError(f"{script.name}: {class_name}.fetch must be an `async def`")
        n_fetch = _arity(fetch, 3, method=True)

        async def handle_object_fetch(request: Request, ctx: Context) -> Any:
            return await instance.fetch(*(request, env, ctx)[:n_fetch])

        handlers.fetch = handle_object_fetch
    return class_name, handlers, instance


def load_entry(script: Path, env: Env) -> tuple[str, Handlers]:
    """Import the script and return its entry name and its Handlers, or raise with what to fix."""
    module = _import_script(script)

    default = getattr(module, "Default", None)
    on_fetch = getattr(module, "on_fetch", None)
    on_scheduled = getattr(module, "on_scheduled", None)
    on_queue = getattr(module, "on_queue", None)
    module_level = {"on_fetch": on_fetch, "on_scheduled": on_scheduled, "on_queue": on_queue}
    if default is not None and any(fn is not None for fn in module_level.values()):
        both = next(n for n, fn in module_level.items() if fn is not None)
        raise TypeError(f"{script.name} defines both class Default and {both}; keep one entry point")
    if default is not None:
        if not (inspect.isclass(default) and issubclass(default, WorkerEntrypoint)):
            raise TypeError(f"{script.name}: Default must be a class deriving from workers.WorkerEntrypoint")
        fetch, scheduled = getattr(default, "fetch", None), getattr(default, "scheduled", None)
        queue = getattr(default, "queue", None)
        if fetch is None and scheduled is None and queue is None:
            raise TypeError(
                f"{script.name}: Default must define `async def fetch(self, request)`, "
                "`async def scheduled(self, controller, env, ctx)` or `async def queue(self, batch)`"
            )
        methods = (("fetch", fetch), ("scheduled", scheduled), ("queue", queue))
        for name, fn in methods:
            if fn is not None and not inspect.iscoroutinefunction(fn):
                raise TypeError(f"{script.name}: Default.{name} must be an `async def`")
        handlers = Handlers(", ".join(f"Default.{n}" for n, f in methods if f))
        if fetch is not None:
            n_fetch = _arity(fetch, 3, method=True)

            async def handle_default(request: Request, ctx: Context) -> Any:
                return await default(ctx, env).fetch(*(request, env, ctx)[:n_fetch])

            handlers.fetch = handle_default
        if scheduled is not None:
            n_sched = _arity(scheduled, 3, method=True)

            async def schedule_default(controller: ScheduledController, ctx: Context) -> Any:
                return await default(ctx, env).scheduled(*(controller, env, ctx)[:n_sched])

            handlers.scheduled = schedule_default
        if queue is not None:
            n_queue = _arity(queue, 3, method=True)

            async def queue_default(batch: MessageBatch, ctx: Context) -> Any:
                return await default(ctx, env).queue(*(batch, env, ctx)[:n_queue])

            handlers.queue = queue_default
        return handlers.entry, handlers
    if any(fn is not None for fn in module_level.values()):
        for name, fn, shape in (
            ("on_fetch", on_fetch, "async def on_fetch(request, env)"),
            ("on_scheduled", on_scheduled, "async def on_scheduled(controller, env, ctx)"),
            ("on_queue", on_queue, "async def on_queue(batch, env, ctx)"),
        ):
            if fn is not None and not inspect.iscoroutinefunction(fn):
                raise TypeError(f"{script.name}: {name} must be `{shape}`")
        handlers = Handlers(", ".join(n for n, f in module_level.items() if f))
        if on_fetch is not None:
            n_fetch = _arity(on_fetch, 3, method=False)

            async def handle_on_fetch(request: Request, ctx: Context) -> Any:
                return await on_fetch(*(request, env, ctx)[:n_fetch])

            handlers.fetch = handle_on_fetch
        if on_scheduled is not None:
            n_sched = _arity(on_scheduled, 3, method=False)

            async def schedule_module(controller: ScheduledController, ctx: Context) -> Any:
                return await on_scheduled(*(controller, env, ctx)[:n_sched])

            handlers.scheduled = schedule_module
        if on_queue is not None:
            n_queue = _arity(on_queue, 3, method=False)

            async def queue_module(batch: MessageBatch, ctx: Context) -> Any:
                return await on_queue(*(batch, env, ctx)[:n_queue])

            handlers.queue = queue_module
        return handlers.entry, handlers
    raise TypeError(
        f"{script.name} has no entry point: define `class Default(WorkerEntrypoint)` with "
        "`async def fetch(self, request)`, or `async def on_fetch(request, env)`"
    )


class ScheduledController:
    """`controller` of a scheduled event, as Cloudflare's: `cron` (the trigger that fired),
    `scheduledTime` (ms since the epoch, UTC), `type` ("scheduled") and `noRetry()`."""

    type = "scheduled"

    def __init__(self, cron: str, scheduled_time: int):
        self.cron = cron
        self.scheduledTime = scheduled_time  # noqa: N815 - Cloudflare's name
        self.retry = True

    @property
    def scheduled_time(self) -> int:
        return self.scheduledTime

    def noRetry(self) -> None:  # noqa: N802 - Cloudflare's name
        self.retry = False

    no_retry = noRetry


async def _no_fetch_handler(request: Request, ctx: Context) -> Any:
    raise TypeError(
        "this worker has no fetch handler: define `async def fetch(self, request)` in class Default "
        "(or `async def on_fetch(request, env)`)"
    )


async def _body_bytes(body: Any) -> bytes | None:
    """The whole body when it is known at once; None for a stream."""
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if hasattr(body, "__aiter__"):
        return None
    raise TypeError(
        f"Response body must be str, bytes or an async iterator of bytes, got {type(body).__name__}"
    )


async def _chunks(body: Any) -> AsyncIterator[bytes]:
    """The body in frames of at most ipc.CHUNK bytes."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        data = memoryview(body)
        for start in range(0, len(data), ipc.CHUNK):
            yield bytes(data[start : start + ipc.CHUNK])
        return
    try:
        async for chunk in body:
            data = memoryview(chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk))
            for start in range(0, len(data), ipc.CHUNK):
                yield bytes(data[start : start + ipc.CHUNK])
    finally:  # cancelled or done: the worker's own generator runs its finally now, not at GC
        if hasattr(body, "aclose"):
            await body.aclose()


async def _stream_response(channel: Channel, rid: int, response: Response, body: Any) -> None:
    """Headers now, the body as the client takes it: at most ipc.WINDOW chunks ahead of it."""
    credit = channel.credits.setdefault(rid, asyncio.Semaphore(ipc.WINDOW))
    channel.send(ipc.InvokeStart(rid, response.status, response.headers.items()))
    error = None
    chunks = _chunks(body)
    try:
        async for chunk in chunks:
            await credit.acquire()
            channel.send(ipc.BodyChunk(rid, chunk))
            await channel.writer.drain()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        await chunks.aclose()
    channel.send(ipc.BodyEnd(rid, error))


def _begin(rid: int) -> Context:
    """An event's own context: its request id and ctx, for the calls and waitUntil made in it."""
    _current_request.set(rid)
    ctx = Context()
    _current_ctx.set(ctx)
    return ctx


def _describe(exc: BaseException) -> tuple[str, str]:
    """("Type: message", traceback), each cut to ERROR_CHARS: a frame must stay bounded."""
    return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS], traceback.format_exc()[-ERROR_CHARS:]


def _worker_error(rid: int, exc: BaseException) -> ipc.InvokeError:
    """The worker's own failure, reported; the isolate stays up."""
    return ipc.InvokeError(rid, *_describe(exc))


async def _finish(channel: Channel, ctx: Context, rid: int, settle: bool = True) -> None:
    """The answer is out: wait for its waitUntil work (unless the handler already did), then
    RequestDone, until which the runtime counts the event's CPU."""
    try:
        await channel.writer.drain()
        if settle:
            await ctx.settle()
    except asyncio.CancelledError:
        ctx.cancel()
    channel.send(ipc.RequestDone(rid))
    channel.forget(rid)


async def serve_invoke(channel: Channel, handler, inv: ipc.Invoke) -> None:
    ctx = _begin(inv.id)
    try:
        body = channel.request_body(inv.id) if inv.streamed_body else inv.body
        request = Request(inv.url, inv.method, inv.headers, body, inv.cf)
        response = await handler(request, ctx)
        if not isinstance(response, Response):
            raise TypeError(f"fetch must return a workers.Response, got {type(response).__name__}")
        whole = await _body_bytes(response.body)
        if whole is not None and len(whole) <= ipc.CHUNK:
            channel.send(ipc.InvokeResult(inv.id, response.status, response.headers.items(), whole))
        else:
            await _stream_response(channel, inv.id, response, whole if whole is not None else response.body)
    except asyncio.CancelledError:  # the runtime cancelled it: its client left, or time ran out
        ctx.cancel()
        if inv.id in channel.credits:
            channel.send(ipc.BodyEnd(inv.id, "cancelled"))
        else:
            channel.send(ipc.InvokeError(inv.id, "Cancelled: the request was cancelled", ""))
    except Exception as exc:
        channel.send(_worker_error(inv.id, exc))
    await _finish(channel, ctx, inv.id)


async def serve_scheduled(channel: Channel, handler, msg: ipc.Scheduled) -> None:
    """A Cron Trigger fired: run the scheduled handler, wait for its waitUntil work (the event
    lasts until that ends, as on Workers), answer InvokeResult or InvokeError, then RequestDone
    (the runtime counts CPU until then)."""
    ctx = _begin(msg.id)
    controller = ScheduledController(msg.cron, msg.scheduled_time)
    try:
        if handler is None:
            raise TypeError(
                "this worker has no scheduled handler: define `async def scheduled(self, controller, "
                "env, ctx)` in class Default (or `async def on_scheduled(controller, env, ctx)`)"
            )
        await handler(controller, ctx)
        await ctx.settle()
        headers = [] if controller.retry else [("no-retry", "true")]
        channel.send(ipc.InvokeResult(msg.id, 200, headers, b""))
    except asyncio.CancelledError:  # the runtime cancelled it: it ran out of time
        ctx.cancel()
        channel.send(ipc.InvokeError(msg.id, "Cancelled: the scheduled event was cancelled", ""))
    except Exception as exc:
        ctx.cancel()
        channel.send(_worker_error(msg.id, exc))
    await _finish(channel, ctx, msg.id, settle=False)  # settled before the answer


async def serve_queue(channel: Channel, handler, msg: ipc.QueueBatch) -> None:
    """A batch of queue messages: run the queue handler (its waitUntil work is part of the event),
    send what became of each message (QueueOutcome: on success the messages not retried are
    acked; when it raises, the ones not acked are retried), then InvokeResult or InvokeError,
    then RequestDone."""
    ctx = _begin(msg.id)
    batch = MessageBatch(msg.queue, [(m.id, m.timestamp_ms, m.body, m.attempts) for m in msg.messages])
    try:
        if handler is None:
            raise TypeError(
                "this worker has no queue handler: define `async def queue(self, batch)` in class "
                "Default (or `async def on_queue(batch, env, ctx)`)"
            )
        await handler(batch, ctx)
        await ctx.settle()
        reply: ipc.Message = ipc.InvokeResult(msg.id, 200, [], b"")
        failed = False
    except asyncio.CancelledError:  # the runtime cancelled it: it ran out of time
        ctx.cancel()
        reply, failed = ipc.InvokeError(msg.id, "Cancelled: the queue event was cancelled", ""), True
    except Exception as exc:
        ctx.cancel()
        reply, failed = _worker_error(msg.id, exc), True
    acked, retried = batch.outcome(failed)
    channel.send(ipc.QueueOutcome(msg.id, acked, retried))
    channel.send(reply)
    await _finish(channel, ctx, msg.id, settle=False)  # settled before the answer


def _rpc_method(instance: Any, name: str) -> Any:
    """The public method `name` of the object's class (never an attribute such as ctx or env)."""
    cls = type(instance)
    if not isinstance(name, str) or name.startswith("_") or name == "fetch":
        raise TypeError(f"{cls.__name__}.{name} cannot be called over RPC")
    try:
        attr = inspect.getattr_static(cls, name)
    except AttributeError:
        raise TypeError(f"{cls.__name__} has no method {name!r}") from None
    if not callable(attr) and not isinstance(attr, (staticmethod, classmethod)):
        raise TypeError(f"{cls.__name__}.{name} is not a method")
    return getattr(instance, name)


async def serve_object_call(channel: Channel, instance: Any, msg: ipc.ObjectInvoke) -> None:
    """An RPC call on the object this isolate serves: ObjectResult or InvokeError, then (its
    waitUntil work ended) RequestDone."""
    ctx = _begin(msg.id)
    try:
        result = _rpc_method(instance, msg.method)(*msg.args, **msg.kwargs)
        if inspect.isawaitable(result):
            result = await result
        check_rpc_value(result, f"the result of {type(instance).__name__}.{msg.method}")
        try:
            channel.send(ipc.ObjectResult(msg.id, result))
        except ValueError:
            raise ValueError(
                f"the result of {type(instance).__name__}.{msg.method} is over the "
                f"{ipc.FROM_ISOLATE // 2**20} MiB one reply may carry"
            ) from None
    except asyncio.CancelledError:
        ctx.cancel()
        channel.send(ipc.InvokeError(msg.id, "Cancelled: the call was cancelled", ""))
    except Exception as exc:  # the object's own failure: reported to its caller
        channel.send(_worker_error(msg.id, exc))
    await _finish(channel, ctx, msg.id)


async def main(fd: int, sync_fd: int | None = None) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=ipc.CHUNK)
    channel = Channel(reader, writer)
    if sync_fd is not None:
        channel.sync = socket.socket(fileno=sync_fd)
        channel.sync.setblocking(True)
    init = await ipc.read_message(reader, ipc.TO_ISOLATE)
    if not isinstance(init, ipc.Init):
        raise SystemExit("isolate: expected Init first")
    values: dict[str, Any] = dict(init.vars)
    if init.ai_binding:
        values[init.ai_binding] = AIBinding(channel)
    for name in init.services:
        values[name] = ServiceBinding(channel, name)
    for name, kind in init.bindings.items():  # KV, D1, R2: each call crosses as ipc.BindingCall
        values[name] = BINDING_CLASSES[kind](
            lambda method, args, kwargs, _name=name: channel.call_binding(_name, method, args, kwargs)
        )
    for name, key in init.durable_objects.items():  # each call crosses as ipc.ObjectCall
        values[name] = DurableObjectNamespace(name, key, channel.call_object)
    capture_logs(channel)
    install_fetch(lambda method, url, headers, body: channel.fetch(method, url, headers, body))
    try:
        script = Path(init.script)
        if init.memory_mb:
            sandbox.limit_memory(init.memory_mb)
        if init.sandbox and init.jailed:  # the jail's view is all there is: read it, scribble in /tmp
            sandbox.restrict(["/"], writable=["/dev/null"], scratch=["/tmp"])
        elif init.sandbox:  # from here the kernel confines what the script can touch
            sandbox.restrict(sandbox_paths(script, init.deps), writable=["/dev/null"])
        env = Env(values)
        install_context(env=env, current_ctx=_current_ctx.get)  # workers.env, workers.wait_until
        instance = None
        if init.durable_object:  # this isolate is one Durable Object: its storage is its own
            storage = DurableObjectStorage(
                lambda method, args, kwargs: channel.call_binding("ctx.storage", method, args, kwargs),
                lambda method, args, kwargs: channel.call_binding_sync("ctx.storage", method, args, kwargs),
            )
            state = DurableObjectState(
                DurableObjectId(init.object_id or ""), storage, lambda aw: _current_ctx.get().waitUntil(aw)
            )
            entry, handlers, instance = load_object(script, env, init.durable_object, state)
        else:
            entry, handlers = load_entry(script, env)
    except BaseException as exc:  # noqa: BLE001 - any import failure is reported, then we exit
        channel.send(ipc.LoadFailed(*_describe(exc)))
        await writer.drain()
        return
    channel.send(ipc.Ready(entry))
    await writer.drain()

    while True:
        try:
            msg = await ipc.read_message(reader, ipc.TO_ISOLATE)
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the runtime has gone; so do we
        if isinstance(msg, ipc.Invoke):
            if msg.streamed_body:
                channel.request_bodies[msg.id] = asyncio.Queue()
            fetch = handlers.fetch or _no_fetch_handler
            channel.tasks[msg.id] = asyncio.create_task(serve_invoke(channel, fetch, msg))
        elif isinstance(msg, ipc.Scheduled):
            task = asyncio.create_task(serve_scheduled(channel, handlers.scheduled, msg))
            channel.tasks[msg.id] = task
        elif isinstance(msg, ipc.QueueBatch):
            channel.tasks[msg.id] = asyncio.create_task(serve_queue(channel, handlers.queue, msg))
        elif isinstance(msg, ipc.ObjectInvoke) and instance is not None:
            channel.tasks[msg.id] = asyncio.create_task(serve_object_call(channel, instance, msg))
        elif isinstance(msg, (ipc.RequestChunk, ipc.RequestEnd)):
            queue = channel.request_bodies.get(msg.id)
            if queue is not None:  # at most ipc.WINDOW chunks wait here: the runtime keeps count
                queue.put_nowait(msg)
        elif isinstance(msg, ipc.BodyAck):
            credit = channel.credits.get(msg.id)
            if credit is not None:
                credit.release()
        elif isinstance(msg, ipc.Cancel):
            task = channel.tasks.get(msg.id)
            if task is not None:
                task.cancel()
        elif isinstance(msg, (ipc.AIReply, ipc.AIChunk, ipc.FetchReply, ipc.BindingReply, ipc.ObjectReply)):
            channel.resolve(msg)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--sync-fd", type=int, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.fd, args.sync_fd))
