"""One jailed process tree per worker: starts it, invokes its fetch handler, answers its calls,
and holds it to its limits.

The isolate runs in runtime.isolate.jail's namespaces (its own user, PID, network, IPC and mount
namespaces, no capabilities, seccomp) with Landlock inside; `edge dev --insecure-isolation` drops
the namespaces and keeps process separation and Landlock. Nothing the script does can lift a
limit: the runtime reads the whole tree's CPU time and memory from the kernel and kills the tree
when a request goes past its budget, and every pipe between the two is bounded.

Its parts, all on the runtime's side: runtime.isolate.launch (the process and its jail),
isolate_calls (answering the isolate's calls), isolate_streams (bodies, in windows),
isolate_watchdog (the limits' books), isolate_output (stdout and stderr pipes), isolate_console
(the worker's console lines in edge dev's terminal).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec

from runtime.control.limits import IsolateLimits
from runtime.isolate import ipc, proctree
from runtime.isolate import view as isolate_view
from runtime.isolate.calls import CALLS, CallDesk, Link, ProtocolError, serve_sync
from runtime.isolate.host import IsolateHost, QuietHost
from runtime.isolate.launch import (
    insecure_isolation,
    isolation_problem,
    spawn_process,
    use_insecure_isolation,
)
from runtime.isolate.output import OutputPump
from runtime.isolate.streams import Streams
from runtime.isolate.types import ExceededResources, IsolateCrashed, WorkerLoadError
from runtime.isolate.watchdog import Watchdog

log = logging.getLogger("edge.isolate")

__all__ = [  # the errors and limits live in runtime.isolate.types; imported from here too
    "ExceededResources",
    "Isolate",
    "IsolateCrashed",
    "IsolateLimits",
    "WorkerLoadError",
    "insecure_isolation",
    "isolation_problem",
    "use_insecure_isolation",
]


class Isolate:
    def __init__(
        self,
        name: str,
        script: Path,
        vars: dict[str, Any],
        ai_binding: str | None,
        host: IsolateHost | None = None,
        *,
        services: list[str] = (),
        limits: IsolateLimits | None = None,
        bindings: dict[str, str] | None = None,
        durable_objects: dict[str, str] | None = None,
        durable_object: tuple[str, str] | None = None,
        deps: Path | None = None,
        workflow: str | None = None,
    ):
        """`host`: what answers the isolate's calls and takes its lines, sockets and exit
        (runtime.isolate.host); a QuietHost, which refuses every call, when none is given."""
        self.name = name
        self.script = script
        self.vars = vars
        self.ai_binding = ai_binding
        self.services = list(services)
        self.limits = limits or IsolateLimits()
        self.host: IsolateHost = host if host is not None else QuietHost(name=name)
        self.bindings = dict(bindings or {})  # store bindings: env name -> SDK client (ipc.Init)
        self.durable_objects = dict(durable_objects or {})  # env name -> namespace key
        self.durable_object = durable_object  # (class, id): this isolate serves that one object
        self.workflow = workflow  # a Workflow class: this isolate runs its instances (WorkflowRun)
        self._object_calls: set[int] = set()  # requests that are RPC calls (answered by ObjectResult)
        self.deps = deps  # the project's installed dependencies (runtime.host.deps), on its sys.path
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}  # request -> its outcome
        # queue deliveries in flight -> what the isolate said became of their messages
        self._queue_outcomes: dict[int, ipc.QueueOutcome | None] = {}
        self._watchdog = Watchdog()  # the requests in flight, until RequestDone, and CPU outside them
        # streamed request and response bodies, each way held to ipc.WINDOW chunks in flight
        link = Link(self._send, self._deliver, self._spawn)
        self._streams = Streams(name, self._watchdog, link)
        # AI, fetch, binding and Durable Object calls from the isolate
        self._calls = CallDesk(self.host, link)
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: set[asyncio.Task] = set()
        self._start_lock = asyncio.Lock()
        self._stopping: ExceededResources | None = None
        # stdout and stderr pipes, bounded, to the host
        self.output = OutputPump(name, self.host.output)
        self.entry: str | None = None
        self.jailed = False
        self.generation = 0  # starts so far: a socket made by an earlier process is not this one's

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and self._writer is not None

    @property
    def pid(self) -> int | None:
        """The root of the isolate's process tree (the jail's launcher)."""
        return self._proc.pid if self._proc is not None else None

    # --- starting ---------------------------------------------------------------------------------

    async def start(self, timeout: float = 30.0) -> None:
        self._proc, parent, sync_parent, self.jailed = await spawn_process(
            self.name, self.script, self.limits, self.deps
        )
        self._stopping = None
        self.generation += 1
        first_socket, held = self.host.held_sockets()
        reader, writer = await asyncio.open_unix_connection(sock=parent, limit=ipc.CHUNK)
        self._spawn(serve_sync(self.name, sync_parent, self.host.binding, self.stop))
        script = f"{isolate_view.BUNDLE}/{self.script.name}" if self.jailed else str(self.script)
        init = ipc.Init(
            script,
            self.vars,
            self.ai_binding,
            self.services,
            self.limits.memory_mb,
            self.limits.sandbox,
            self.jailed,
            bindings=self.bindings,
            durable_objects=self.durable_objects,
            durable_object=self.durable_object[0] if self.durable_object else None,
            object_id=self.durable_object[1] if self.durable_object else None,
            workflow=self.workflow,
            deps=str(self.deps) if self.deps and not self.jailed else "",
            sockets=held,
            socket_base=first_socket,
        )
        writer.write(ipc.encode(init))
        await writer.drain()
        self._spawn(self.output.pump(self._proc.stdout, "log"))
        self._spawn(self.output.pump(self._proc.stderr, "error"))
        try:
            first = await asyncio.wait_for(self._first_message(reader), timeout)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, ValueError) as exc:
            await asyncio.sleep(0.05)  # let the pumps take the jail's last words
            await self.stop()
            said = " ".join(line for line in self.output.stderr_tail if line.startswith("edge:"))
            raise WorkerLoadError(
                f"{self.script.name}: the isolate did not start ({said or type(exc).__name__})"
            ) from None
        if isinstance(first, ipc.LoadFailed):
            await self.stop()
            raise WorkerLoadError(f"{self.script.name} failed to load: {first.message}", first.traceback)
        if not isinstance(first, ipc.Ready):
            await self.stop()
            raise WorkerLoadError(f"{self.script.name}: the isolate broke the protocol at start")
        self.entry = first.entry
        self._writer = writer
        self._watchdog.started(proctree.usage(self._proc.pid))
        self._spawn(self._read_loop(reader))
        self._spawn(self._watch())
        self._spawn(self._wait_exit(self._proc))
        log.info(
            "isolate for %s started (pid %s, entry %s, %s)",
            self.name,
            self._proc.pid,
            self.entry,
            "jailed" if self.jailed else "NOT jailed",
        )

    async def ensure_started(self) -> None:
        """Start the process unless it runs (one start at a time: a request and edge dev's load of
        a saved script may ask at once); WorkerLoadError when the script does not load."""
        async with self._start_lock:
            if not self.alive:
                await self.stop()
                await self.start()

    # --- a request --------------------------------------------------------------------------------

    def next_request_id(self) -> int:
        return next(self._ids)

    async def _event(
        self,
        message: Callable[[int], ipc.Message],
        request_id: int | None,
        after_send: Callable[[int], None] | None = None,
    ) -> tuple[int, Any]:
        """One event for the worker (a request, a cron run, a queue batch, an RPC call): it starts
        the isolate if needed, counts as a request (CPU from the watchdog's last look, at most
        10 ms old while requests run: a fresh read of the tree would cost more than a request),
        and returns (its id, the isolate's answer); what is left after the answer (a streamed body,
        waitUntil work) stays in flight until RequestDone."""
        await self.ensure_started()
        rid = request_id if request_id is not None else next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._watchdog.begin(rid)
        self.output.reset()
        try:
            self._send(message(rid))
            if after_send is not None:
                after_send(rid)
            outcome = await future
        except BaseException:
            self._end(rid)
            raise
        finally:
            self._pending.pop(rid, None)
        self._watchdog.answered(rid, streaming=isinstance(outcome, ipc.InvokeStart))
        return rid, outcome

    async def invoke(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes | AsyncIterator[bytes],
        cf: dict[str, Any],
        request_id: int | None = None,
    ) -> ipc.InvokeResult | ipc.InvokeError | ipc.InvokeStart:
        """Run the worker's handler; a body larger than one chunk (or a stream) is sent in chunks,
        as fast as the worker reads it."""
        inline = body if isinstance(body, (bytes, bytearray)) and len(body) <= ipc.CHUNK else None

        def upload(rid: int) -> None:
            if inline is None:
                self._streams.upload(rid, body)

        _, outcome = await self._event(
            lambda rid: ipc.Invoke(rid, method, url, headers, bytes(inline or b""), cf, inline is None),
            request_id,
            upload,
        )
        return outcome

    async def schedule(
        self, cron: str, scheduled_time_ms: int, request_id: int | None = None
    ) -> ipc.InvokeResult | ipc.InvokeError:
        """Run the worker's scheduled handler (a Cron Trigger); it counts as a request, held to
        the same CPU and wall-clock limits, and answers once its waitUntil work has ended."""
        _, outcome = await self._event(
            lambda rid: ipc.Scheduled(rid, cron, int(scheduled_time_ms)), request_id
        )
        return outcome

    async def deliver(
        self, queue: str, messages: list[ipc.QueuedMessage], request_id: int | None = None
    ) -> tuple[ipc.InvokeResult | ipc.InvokeError, ipc.QueueOutcome | None]:
        """Run the worker's queue handler on a batch; it counts as a request, held to the same
        CPU and wall-clock limits. Returns the result and what the isolate says became of each
        message (None if it said nothing: every message is then retried)."""
        rid = request_id if request_id is not None else next(self._ids)
        self._queue_outcomes[rid] = None  # before the batch goes: its outcome may come at once
        try:
            _, outcome = await self._event(lambda r: ipc.QueueBatch(r, queue, messages), rid)
        finally:
            settled = self._queue_outcomes.pop(rid, None)
        return outcome, settled

    async def call_object(
        self, method: str, args: list, kwargs: dict, request_id: int | None = None
    ) -> ipc.ObjectResult | ipc.InvokeError:
        """An RPC call on the Durable Object this isolate serves; a request as any other, held to
        the same CPU and wall-clock limits."""
        rid = request_id if request_id is not None else next(self._ids)
        self._object_calls.add(rid)  # answered by ObjectResult, which only such calls may get
        try:
            _, outcome = await self._event(lambda r: ipc.ObjectInvoke(r, method, args, kwargs), rid)
        finally:
            self._object_calls.discard(rid)
        return outcome

    async def run_workflow(
        self, instance_id: str, payload: Any, timestamp_ms: int, request_id: int | None = None
    ) -> ipc.ObjectResult | ipc.InvokeError:
        """One run of a workflow instance in this workflow's isolate; a request as any other, held
        to the same CPU and wall-clock limits."""
        rid = request_id if request_id is not None else next(self._ids)
        self._object_calls.add(rid)  # answered by ObjectResult, as an RPC call is
        try:
            _, outcome = await self._event(
                lambda r: ipc.WorkflowRun(r, instance_id, payload, int(timestamp_ms)), rid
            )
        finally:
            self._object_calls.discard(rid)
        return outcome

    async def alarm(
        self, retry_count: int, request_id: int | None = None
    ) -> ipc.InvokeResult | ipc.InvokeError:
        """The alarm of the Durable Object this isolate serves is due: its alarm handler runs, a
        request as any other, held to the same CPU and wall-clock limits."""
        _, outcome = await self._event(lambda rid: ipc.ObjectAlarm(rid, retry_count), request_id)
        return outcome

    async def socket_event(
        self, event: Callable[[int], ipc.SocketEvent], request_id: int | None = None
    ) -> ipc.InvokeResult | ipc.InvokeError:
        """A client's WebSocket message or close for the worker: an event as a request is."""
        _, outcome = await self._event(event, request_id)
        return outcome

    def body(self, request_id: int) -> AsyncIterator[bytes]:
        """The streamed body of a response that began with InvokeStart, taken at the client's pace;
        if the client goes away first, the isolate's stream is cancelled. A stream that fails
        raises IsolateCrashed, so that the HTTP connection is cut rather than the body ended."""
        return self._streams.read(request_id)

    def _end(self, rid: int) -> None:
        """The request and everything it started are over: its calls still in flight end too."""
        self._watchdog.end(rid)
        self._streams.end(rid)
        self._calls.end(rid)

    # --- the watchdog -----------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Read the tree's CPU time and memory from the kernel, and act on the watchdog's look
        (runtime.isolate.watchdog): a request past its wall-clock limit is failed and the isolate
        asked to stop it; past a CPU, memory or wall-clock limit, the whole tree is killed (1102),
        whatever it does."""
        memory = self._watchdog.memory_base + self.limits.memory_mb * 1024 * 1024
        while self._proc is not None and self._proc.returncode is None:
            usage = proctree.usage(self._proc.pid)
            if usage is None:
                return
            look = self._watchdog.look(usage, self.limits, memory)
            for rid in look.cancel:
                self._fail(rid, ExceededResources("exceededWallTime", "the request ran out of wall time"))
                if self._writer is not None:
                    self._send(ipc.Cancel(rid))
            if look.kill is not None:
                await self._kill(*look.kill)
                return
            await asyncio.sleep(0.01 if self._watchdog.busy else 0.05)

    async def _kill(self, outcome: str, message: str) -> None:
        reason = ExceededResources(outcome, f"Worker exceeded resource limits: {message}")
        log.warning("isolate for %s stopped: %s", self.name, message)
        self._stopping = reason
        self._fail_pending(reason)
        await self.stop()

    async def _wait_exit(self, proc: asyncio.subprocess.Process) -> None:
        """The tree ended (its PID 1 died, it was killed): fail what was in flight at once, even if
        something still holds the socket open."""
        code = await proc.wait()
        if proc is self._proc:
            self._fail_pending(
                self._stopping or IsolateCrashed(f"the isolate for {self.name} ended (exit status {code})")
            )
            self._writer = None
            self.host.exited()

    # --- what the isolate sends -------------------------------------------------------------------

    def _send(self, msg: ipc.Message) -> None:
        if self._writer is not None:
            self._writer.write(ipc.encode(msg))

    async def _deliver(self, msg: ipc.Message) -> bool:
        """Send msg and wait until the socket takes it; False when the isolate is gone."""
        if self._writer is None:
            return False
        self._send(msg)
        await self._writer.drain()
        return True

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self._dispatch(await ipc.read_message(reader, ipc.FROM_ISOLATE))
        except (asyncio.IncompleteReadError, ConnectionError):
            self._fail_pending(self._stopping or IsolateCrashed(f"the isolate for {self.name} ended"))
            self._writer = None
        except (ValueError, msgspec.DecodeError, ProtocolError) as exc:  # hostile or broken: gone
            log.warning("isolate for %s broke the protocol: %s", self.name, exc)
            self._fail_pending(IsolateCrashed(f"the isolate for {self.name} broke the IPC protocol"))
            await self.stop()

    def _dispatch(self, msg: ipc.Message) -> None:
        """One message from the isolate, to what takes its type (_TAKES); a type not there is
        ignored (the decoder already refused what the protocol does not know)."""
        take = _TAKES.get(type(msg))
        if take is not None:
            take(self, msg)

    def _answered(self, msg: ipc.InvokeResult | ipc.InvokeError | ipc.InvokeStart | ipc.ObjectResult) -> None:
        """A request's answer (a stream's start, a result, an error, an RPC's result)."""
        future = self._pending.get(msg.id)
        answers_other_kind = isinstance(msg, ipc.ObjectResult) != (msg.id in self._object_calls)
        if future is not None and not isinstance(msg, ipc.InvokeError) and answers_other_kind:
            raise ProtocolError(f"{type(msg).__name__} does not answer request {msg.id}")
        if isinstance(msg, ipc.InvokeStart):
            self._streams.started(msg.id)
        if isinstance(msg, ipc.InvokeResult) and msg.web_socket is not None and future is not None:
            self.host.socket_offer(msg)  # before the frames that follow it on the socket
        if future is not None and not future.done():
            future.set_result(msg)

    def _queue_outcome(self, msg: ipc.QueueOutcome) -> None:
        if msg.id in self._queue_outcomes:  # only a delivery still waiting for its result
            self._queue_outcomes[msg.id] = msg

    async def _first_message(self, reader: asyncio.StreamReader) -> Any:
        """The isolate's first message other than a log line: what the script printed while it
        loaded (at import time, say) goes to the console first, as any other line does. The isolate
        bounds its lines (LOG_LINES) and `timeout` the whole wait."""
        while isinstance(msg := await ipc.read_message(reader, ipc.FROM_ISOLATE), ipc.Log):
            self.host.log(msg)
        return msg

    # --- ending -----------------------------------------------------------------------------------

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _fail(self, rid: int, exc: Exception) -> None:
        future = self._pending.get(rid)
        if future is not None and not future.done():
            future.set_exception(exc)
        self._streams.fail(rid, exc)
        self._calls.end(rid)

    def _fail_pending(self, exc: Exception) -> None:
        for rid in list(self._pending) + self._streams.streaming():
            self._fail(rid, exc)
        self._watchdog.end_all()
        self._calls.end_all()  # waitUntil work's calls too: nothing of a stopped isolate runs on

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        proc = self._proc
        if proc is not None and proc.returncode is None:
            try:  # the launcher (and, through PDEATHSIG, the namespace with it), or the whole group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
        self._fail_pending(self._stopping or IsolateCrashed(f"the isolate for {self.name} was stopped"))


# What each message from the isolate is taken by: one typed table, no ladder of isinstance checks.
_TAKES: dict[type, Callable[[Isolate, Any], None]] = {
    ipc.InvokeResult: Isolate._answered,
    ipc.InvokeError: Isolate._answered,
    ipc.InvokeStart: Isolate._answered,
    ipc.ObjectResult: Isolate._answered,
    ipc.BodyChunk: lambda iso, msg: iso._streams.received(msg),
    ipc.BodyEnd: lambda iso, msg: iso._streams.received(msg),
    ipc.RequestAck: lambda iso, msg: iso._streams.acked(msg.id),
    ipc.QueueOutcome: Isolate._queue_outcome,
    ipc.RequestDone: lambda iso, msg: iso._end(msg.id),
    ipc.Log: lambda iso, msg: iso.host.log(msg),
    ipc.SocketSend: lambda iso, msg: iso.host.socket(msg),
    ipc.SocketClose: lambda iso, msg: iso.host.socket(msg),
    ipc.SocketAttach: lambda iso, msg: iso.host.socket(msg),
    **{call: lambda iso, msg: iso._calls.take(msg) for call in CALLS},
    ipc.AICancel: lambda iso, msg: iso._calls.cancel(msg.call),
}
