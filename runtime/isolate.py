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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from runtime import ipc

log = logging.getLogger("edge.isolate")

AIHandler = Callable[[ipc.AICall], Awaitable[ipc.AIReply]]
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


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


class Isolate:
    def __init__(self, name: str, script: Path, vars: dict[str, Any], ai_binding: str | None, ai: AIHandler):
        self.name = name
        self.script = script
        self.vars = vars
        self.ai_binding = ai_binding
        self._ai = ai
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
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
        writer.write(ipc.encode(ipc.Init(str(self.script), self.vars, self.ai_binding)))
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
        try:
            self._writer.write(ipc.encode(ipc.Invoke(rid, method, url, headers, body, cf)))
            await self._writer.drain()
            return await future
        finally:
            self._pending.pop(rid, None)

    def next_request_id(self) -> int:
        return next(self._ids)

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg = await ipc.read_message(reader)
                if isinstance(msg, (ipc.InvokeResult, ipc.InvokeError)):
                    future = self._pending.get(msg.id)
                    if future is not None and not future.done():
                        future.set_result(msg)
                elif isinstance(msg, ipc.AICall):
                    self._spawn(self._answer_ai(msg))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            self._fail_pending(IsolateCrashed(f"the isolate for {self.name} ended ({type(exc).__name__})"))
            self._writer = None

    async def _answer_ai(self, call: ipc.AICall) -> None:
        reply = await self._ai(call)
        if self._writer is not None:
            self._writer.write(ipc.encode(reply))
            await self._writer.drain()

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

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        self._fail_pending(IsolateCrashed(f"the isolate for {self.name} was stopped"))
