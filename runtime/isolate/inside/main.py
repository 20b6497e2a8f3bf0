"""The isolate process: loads one worker script and serves its fetch handler over IPC.

Started by runtime.isolate.process as `python -m runtime.isolate.inside.main --fd N`; N is its end of a Unix
socket pair. It imports only the workers SDK, the IPC structs and its two helpers,
runtime.isolate.inside.channel (calls to the runtime) and runtime.isolate.inside.entry (loading the script):
no torch, no runtime state; it holds only its own worker's env.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import socket
import sys
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from runtime.isolate import ipc
from runtime.isolate.inside import sandbox
from runtime.isolate.inside import walk as call_walk
from runtime.isolate.inside.channel import (
    AIBinding,
    Channel,
    ChannelSockets,
    ServiceBinding,
    capture_logs,
    current_ctx,
    current_request,
)
from runtime.isolate.inside.entry import (
    Context,
    Env,
    Handlers,
    ScheduledController,
    _arity,
    load_entry,
    load_object,
    load_workflow,
)
from workers import Request, Response, websocket
from workers.binding_values import JsObject
from workers.context import _install as install_context
from workers.durable_objects import (
    DurableObjectId,
    DurableObjectNamespace,
    DurableObjectState,
    DurableObjectStorage,
    check_rpc_value,
)
from workers.fetch import _install as install_fetch
from workers.queues import MessageBatch
from workers.workflow_step import Suspend, WorkflowStep, workflow_event

ERROR_CHARS = 64 * 1024  # of an exception's message and of its traceback


def sandbox_paths(script: Path, deps: str = "") -> list[str]:
    """What a worker may read: its own folder, Python itself, the SDK it imports (with the
    Pyodide stand-ins in workers/_pyodide/) and the project's installed dependencies (`deps`)."""
    import site

    import runtime
    import workers

    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        *(str(Path(m.__file__).parent) for m in (workers, runtime)),
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


def _describe(exc: BaseException) -> tuple[str, str]:
    """("Type: message", traceback), each cut to ERROR_CHARS: a frame must stay bounded."""
    return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS], traceback.format_exc()[-ERROR_CHARS:]


class Invocation:
    """One event in the jail (a request, a cron run, a queue batch, an RPC call, an alarm, a socket
    event, a workflow run), from its start to its RequestDone: its id (the one every call it makes
    carries: channel.current_request), its ctx (waitUntil), and its answers on the channel. The
    runtime's side of the same event is runtime.host.invocation.Invocation."""

    def __init__(self, channel: Channel, rid: int):
        self.channel, self.id = channel, rid
        current_request.set(rid)
        self.ctx = Context()
        current_ctx.set(self.ctx)

    def answer(self, msg: ipc.Message) -> None:
        self.channel.send(msg)

    def failed(self, exc: BaseException) -> None:
        """The worker's own failure, reported (cut to ERROR_CHARS); the isolate stays up."""
        self.channel.send(self.error(exc))

    def error(self, exc: BaseException) -> ipc.InvokeError:
        return ipc.InvokeError(self.id, *_describe(exc))

    def cancelled(self, what: str) -> None:
        """The runtime cancelled it (its client left, its time ran out): its waitUntil work too."""
        self.ctx.cancel()
        self.channel.send(ipc.InvokeError(self.id, f"Cancelled: the {what} was cancelled", ""))

    async def end(self, settle: bool = True) -> None:
        """The answer is out: wait for its waitUntil work (unless the handler already did), then
        RequestDone, until which the runtime counts the event's CPU."""
        try:
            await self.channel.writer.drain()
            if settle:
                await self.ctx.settle()
        except asyncio.CancelledError:
            self.ctx.cancel()
        self.channel.send(ipc.RequestDone(self.id))
        self.channel.forget(self.id)


