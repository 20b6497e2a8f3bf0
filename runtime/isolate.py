"""One OS process per worker: starts it, invokes its fetch handler, answers its AI calls.

The process gets a minimal environment (no runtime secrets), its end of a socket pair, and the
worker's own vars; a crash fails only the requests in flight, and the next request starts a
fresh process.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from runtime import ipc

log = logging.getLogger("edge.isolate")

# An AI call is answered with an AIReply, or (stream: true) with AIChunks ending in an AIReply.
AIHandler = Callable[[ipc.AICall], Awaitable[ipc.AIReply | AsyncIterator[ipc.AIChunk | ipc.AIReply]]]
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


async def _single(msg):
    yield msg


class WorkerLoadError(Exception):
    """The worker script failed to import or has no usable entry point."""

    def __init__(self, message: str, traceback: str = ""):
        super().__init__(message)
        self.traceback = traceback


class IsolateCrashed(Exception):
    """The isolate process ended while a request was in flight."""


def _child_env() -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PYTHONPATH"] = str(_PROJECT_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class IsolateLimits(msgspec.Struct):
    """Per isolate, enforced by the OS: CPU time per request, memory, and the file system and
    network confinement (Landlock)."""

    cpu_ms: int = 30_000
    memory_mb: int = 128
    sandbox: bool = True


class ExceededResources(IsolateCrashed):
    """The isolate was stopped for exceeding its limits (Workers error 1102)."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome  # "exceededCpu" | "exceededMemory"


async def _no_fetch(call: ipc.FetchCall) -> ipc.FetchReply:
    return ipc.FetchReply(call.call, error="outbound fetch is not available here")


