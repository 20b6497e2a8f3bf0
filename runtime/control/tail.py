"""Live events per worker for `edge tail`, and the budget for log lines outside any request."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class TailHub:
    """Live events per worker for `edge tail`: every subscriber gets every event after it joined."""

    def __init__(self) -> None:
        self._subscribers: dict[tuple[str, str], set[asyncio.Queue]] = {}

    def subscribe(self, account: str, worker: str) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(maxsize=10_000)
        self._subscribers.setdefault((account, worker), set()).add(queue)
        return queue

    def unsubscribe(self, account: str, worker: str, queue: asyncio.Queue) -> None:
        self._subscribers.get((account, worker), set()).discard(queue)

    def publish(self, account: str, worker: str, event: dict[str, Any]) -> None:
        for queue in self._subscribers.get((account, worker), ()):
            if not queue.full():  # a subscriber that cannot keep up loses events, not the runtime
                queue.put_nowait(event)


def log_event(script: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A tail event of log lines that belong to no request (module-level output, the runtime's notes)."""
    return {
        "outcome": "log",
        "scriptName": script,
        "logs": entries,
        "eventTimestamp": int(time.time() * 1000),  # milliseconds, as Cloudflare's tail
    }


class LogBudget:
    """Lines a worker may log outside any request: `rate` a second, bursts of up to `burst`; the
    lines refused are counted until `take_dropped()`."""

    def __init__(self, rate: float = 20.0, burst: int = 200):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), time.monotonic()
        self.dropped = 0

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            self.dropped += 1
            return False
        self.tokens -= 1
        return True

    def take_dropped(self) -> int:
        """The lines refused since the last call."""
        dropped, self.dropped = self.dropped, 0
        return dropped