async def serve_invoke(channel: Channel, handler, inv: ipc.Invoke) -> None:
    walk = call_walk.Walk() if call_walk.enabled() else None
    if walk is not None:
        walk.start()
    event = Invocation(channel, inv.id)
    ctx = event.ctx
    try:
        body = channel.request_body(inv.id) if inv.streamed_body else inv.body
        request = Request(inv.url, inv.method, inv.headers, body, inv.cf)
        response = await handler(request, ctx)
        if not isinstance(response, Response):
            raise TypeError(f"fetch must return a workers.Response, got {type(response).__name__}")
        whole = await _body_bytes(response.body)
        if response.status == 101:  # a WebSocket: the runtime holds its client from here
            offer, server = _socket_offer(response.web_socket)
            channel.send(ipc.InvokeResult(inv.id, 101, response.headers.items(), b"", offer))
            if server is not None:
                server._gone_live()
        elif whole is not None and len(whole) <= ipc.CHUNK:
            channel.send(ipc.InvokeResult(inv.id, response.status, response.headers.items(), whole))
        else:
            await _stream_response(channel, inv.id, response, whole if whole is not None else response.body)
    except asyncio.CancelledError:  # the runtime cancelled it: its client left, or time ran out
        if inv.id in channel.credits:
            ctx.cancel()
            channel.send(ipc.BodyEnd(inv.id, "cancelled"))
        else:
            event.cancelled("request")
    except Exception as exc:
        event.failed(exc)
    await event.end()
    if walk is not None:
        walk.stop()
        call_walk.write_summary(walk)


def _socket_offer(client: Any) -> tuple[ipc.SocketOffer, Any]:
    """What a 101 response carries out: the pair's server end (by id), or a forwarded token."""
    if client._token is not None:
        return ipc.SocketOffer(token=client._token), None
    server = client._peer
    if server is None or not server._accepted:
        raise TypeError(
            "Response(status=101): accept() the server end of the pair (or ctx.acceptWebSocket it) first"
        )
    return ipc.SocketOffer(ws=server._id, tags=server._tags, attachment=server._attachment), server


class _SocketEventData(JsObject):
    """The event a listener gets: `event.data` (str or bytes), `event.code`, `event.reason`,
    `event.wasClean`, `event.type`."""


async def serve_socket_event(channel: Channel, instance: Any, msg: ipc.SocketEvent) -> None:
    """A client's message, or its socket's end, for one of this isolate's WebSockets: the Durable
    Object's webSocketMessage / webSocketClose / webSocketError for a socket it accepted with
    ctx.acceptWebSocket, else the socket's listeners. InvokeResult or InvokeError, then RequestDone."""
    event = Invocation(channel, msg.id)
    try:
        ws = websocket.sockets.get(msg.ws)
        if ws is not None:
            message = msg.text if msg.text is not None else msg.data
            if msg.kind != "message":
                ws.readyState = websocket.CLOSED
                websocket.sockets.pop(msg.ws, None)
            if ws._tags is not None and instance is not None:
                await _object_socket_handler(instance, ws, msg, message)
            else:
                data = _SocketEventData(type=msg.kind, data=message, code=msg.code, reason=msg.reason,
                                        wasClean=msg.was_clean)  # fmt: skip
                for listener in list(ws._listeners.get(msg.kind, [])):
                    result = listener(data)
                    if inspect.isawaitable(result):
                        await result
        await event.ctx.settle()
        event.answer(ipc.InvokeResult(msg.id, 200, [], b""))
    except asyncio.CancelledError:
        event.cancelled("WebSocket event")
    except Exception as exc:
        event.ctx.cancel()
        event.failed(exc)
    await event.end(settle=False)


async def _object_socket_handler(instance: Any, ws: Any, msg: ipc.SocketEvent, message: Any) -> None:
    if msg.kind == "message":
        handler, args = getattr(instance, "webSocketMessage", None), (ws, message)
    elif msg.kind == "close":
        handler, args = getattr(instance, "webSocketClose", None), (ws, msg.code, msg.reason, msg.was_clean)
    else:
        handler, args = getattr(instance, "webSocketError", None), (ws, RuntimeError(msg.reason))
    if handler is None:
        if msg.kind == "message":
            raise TypeError(
                f"{type(instance).__name__} accepted a WebSocket but has no "
                "`async def webSocketMessage(self, ws, message)`"
            )
        return
    result = handler(*args)
    if inspect.isawaitable(result):
        await result


