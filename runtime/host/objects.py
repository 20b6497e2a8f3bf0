"""Durable Objects, simulated: the namespaces behind `env.NS` and the one instance per id.

Each instance runs in its own isolate (the same worker script, jailed and limited as the worker
is, its entry the Durable Object class instead of Default) and is reached only through the
runtime: a stub's call crosses from the caller's isolate as ipc.ObjectCall, is checked here (the
binding is the caller's own, the id one of that namespace, the method a public name, the values
JSON-like), and runs in the object's isolate as ipc.ObjectInvoke (fetch: as a request). Calls to
one object run one at a time, in arrival order (roughly what Cloudflare's input gates give), so a
call that comes back to an object already waiting in its chain (A -> B -> A), or two calls each
holding an object the other waits for, would wait for ever: the runtime refuses such a call at once
(DO_CALL_CYCLE), from what it alone tracks (which object each call runs in, and which objects an
object's current call waits for), never from what a script sends. The object's storage
(`ctx.storage`) crosses as ipc.BindingCall naming OBJECT_STORAGE, which the runtime scopes to that
object's id (runtime.bindings.do_storage), so no object can reach another's. An instance idle for
IDLE_S is stopped; the next call starts it again, its storage intact. One whose only open WebSockets
it accepted with ctx.acceptWebSocket hibernates after `hibernate_s` idle: its isolate is stopped,
the runtime keeps the sockets (runtime.host.sockets, one SocketOwner per object, outliving its
isolates) and the next message or close starts a new isolate that gets them back. Its alarm
(runtime.events.alarms) runs in its turn as a call does.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from starlette.responses import Response

from runtime.host.invocation import Invocation
from runtime.host.sockets import ServerSocket, SocketEvent, SocketOwner, SocketUpgrade
from runtime.host.spec import ObjectAddress, WorkerSpec
from runtime.http.errors import InternalRequest
from runtime.isolate import ipc
from runtime.isolate.console import indented
from runtime.isolate.process import IsolateCrashed, WorkerLoadError
from workers.durable_objects import check_rpc_value, valid_id

log = logging.getLogger("edge.objects")

OBJECT_STORAGE = "ctx.storage"  # the binding an object's isolate names for its own storage
IDLE_S = 60.0  # an object's isolate with no call for this long is stopped
# ... and one whose only open WebSockets are accepted with ctx.acceptWebSocket hibernates after
# this long (its isolate stopped, the runtime holding the sockets; `[edge] hibernate_s`)
HIBERNATE_S = 10.0
# Durable Object isolates one account may have running at once: each is a process tree, and a
# script could otherwise start one per newUniqueId() until the host runs out
MAX_RUNNING_PER_ACCOUNT = 16
METHOD_CHARS = 128
FETCH_BODY_BYTES = ipc.TO_ISOLATE - ipc.CHUNK  # a stub.fetch response crosses back in one frame
CALL_CYCLE = "DO_CALL_CYCLE"  # the stable code of a refused call cycle, first in its message


def namespace_key(account: str, script: str, class_name: str) -> str:
    """The key ids of a namespace are made with (it is no secret: ids are addresses, and any id of
    the namespace is the caller's to use)."""
    return hashlib.sha256(f"{account}\0{script}\0{class_name}".encode()).hexdigest()[:32]


def _refuse(call: ipc.ObjectCall, error_type: str, message: str) -> ipc.ObjectReply:
    return ipc.ObjectReply(call.call, error_type=error_type, error_message=message)


class ObjectHandle(Protocol):
    """The running worker that serves one object (runtime.host.worker.WorkerHandle)."""

    sockets: SocketOwner  # the object's WebSockets: given the object's own, which outlive the handle

    async def serve(self, request: Any, body: bytes, ctx: Invocation, headers_out: dict) -> Response: ...

    async def call_object(
        self, method: str, args: list, kwargs: dict, ctx: Invocation
    ) -> ipc.ObjectResult | ipc.InvokeError: ...

    async def alarm(
        self, retry_count: int, scheduled_ms: int, objects: tuple = ()
    ) -> tuple[str, dict | None]: ...

    async def socket_event(self, sock: ServerSocket, event: SocketEvent) -> None: ...

    async def stop(self) -> None: ...


@dataclass
class _Instance:
    handle: ObjectHandle
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)  # FIFO: calls in arrival order
    waiting: int = 0  # calls holding or waiting for the turn
    last_used: float = field(default_factory=time.monotonic)
    # the instances (keys) its current call is calling: waiting for their turn, or running there
    calling: Counter = field(default_factory=Counter)


def _show(key: tuple | str) -> str:
    """An instance key as a cycle names it, `Class(id)`; a worker (a str) as `worker NAME`."""
    return f"{key[3]}({key[4]})" if isinstance(key, tuple) else f"worker {key}"