def _cpu_ms(pid: int) -> float | None:
    """User plus system CPU time of a process, from the kernel's own accounting."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 / _CLOCK_TICKS


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Isolate:
    def __init__(
        self,
        name: str,
        script: Path,
        vars: dict[str, Any],
        ai_binding: str | None,
        ai: AIHandler,
        *,
        services: list[str] = (),
        limits: IsolateLimits | None = None,
        on_fetch: Callable[[ipc.FetchCall], Awaitable[ipc.FetchReply]] = _no_fetch,
        on_log: Callable[[ipc.Log], None] | None = None,
    ):
        self.name = name
        self.script = script
        self.vars = vars
        self.ai_binding = ai_binding
        self.services = list(services)
        self.limits = limits or IsolateLimits()
        self._on_fetch = on_fetch
        self._on_log = on_log
        self._cpu_at_start: dict[int, float] = {}  # request -> process CPU ms when it began
        self._watchdog: asyncio.Task | None = None
        self._ai = ai
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._bodies: dict[int, asyncio.Queue] = {}  # streamed response bodies in flight
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: set[asyncio.Task] = set()
        self._start_lock = asyncio.Lock()
        self.entry: str | None = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and self._writer is not None

    async def start(self, timeout: float = 30.0) -> None:
        parent, child = socket.socketpair()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "runtime.isolate_main",
                "--fd",
                str(child.fileno()),
                pass_fds=[child.fileno()],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=str(self.script.parent),
                env=_child_env(),
            )
        finally:
            child.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent, limit=ipc.MAX_FRAME)
        writer.write(
            ipc.encode(
                ipc.Init(
                    str(self.script),
                    self.vars,
                    self.ai_binding,
                    self.services,
                    self.limits.memory_mb,
                    self.limits.sandbox,
                )
            )
        )
        await writer.drain()
        self._spawn(self._pump_output(self._proc.stdout, logging.INFO))
        self._spawn(self._pump_output(self._proc.stderr, logging.WARNING))
        try:
            first = await asyncio.wait_for(ipc.read_message(reader), timeout)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            await self.stop()
            raise WorkerLoadError(
                f"{self.script.name}: the isolate did not start ({type(exc).__name__})"
            ) from None
        if isinstance(first, ipc.LoadFailed):
            await self.stop()
            raise WorkerLoadError(f"{self.script.name} failed to load: {first.message}", first.traceback)
        assert isinstance(first, ipc.Ready)
        self.entry = first.entry
        self._writer = writer
        self._spawn(self._read_loop(reader))
        log.info("isolate for %s started (pid %s, entry %s)", self.name, self._proc.pid, self.entry)

    async def invoke(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        cf: dict[str, Any],
        request_id: int | None = None,
    ) -> ipc.InvokeResult | ipc.InvokeError:
        async with self._start_lock:
            if not self.alive:
                await self.stop()
                await self.start()
        rid = request_id if request_id is not None else next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._cpu_at_start[rid] = _cpu_ms(self._proc.pid) or 0.0
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch_cpu())
        try:
            self._writer.write(ipc.encode(ipc.Invoke(rid, method, url, headers, body, cf)))
            await self._writer.drain()
            return await future
        finally:
            self._pending.pop(rid, None)
            self._cpu_at_start.pop(rid, None)

    async def _watch_cpu(self) -> None:
        """While requests run, read the isolate's CPU time from the kernel; a request that has
        used more than cpu_ms since it began gets the process killed (1102), whatever it does."""
        while self._cpu_at_start and self._proc is not None and self._proc.returncode is None:
            used = _cpu_ms(self._proc.pid)
            if used is not None:
                for start in list(self._cpu_at_start.values()):
                    if used - start > self.limits.cpu_ms:
                        await self._kill(
                            ExceededResources(
                                "exceededCpu",
                                f"Worker exceeded resource limits: more than {self.limits.cpu_ms} ms "
                                f"of CPU time in one request",
                            )
                        )
                        return
            await asyncio.sleep(0.01)

    async def _kill(self, reason: ExceededResources) -> None:
        log.warning("isolate for %s stopped: %s", self.name, reason)
        self._fail_pending(reason)
        await self.stop()

    def next_request_id(self) -> int:
        return next(self._ids)

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg = await ipc.read_message(reader)
                if isinstance(msg, (ipc.InvokeResult, ipc.InvokeError, ipc.InvokeStart)):
                    if isinstance(msg, ipc.InvokeStart):
                        self._bodies[msg.id] = asyncio.Queue()
                    future = self._pending.get(msg.id)
                    if future is not None and not future.done():
                        future.set_result(msg)
                elif isinstance(msg, (ipc.BodyChunk, ipc.BodyEnd)):
                    queue = self._bodies.get(msg.id)
                    if queue is not None:
                        queue.put_nowait(msg)
                elif isinstance(msg, ipc.AICall):
                    self._spawn(self._answer_ai(msg))
                elif isinstance(msg, ipc.FetchCall):
                    self._spawn(self._answer_fetch(msg))
                elif isinstance(msg, ipc.Log) and self._on_log is not None:
                    self._on_log(msg)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            self._fail_pending(IsolateCrashed(f"the isolate for {self.name} ended ({type(exc).__name__})"))
            self._writer = None

    async def _answer_ai(self, call: ipc.AICall) -> None:
        reply = await self._ai(call)
        messages = reply if hasattr(reply, "__aiter__") else _single(reply)
        async for msg in messages:
            if self._writer is None:
                return
            self._writer.write(ipc.encode(msg))
            await self._writer.drain()

    async def _answer_fetch(self, call: ipc.FetchCall) -> None:
        try:
            reply = await self._on_fetch(call)
        except Exception as exc:  # the runtime's side failed: tell the worker, keep serving
            reply = ipc.FetchReply(call.call, error=f"fetch failed: {type(exc).__name__}: {exc}")
        if self._writer is not None:
            self._writer.write(ipc.encode(reply))
            await self._writer.drain()

    async def body(self, request_id: int) -> AsyncIterator[bytes]:
        """The streamed body of a response that began with InvokeStart."""
        queue = self._bodies[request_id]
        try:
            while True:
                msg = await queue.get()
                if isinstance(msg, ipc.BodyEnd):
                    if msg.error:
                        log.warning("[%s] streamed body failed: %s", self.name, msg.error)
                    return
                yield msg.data
        finally:
            self._bodies.pop(request_id, None)

    async def _pump_output(self, stream: asyncio.StreamReader | None, level: int) -> None:
        if stream is None:
            return
        while line := await stream.readline():
            log.log(level, "[%s] %s", self.name, line.decode("utf-8", "replace").rstrip())

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fail_pending(self, exc: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
        for queue in self._bodies.values():  # streams in flight end, marked as failed
            queue.put_nowait(ipc.BodyEnd(-1, str(exc)))

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        self._fail_pending(IsolateCrashed(f"the isolate for {self.name} was stopped"))