async def serve_scheduled(channel: Channel, handler, msg: ipc.Scheduled) -> None:
    """A Cron Trigger fired: run the scheduled handler, wait for its waitUntil work (the event
    lasts until that ends, as on Workers), answer InvokeResult or InvokeError, then RequestDone
    (the runtime counts CPU until then)."""
    event = Invocation(channel, msg.id)
    ctx = event.ctx
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
        event.answer(ipc.InvokeResult(msg.id, 200, headers, b""))
    except asyncio.CancelledError:  # the runtime cancelled it: it ran out of time
        event.cancelled("scheduled event")
    except Exception as exc:
        ctx.cancel()
        event.failed(exc)
    await event.end(settle=False)  # settled before the answer


async def serve_queue(channel: Channel, handler, msg: ipc.QueueBatch) -> None:
    """A batch of queue messages: run the queue handler (its waitUntil work is part of the event),
    send what became of each message (QueueOutcome: on success the messages not retried are
    acked; when it raises, the ones not acked are retried), then InvokeResult or InvokeError,
    then RequestDone."""
    event = Invocation(channel, msg.id)
    ctx = event.ctx
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
        reply, failed = event.error(exc), True
    acked, retried = batch.outcome(failed)
    event.answer(ipc.QueueOutcome(msg.id, acked, retried))
    event.answer(reply)
    await event.end(settle=False)  # settled before the answer


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
    event = Invocation(channel, msg.id)
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
        event.cancelled("call")
    except Exception as exc:  # the object's own failure: reported to its caller
        event.failed(exc)
    await event.end()


async def serve_workflow(channel: Channel, workflow: type, env: Env, msg: ipc.WorkflowRun) -> None:
    """One run of a workflow instance: a fresh instance of the class, `run(event, step)` from the
    top; each step asks the runtime first (binding "workflow.step"). ObjectResult {"output": x}
    or {"suspend": True} (it stopped at a sleep or wait), or InvokeError, then RequestDone."""
    event = Invocation(channel, msg.id)
    step = WorkflowStep(
        lambda method, args, kwargs: channel.call_binding("workflow.step", method, args, kwargs)
    )
    try:
        try:
            output = await workflow(event.ctx, env).run(
                workflow_event(msg.payload, msg.timestamp_ms, msg.instance_id), step
            )
            reply: dict[str, Any] = {"output": output}
        except Suspend:
            reply = {"suspend": True}
        try:
            channel.send(ipc.ObjectResult(msg.id, reply))
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"the output of {workflow.__name__}.run cannot be stored ({exc}); return JSON-like values "
                f"of at most {ipc.FROM_ISOLATE // 2**20} MiB"
            ) from None
    except asyncio.CancelledError:
        event.cancelled("run")
    except Exception as exc:  # the workflow's own failure: the instance errors
        event.failed(exc)
    await event.end()


async def serve_alarm(channel: Channel, instance: Any, msg: ipc.ObjectAlarm) -> None:
    """The object's alarm is due: `alarm(self, alarm_info)` runs (alarm_info.retryCount,
    .isRetry); InvokeResult or InvokeError (the runtime retries it), then RequestDone."""
    event = Invocation(channel, msg.id)
    cls = type(instance)
    try:
        handler = getattr(instance, "alarm", None)
        if handler is None or not inspect.iscoroutinefunction(handler):
            raise TypeError(
                f"{cls.__name__} has an alarm set but no alarm handler: define "
                "`async def alarm(self, alarm_info=None)`"
            )
        info = JsObject(retryCount=msg.retry_count, isRetry=msg.retry_count > 0)
        info.retry_count, info.is_retry = info["retryCount"], info["isRetry"]
        await handler(*(info,)[: _arity(type(instance).alarm, 1, method=True)])
        await event.ctx.settle()
        event.answer(ipc.InvokeResult(msg.id, 200, [], b""))
    except asyncio.CancelledError:
        event.cancelled("alarm")
    except Exception as exc:
        event.ctx.cancel()
        event.failed(exc)
    await event.end(settle=False)  # settled before the answer