def _cycle_message(path: list) -> str:
    return (
        f"{CALL_CYCLE}: Durable Object call cycle: {' -> '.join(_show(k) for k in path)}; calls to one "
        "object run one at a time, so this one would wait for a call that waits for it: pass what the "
        "inner object needs as arguments, or return it to the caller, instead of calling back"
    )


class DurableObjects:
    """Every running Durable Object instance, keyed by (account, script, version, class, id)."""

    def __init__(
        self,
        start: Callable[[WorkerSpec], ObjectHandle],
        idle_s: float = IDLE_S,
        hibernate_s: float = HIBERNATE_S,
        on_hibernate: Callable[[], None] | None = None,
    ):
        self.start = start  # a handle for an object's spec (its isolate starts on the first call)
        self.idle_s, self.hibernate_s = idle_s, hibernate_s
        self.on_hibernate = on_hibernate
        self.hibernations = 0  # objects stopped while the runtime held their sockets
        self._owners: dict[tuple, SocketOwner] = {}  # each object's WebSockets, across its isolates
        self._instances: dict[tuple, _Instance] = {}
        self._reaper: asyncio.Task | None = None
        self._stopping: set[asyncio.Future] = set()  # evicted instances on their way out

    # --- a call ---------------------------------------------------------------------------------

    async def call(self, spec: WorkerSpec, call: ipc.ObjectCall, ctx: Invocation) -> ipc.ObjectReply:
        """`spec`'s worker calls an object of one of its namespaces."""
        ref = spec.durable_objects.get(call.binding) if isinstance(call.binding, str) else None
        if ref is None:
            return _refuse(call, "TypeError", f"no Durable Object binding named {call.binding!r}")
        if ref.script_name not in (None, spec.name):
            return _refuse(
                call,
                "Error",
                f"env.{call.binding}: class {ref.class_name} of worker {ref.script_name!r} is another "
                "worker's Durable Object; only this worker's own classes are simulated (drop script_name)",
            )
        if not valid_id(namespace_key(spec.account, spec.name, ref.class_name), call.object_id):
            return _refuse(call, "TypeError", f"Invalid Durable Object ID for env.{call.binding}")
        method = call.method
        if not isinstance(method, str) or len(method) > METHOD_CHARS or not method.isidentifier():
            return _refuse(call, "TypeError", "the method must be a Python identifier")
        if method.startswith("_"):
            return _refuse(call, "TypeError", f"{ref.class_name}.{method} is private; it cannot be called")
        try:
            if not isinstance(call.args, list) or not isinstance(call.kwargs, dict):
                raise TypeError("arguments must be a list and keyword arguments a dict")
            if method == "fetch":
                request = _fetch_parts(call.args)
            else:
                check_rpc_value(call.args, f"{method}: arguments")
                check_rpc_value(call.kwargs, f"{method}: keyword arguments")
        except TypeError as exc:
            return _refuse(call, "TypeError", str(exc))
        here = spec.durable_object
        if here is not None and (here.class_name, here.id) == (ref.class_name, call.object_id):
            return _refuse(
                call,
                "Error",
                f"{ref.class_name} called itself through a stub: calls to one object run one at a time, "
                "so it would wait for itself; call the method directly",
            )
        key = (spec.account, spec.name, spec.version, ref.class_name, call.object_id)
        caller = (spec.account, spec.name, spec.version, here.class_name, here.id) if here else None
        if (path := self._cycle(caller, key, ctx, spec.name)) is not None:
            log.warning("Durable Object call refused: %s", " -> ".join(_show(k) for k in path))
            return _refuse(call, "Error", _cycle_message(path))
        instance = self._instance(spec, ref.class_name, call.object_id)
        if instance is None:
            return _refuse(
                call,
                "Error",
                f"more than {MAX_RUNNING_PER_ACCOUNT} Durable Objects of this account are busy at once; "
                "retry when one has finished",
            )
        calling = self._instances.get(caller) if caller else None  # the caller's own instance
        if calling is not None:
            calling.calling[key] += 1
        instance.waiting += 1
        try:
            async with instance.turn:
                instance.last_used = time.monotonic()
                if method == "fetch":
                    return await self._fetch(instance.handle, key, call, request, ctx)
                return await self._rpc(instance.handle, key, call, ctx)
        finally:
            instance.waiting -= 1
            instance.last_used = time.monotonic()
            if calling is not None:
                calling.calling[key] -= 1
                if calling.calling[key] <= 0:
                    del calling.calling[key]

    async def alarm(
        self, spec: WorkerSpec, class_name: str, object_id: str, retry_count: int, due_ms: int
    ) -> str:
        """Run the object's alarm handler in its turn (one call at a time, as any call); returns
        the outcome ("ok" when it succeeded; anything else is retried by the scheduler)."""
        if not any(ref.class_name == class_name and ref.script_name in (None, spec.name)
                   for ref in spec.durable_objects.values()):  # fmt: skip
            return "gone"
        instance = self._instance(spec, class_name, object_id)
        if instance is None:
            return "busy"
        key = (spec.account, spec.name, spec.version, class_name, object_id)
        instance.waiting += 1
        try:
            async with instance.turn:
                instance.last_used = time.monotonic()
                outcome, exception = await instance.handle.alarm(retry_count, due_ms, (key,))
        finally:
            instance.waiting -= 1
            instance.last_used = time.monotonic()
        if exception:
            log.warning("Durable Object %s(%s) alarm failed (try %d): %s: %s", class_name, object_id[:8],
                        retry_count + 1, exception.get("name"), exception.get("message"))  # fmt: skip
        return outcome

    async def _socket_event(
        self, spec: WorkerSpec, class_name: str, object_id: str, sock: ServerSocket, event: SocketEvent
    ) -> None:
        """A client's message or close for one of the object's sockets, in the object's turn;
        a hibernated object is woken for it (a new isolate, its sockets handed back)."""
        instance = self._instance(spec, class_name, object_id)
        if instance is None:
            if event.kind == "message":
                sock.cut(1013, f"more than {MAX_RUNNING_PER_ACCOUNT} Durable Objects of this account are "
                         "busy at once; try again later")  # fmt: skip
            return
        instance.waiting += 1
        try:
            async with instance.turn:
                instance.last_used = time.monotonic()
                await instance.handle.socket_event(sock, event)
        finally:
            instance.waiting -= 1
            instance.last_used = time.monotonic()

    def _cycle(self, caller: tuple | None, target: tuple, ctx: Invocation, worker: str) -> list | None:
        """The cycle a call from `caller` (the instance it runs in; None: a worker's request) to
        `target` would close, as the path of instances from target back to target; None if none.
        Two ways, both the runtime's own books: the chain of objects the request is nested in
        (ctx.objects, which crosses service bindings too), and what each busy instance's current
        call is calling (which also finds two requests each holding what the other waits for)."""
        held = self._instances.get(target)
        if target in ctx.objects and held is not None and held.turn.locked():
            path = list(ctx.objects[ctx.objects.index(target) :])
            return [*path, worker, target] if caller is None else [*path, target]
        if caller is None:
            return None
        # depth first from target along "its current call is calling": back at caller, a cycle
        stack, seen = [[target]], {target}
        while stack:
            path = stack.pop()
            if path[-1] == caller:
                return [*path, target]
            instance = self._instances.get(path[-1])
            if instance is None or not instance.turn.locked():
                continue
            for nxt in instance.calling:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None

    async def _rpc(
        self, handle: ObjectHandle, key: tuple, call: ipc.ObjectCall, ctx: Invocation
    ) -> ipc.ObjectReply:
        class_name = key[3]
        sub = ctx.sub("RPC", f"{class_name}.{call.method}")
        sub.objects = (*ctx.objects, key)
        try:
            outcome = await handle.call_object(call.method, call.args, call.kwargs, sub)
        except (WorkerLoadError, IsolateCrashed) as exc:
            return _refuse(call, "Error", f"{class_name}: {exc}")
        if isinstance(outcome, ipc.InvokeError):
            name, _, message = outcome.message.partition(": ")
            log.warning("Durable Object %s.%s threw: %s", class_name, call.method,
                        indented(f"{outcome.message}\n{outcome.traceback}"))  # fmt: skip
            return _refuse(call, name[:64] or "Error", message or outcome.message)
        try:
            check_rpc_value(outcome.result, f"the result of {class_name}.{call.method}")
        except TypeError as exc:
            return _refuse(call, "TypeError", str(exc))
        return ipc.ObjectReply(call.call, result=outcome.result)

    async def _fetch(
        self, handle: ObjectHandle, key: tuple, call: ipc.ObjectCall, request: tuple, ctx: Invocation
    ) -> ipc.ObjectReply:
        method, url, headers, body = request
        sub = ctx.sub(method, url)
        sub.objects = (*ctx.objects, key)
        response = await handle.serve(InternalRequest(method, url, headers), body, sub, {})
        if isinstance(response, SocketUpgrade):  # the worker passes it on, by a token only it may use
            token = response.socket.owner.hub.offer(response.socket)
            return ipc.ObjectReply(call.call, result=[101, response.upgrade_headers, b"", token])
        if hasattr(response, "body_iterator"):
            chunks, size = [], 0
            async for chunk in response.body_iterator:
                size += len(chunk)
                if size > FETCH_BODY_BYTES:
                    return _refuse(
                        call, "Error", f"stub.fetch: the response is over {FETCH_BODY_BYTES // 2**20} MiB"
                    )
                chunks.append(chunk)
            data = b"".join(chunks)
        else:
            data = bytes(response.body)
        return ipc.ObjectReply(call.call, result=[response.status_code, list(response.headers.items()), data])

    def _instance(self, spec: WorkerSpec, class_name: str, object_id: str) -> _Instance | None:
        """The running instance for the id, started if needed; past MAX_RUNNING_PER_ACCOUNT the
        account's least recently used idle instance is stopped first (its storage stays), and
        None when all of them are busy."""
        key = (spec.account, spec.name, spec.version, class_name, object_id)
        instance = self._instances.get(key)
        if instance is None:
            mine = [(k, i) for k, i in self._instances.items() if k[0] == spec.account]
            if len(mine) >= MAX_RUNNING_PER_ACCOUNT:
                idle = [(i.last_used, k) for k, i in mine if i.waiting == 0]
                if not idle:
                    return None
                _, oldest = min(idle)
                evicted = self._instances.pop(oldest)
                self._stopping.add(asyncio.ensure_future(evicted.handle.stop()))
                self._stopping = {t for t in self._stopping if not t.done()}
            object_spec = msgspec.structs.replace(spec, durable_object=ObjectAddress(class_name, object_id))
            handle = self.start(object_spec)
            owner = self._owners.get(key)
            if owner is None:

                async def deliver(sock: ServerSocket, event: SocketEvent) -> None:
                    await self._socket_event(spec, class_name, object_id, sock, event)

                owner = self._owners[key] = SocketOwner(
                    handle.sockets.hub, spec.account, handle.sockets.label, deliver
                )
            handle.sockets = owner
            instance = self._instances[key] = _Instance(handle)
            if self._reaper is None or self._reaper.done():
                self._reaper = asyncio.create_task(self._reap())
        return instance

    # --- lifecycle --------------------------------------------------------------------------------

    async def _reap(self) -> None:
        """Stop instances idle for idle_s (the next call starts a fresh isolate)."""
        while self._instances:
            await asyncio.sleep(min(10.0, self.idle_s / 2, self.hibernate_s / 2))
            now = time.monotonic()
            for key, instance in list(self._instances.items()):
                sockets = list(instance.handle.sockets.sockets.values())
                if any(not s.hibernatable for s in sockets):  # its isolate holds them: it stays
                    continue
                if instance.waiting == 0 and now - instance.last_used >= (
                    self.hibernate_s if sockets else self.idle_s
                ):
                    del self._instances[key]
                    await instance.handle.stop()
                    if sockets:
                        self.hibernations += 1
                        if self.on_hibernate is not None:
                            self.on_hibernate()
                        log.info("Durable Object %s(%s) hibernated: its isolate stopped, %d WebSocket(s) "
                                 "held by the runtime", key[3], key[4][:8], len(sockets))  # fmt: skip
                    else:
                        log.info("Durable Object %s:%s idle: stopped", key[3], key[4][:8])
            for key in [k for k, o in self._owners.items() if not o.sockets and k not in self._instances]:
                del self._owners[key]

    async def stop_worker(self, account: str, script: str) -> None:
        """The worker's code or env changed: its objects start again on their next call."""
        for key in [k for k in self._instances if k[:2] == (account, script)]:
            await self._instances.pop(key).handle.stop()
        for key in [k for k in self._owners if k[:2] == (account, script)]:
            self._owners.pop(key).close_all(1012, "the worker's code changed")

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for instance in self._instances.values():
            await instance.handle.stop()
        self._instances.clear()
        for owner in self._owners.values():
            owner.close_all(1001, "the runtime is stopping")

    def running(self) -> int:
        return len(self._instances)


def _fetch_parts(args: list) -> tuple[str, str, list[tuple[str, str]], bytes]:
    """stub.fetch's [method, url, headers, body], checked."""
    if len(args) != 4:
        raise TypeError("stub.fetch crosses as [method, url, headers, body]")
    method, url, headers, body = args
    if not isinstance(method, str) or not method.isalpha() or len(method) > 16:
        raise TypeError("stub.fetch: the method must be an HTTP method")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 16384:
        raise TypeError("stub.fetch: the URL must be an absolute http(s) URL")
    if not isinstance(body, bytes):
        raise TypeError("stub.fetch: the body must be bytes")
    pairs: list[tuple[str, str]] = []
    if not isinstance(headers, list) or len(headers) > 256:
        raise TypeError("stub.fetch: headers must be a list of at most 256 [name, value] pairs")
    for pair in headers:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise TypeError("stub.fetch: each header is a [name, value] pair of strings")
        pairs.append((pair[0], pair[1]))
    return method.upper(), url, pairs, body
