"""`AbortController` and `AbortSignal`, as the Web platform has them (`from js import AbortController`
in a Python Worker): a worker passes `controller.signal` to a call (`env.AI.run(..., {"signal":
signal})`) and `controller.abort()` cancels it, the awaiting code raising AbortError (a DOMException
named "AbortError" in JavaScript; `reason` is what abort() was given)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class AbortError(Exception):
    """The call was aborted by its signal: `name` is "AbortError" (a timeout signal's is
    "TimeoutError", as the Web platform names them); `reason` is the signal's."""

    def __init__(self, reason: Any = None, name: str = "AbortError"):
        self.name, self.reason = name, reason
        super().__init__(f"{name}: {reason}" if reason is not None else f"{name}: the operation was aborted")


class AbortSignal:
    """Whether, and why, an operation should stop: `aborted`, `reason`, `addEventListener("abort",
    fn)`, `throwIfAborted()`; `AbortSignal.timeout(ms)` and `AbortSignal.abort(reason)` make one."""

    def __init__(self) -> None:
        self.aborted = False
        self.reason: Any = None
        self._listeners: list[Callable[..., Any]] = []
        self._timeout = False

    def addEventListener(self, kind: str, listener: Callable[..., Any], *_options: Any) -> None:  # noqa: N802
        if kind == "abort" and listener not in self._listeners:
            self._listeners.append(listener)

    def removeEventListener(self, kind: str, listener: Callable[..., Any], *_options: Any) -> None:  # noqa: N802
        if kind == "abort" and listener in self._listeners:
            self._listeners.remove(listener)

    def throwIfAborted(self) -> None:  # noqa: N802 - the Web name
        if self.aborted:
            raise self.error()

    def error(self) -> AbortError:
        return AbortError(self.reason, "TimeoutError" if self._timeout else "AbortError")

    def _abort(self, reason: Any) -> None:
        if self.aborted:
            return
        self.aborted, self.reason = True, reason
        for listener in list(self._listeners):
            listener({"type": "abort", "target": self})

    @staticmethod
    def abort(reason: Any = "AbortError: the operation was aborted") -> AbortSignal:
        signal = AbortSignal()
        signal._abort(reason)
        return signal

    @staticmethod
    def timeout(ms: float) -> AbortSignal:
        """A signal that aborts after `ms` milliseconds (on the running event loop)."""
        if not isinstance(ms, int | float) or isinstance(ms, bool) or ms < 0:
            raise TypeError(f"AbortSignal.timeout takes a number of milliseconds >= 0, got {ms!r}")
        signal = AbortSignal()
        signal._timeout = True
        asyncio.get_running_loop().call_later(ms / 1000, signal._abort, "TimeoutError: the signal timed out")
        return signal

    @staticmethod
    def new() -> AbortSignal:
        raise TypeError("AbortSignal has no constructor: use AbortController.new().signal")


class AbortController:
    """`controller = AbortController.new()` (or `AbortController()`); `controller.signal` goes to the
    call, `controller.abort(reason)` aborts it."""

    def __init__(self) -> None:
        self.signal = AbortSignal()

    @staticmethod
    def new() -> AbortController:
        return AbortController()

    def abort(self, reason: Any = "AbortError: the operation was aborted") -> None:
        self.signal._abort(reason)