def sdk_client(path: str) -> type:
    """The SDK class a store binding's kind names ("workers.kv:KVNamespace"), imported from workers/."""
    module, _, name = path.partition(":")
    if not module.startswith("workers.") or not name:
        raise SystemExit(f"isolate: a binding client must be a class in workers/, not {path!r}")
    cls = getattr(importlib.import_module(module), name, None)
    if not isinstance(cls, type):
        raise SystemExit(f"isolate: {path!r} names no class")
    return cls


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
    # each name's kind, as Cloudflare's types name them, for the error env.MISSING raises
    kinds = dict.fromkeys(init.vars, "var")
    if init.ai_binding:
        values[init.ai_binding] = AIBinding(channel)
        kinds[init.ai_binding] = "Ai"
    for name in init.services:
        values[name] = ServiceBinding(channel, name)
        kinds[name] = "Fetcher"
    for name, client in init.bindings.items():  # each call crosses as ipc.BindingCall
        cls = sdk_client(client)
        # a client whose answers may stream (AI Search's) reads them as env.AI.run's are read
        call = channel.call_binding_streamable if getattr(cls, "streams", False) else channel.call_binding
        values[name] = cls(
            lambda method, args, kwargs, _name=name, _call=call: _call(_name, method, args, kwargs)
        )
        kinds[name] = type(values[name]).__name__  # KVNamespace, D1Database, R2Bucket...
    for name, key in init.durable_objects.items():  # each call crosses as ipc.ObjectCall
        values[name] = DurableObjectNamespace(name, key, channel.call_object)
        kinds[name] = "DurableObjectNamespace"
    capture_logs(channel)
    websocket._install(ChannelSockets(channel), init.socket_base)
    for held in init.sockets[: websocket.HELD_MAX]:  # a hibernated object's sockets, back with it
        websocket.held(held.ws, list(held.tags), held.attachment)
    install_fetch(lambda method, url, headers, body: channel.fetch(method, url, headers, body))
    try:
        script = Path(init.script)
        if init.memory_mb:
            sandbox.limit_memory(init.memory_mb)
        if init.sandbox and init.jailed:  # the jail's view is all there is: read it, scribble in /tmp
            sandbox.restrict(["/"], writable=["/dev/null"], scratch=["/tmp"])
        elif init.sandbox:  # from here the kernel confines what the script can touch
            sandbox.restrict(sandbox_paths(script, init.deps), writable=["/dev/null"])
        env = Env(values, kinds)
        install_context(env=env, current_ctx=current_ctx.get)  # workers.env, workers.wait_until
        instance = None
        workflow = None
        if init.workflow:  # this isolate runs one workflow's instances
            workflow = load_workflow(script, init.workflow)
            entry, handlers = init.workflow, Handlers(init.workflow)
        elif init.durable_object:  # this isolate is one Durable Object: its storage is its own
            storage = DurableObjectStorage(
                lambda method, args, kwargs: channel.call_binding("ctx.storage", method, args, kwargs),
                lambda method, args, kwargs: channel.call_binding_sync("ctx.storage", method, args, kwargs),
            )
            state = DurableObjectState(
                DurableObjectId(init.object_id or ""), storage, lambda aw: current_ctx.get().waitUntil(aw)
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
        elif isinstance(msg, ipc.WorkflowRun) and workflow is not None:
            channel.tasks[msg.id] = asyncio.create_task(serve_workflow(channel, workflow, env, msg))
        elif isinstance(msg, ipc.SocketEvent):
            task = asyncio.create_task(serve_socket_event(channel, instance, msg))
            channel.tasks[msg.id] = task
        elif isinstance(msg, ipc.ObjectAlarm) and instance is not None:
            channel.tasks[msg.id] = asyncio.create_task(serve_alarm(channel, instance, msg))
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
