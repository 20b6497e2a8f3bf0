"""The errors an isolate raises: plain types that the worker host and the registry use without
loading the isolate machinery (its limits are runtime.control.limits.IsolateLimits)."""

from __future__ import annotations


class WorkerLoadError(Exception):
    """The worker script failed to import or has no usable entry point."""

    def __init__(self, message: str, traceback: str = ""):
        super().__init__(message)
        self.traceback = traceback


class IsolateCrashed(Exception):
    """The isolate process ended while a request was in flight."""


class ExceededResources(IsolateCrashed):
    """The isolate went past one of its limits (Workers error 1102)."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome  # "exceededCpu" | "exceededMemory" | "exceededWallTime"
