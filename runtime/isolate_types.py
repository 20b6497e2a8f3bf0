"""An isolate's limits and the errors it raises: plain types that the worker spec, the limits
check and the worker host use without loading the isolate machinery."""

from __future__ import annotations

import msgspec


class WorkerLoadError(Exception):
    """The worker script failed to import or has no usable entry point."""

    def __init__(self, message: str, traceback: str = ""):
        super().__init__(message)
        self.traceback = traceback


class IsolateCrashed(Exception):
    """The isolate process ended while a request was in flight."""


class IsolateLimits(msgspec.Struct):
    """Per isolate, enforced by the OS and the runtime's watchdog over the whole process tree."""

    cpu_ms: int = 30_000  # CPU time per request, its streamed body and waitUntil work included
    memory_mb: int = 128  # memory of the whole tree on top of the loaded worker
    sandbox: bool = True  # jail (or, insecure, Landlock only); False only in the runtime's own tests
    processes: int = 16  # tasks (processes and threads) in the isolate's namespace
    file_bytes: int = 16 * 1024 * 1024  # largest file it may write, and the size of its /tmp


class ExceededResources(IsolateCrashed):
    """The isolate went past one of its limits (Workers error 1102)."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome  # "exceededCpu" | "exceededMemory" | "exceededWallTime"
