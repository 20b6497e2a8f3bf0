"""The watchdog's books on one isolate: the requests in flight (CPU at their start, their
wall-clock deadline) and CPU burnt outside any request; and, on each look at the tree's usage as
the kernel reports it, which requests ran out of wall time and whether the tree must be killed.

The runtime (runtime.isolate.process) takes the looks and acts on them; nothing here is reachable from
the isolate's side."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from runtime.control.limits import IsolateLimits
from runtime.isolate import proctree

RESPONSE_WALL_S = 300.0  # from the request to its response's first byte
WAIT_UNTIL_S = 30.0  # work after the response (waitUntil), as on Workers
GRACE_S = 5.0  # a cancelled request that has not ended by then gets its isolate killed
# CPU burnt while no request runs (forked children, threads) may reach cpu_ms, and at most
# BACKGROUND_MS, within any BACKGROUND_WINDOW_S
BACKGROUND_WINDOW_S, BACKGROUND_MS = 10.0, 5_000


@dataclass
class InFlight:
    cpu_at_start: float
    deadline: float | None  # monotonic; None while a streamed body is being read by its client
    cancelled: bool = False


@dataclass
class Look:
    """What one look found: requests past their wall-clock limit, to be cancelled (in this
    order), then the tree to kill, as (outcome, why), or None."""

    cancel: list[int] = field(default_factory=list)
    kill: tuple[str, str] | None = None


class Watchdog:
    def __init__(self) -> None:
        self.inflight: dict[int, InFlight] = {}  # request -> until RequestDone
        self.memory_base = 0  # tree memory once the worker had loaded
        self._last_cpu = 0.0  # tree CPU at the last look
        self._served_since_look = False  # a request ran at some point since that look
        self._background: collections.deque[tuple[float, float]] = collections.deque()  # (when, ms)

    def started(self, base: proctree.TreeUsage | None) -> None:
        """A fresh isolate has loaded its worker; `base` is its tree's usage then."""
        self.memory_base = base.memory_bytes if base else 0
        self._last_cpu = base.cpu_ms if base else 0.0
        self._background.clear()

    def begin(self, rid: int) -> None:
        """A request starts: CPU counts from the last look (at most 10 ms old while requests
        run: a fresh read of the tree would cost more than a request)."""
        self.inflight[rid] = InFlight(self._last_cpu, time.monotonic() + RESPONSE_WALL_S)
        self._served_since_look = True

    def answered(self, rid: int, streaming: bool) -> None:
        """The request has its response: a streamed body has no deadline while its client reads
        it; otherwise (or once the body has been read) waitUntil work has WAIT_UNTIL_S."""
        entry = self.inflight.get(rid)
        if entry is not None:
            entry.deadline = None if streaming else time.monotonic() + WAIT_UNTIL_S

    def running(self, rid: int) -> bool:
        return rid in self.inflight

    def end(self, rid: int) -> None:
        self.inflight.pop(rid, None)

    def end_all(self) -> None:
        self.inflight.clear()

    @property
    def busy(self) -> bool:
        return bool(self.inflight)

    def look(self, usage: proctree.TreeUsage, limits: IsolateLimits, memory: int) -> Look:
        """A request that used more than cpu_ms since it began (its body and waitUntil
        included), more than min(cpu_ms, BACKGROUND_MS) burnt while no request runs within
        BACKGROUND_WINDOW_S, or memory past `memory` bytes, and the tree is to be killed (1102);
        a request past its deadline is to be cancelled, and one still there GRACE_S after that
        gets the tree killed."""
        # memory first: a tree over both limits at one look (looks come late under load) is named
        # by its memory, what endangers the host
        if usage.memory_bytes > memory:
            return Look(kill=("exceededMemory", f"more than {limits.memory_mb} MB of memory"))
        cpu_ms = limits.cpu_ms
        if any(usage.cpu_ms - e.cpu_at_start > cpu_ms for e in self.inflight.values()):
            return Look(kill=("exceededCpu", f"more than {cpu_ms} ms of CPU time in one request"))
        now = time.monotonic()
        if not self.inflight and not self._served_since_look:  # nobody's: background work
            self._background.append((now, usage.cpu_ms - self._last_cpu))
        self._last_cpu, self._served_since_look = usage.cpu_ms, bool(self.inflight)
        while self._background and self._background[0][0] < now - BACKGROUND_WINDOW_S:
            self._background.popleft()
        background = min(cpu_ms, BACKGROUND_MS)
        if sum(ms for _, ms in self._background) > background:
            return Look(
                kill=(
                    "exceededCpu",
                    f"more than {background} ms of CPU time outside any request "
                    f"within {BACKGROUND_WINDOW_S:.0f} s",
                )
            )
        look = Look()
        for rid, entry in self.inflight.items():
            if entry.deadline is None or now < entry.deadline:
                continue
            if not entry.cancelled:  # past its wall-clock limit: the isolate is asked to stop it
                entry.cancelled, entry.deadline = True, now + GRACE_S
                look.cancel.append(rid)
            else:
                look.kill = ("exceededWallTime", "a cancelled request did not stop")
                break
        return look
