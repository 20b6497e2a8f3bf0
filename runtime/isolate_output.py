"""An isolate's stdout and stderr: read in bounded pieces into the runtime's log, so that a
flood can neither wedge the worker on a full pipe nor fill the log."""

from __future__ import annotations

import asyncio
import collections
import logging

from runtime import ipc

log = logging.getLogger("edge.isolate")

OUTPUT_LINE = 4096  # stdout/stderr: characters kept of one line
OUTPUT_BYTES = 256 * 1024  # stdout/stderr bytes kept per isolate between two requests' starts


class OutputPump:
    """Output of the isolate called `name`; `reset()` at each request's start refills the budget."""

    def __init__(self, name: str):
        self.name = name
        self.left = OUTPUT_BYTES
        self.dropped = 0
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)

    def reset(self) -> None:
        self.left = OUTPUT_BYTES

    async def pump(self, stream: asyncio.StreamReader | None, level: int) -> None:
        """stdout/stderr of the tree, read in bounded pieces: lines cut at OUTPUT_LINE characters,
        at most OUTPUT_BYTES between two requests' starts; the rest is read and dropped, so a
        flood can neither wedge the worker on a full pipe nor fill the runtime's log."""
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

    def _emit(self, level: int, line: bytes) -> None:
        text = line[:OUTPUT_LINE].decode("utf-8", "replace").rstrip()
        if level == logging.WARNING:
            self.stderr_tail.append(text)
        if self.left <= 0:
            self.dropped += len(line)
            return
        self.left -= len(line)
        log.log(level, "[%s] %s", self.name, text)
        if self.left <= 0:
            log.warning("[%s] output over %d bytes: the rest is dropped until its next request",
                        self.name, OUTPUT_BYTES)  # fmt: skip
