"""An isolate's stdout and stderr pipes: read in bounded pieces, so that a flood can neither wedge
the worker on a full pipe nor fill the runtime's log or memory.

A worker's print(), logging and sys.stdout / sys.stderr cross as log lines over IPC
(runtime.isolate.inside.channel); what reaches the pipes is only what bypasses Python's streams (a
child process, os.write, a C extension, the interpreter's last words, the jail's messages). It is
shown as the worker's console lines are (runtime.isolate.console), by the `sink` the isolate is
given: at most OUTPUT_LINES lines and OUTPUT_BYTES between two requests' starts, each cut at
OUTPUT_LINE bytes; the rest is read and dropped, and counted in one line.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from runtime.isolate import ipc

OUTPUT_LINE = 4096  # bytes kept of one line
OUTPUT_LINES = 200  # lines kept between two requests' starts (as an event shows on the console)
OUTPUT_BYTES = 64 * 1024  # bytes kept between two requests' starts

# (level, text): "log" for stdout, "error" for stderr, "warn" for the pump's own notes
Sink = Callable[[str, str], None]


class OutputPump:
    """Output of the isolate called `name`; `reset()` at each request's start refills the budget."""

    def __init__(self, name: str, sink: Sink | None = None):
        self.name = name
        if sink is None:
            from runtime.isolate.console import WorkerConsole

            sink = WorkerConsole(name).write
        self.sink = sink
        self.lines_left, self.bytes_left = OUTPUT_LINES, OUTPUT_BYTES
        self.dropped = 0  # lines dropped since the budget ran out
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)

    def reset(self) -> None:
        self._summarize()
        self.lines_left, self.bytes_left = OUTPUT_LINES, OUTPUT_BYTES

    async def pump(self, stream: asyncio.StreamReader | None, level: str) -> None:
        """stdout ("log") or stderr ("error") of the tree, read in bounded pieces: lines cut at
        OUTPUT_LINE bytes, at most OUTPUT_LINES lines and OUTPUT_BYTES between two requests'
        starts; the rest is read and dropped, so that a flood can neither wedge the worker on a
        full pipe nor fill the runtime's log."""
        if stream is None:
            return
        partial = b""
        while data := await stream.read(ipc.CHUNK):
            lines = (partial + data).split(b"\n")
            partial = lines.pop()[: OUTPUT_LINE + 1]
            if len(partial) > OUTPUT_LINE:
                lines.append(partial)
                partial = b""
            for line in lines:
                self._emit(level, line)
        if partial:
            self._emit(level, partial)
        self._summarize()

    def _emit(self, level: str, line: bytes) -> None:
        text = line[:OUTPUT_LINE].decode("utf-8", "replace").rstrip()
        if level == "error":
            self.stderr_tail.append(text)
        if self.lines_left <= 0 or self.bytes_left <= 0:
            self.dropped += 1
            return
        self.lines_left -= 1
        self.bytes_left -= len(line)
        self.sink(level, text)
        if self.lines_left <= 0 or self.bytes_left <= 0:
            self.sink(
                "warn",
                f"output on stdout/stderr over {OUTPUT_LINES} lines or {OUTPUT_BYTES // 1024} KiB: "
                "the rest is dropped until the next request starts",
            )

    def _summarize(self) -> None:
        if self.dropped:
            self.sink("warn", f"… {self.dropped} line(s) of output on stdout/stderr dropped")
            self.dropped = 0
