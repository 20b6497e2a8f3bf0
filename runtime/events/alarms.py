"""Durable Object alarms: each object's one alarm (kept in its own SQLite file by
runtime.bindings.do_storage) fires its `alarm(self, alarm_info)` handler when due.

The scheduler holds, in memory, the due time of every object that has an alarm: read from the
objects' files when the runtime starts (an alarm set before a restart fires after it), then kept
up to date as objects call setAlarm / deleteAlarm. Due alarms run in order of their time, at most
RUNNING of them at once and PER_ACCOUNT of one account's (the rest of its due alarms wait aside
meanwhile); a handler that re-arms its alarm for "now" in a loop goes behind every alarm already
due, so neither one object nor one account with many can starve the others. A handler that
fails is retried with backoff (do_storage: 2 s, doubling, at most 6 retries),
`alarm_info.retryCount` saying which try.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from runtime.bindings.do_storage import Address, ObjectStorageStore

log = logging.getLogger("edge.alarms")

RUNNING = 4  # alarm handlers running at once, all objects together
PER_ACCOUNT = 2  # ... of them one account's: an account with many due alarms leaves room for others
MAX_WAIT_S = 30.0  # the loop looks again at least this often (a clock that jumped)

# (address, retry count, due ms) -> the outcome: "ok", "gone" (no such worker or class any more:
# the alarm is dropped), anything else (the handler failed, the object was busy): retried
Fire = Callable[[Address, int, int], Awaitable[str]]
Pool = Callable[..., Awaitable[Any]]  # runs blocking store work off the event loop


def now_ms() -> int:
    return int(time.time() * 1000)


class AlarmScheduler:
    def __init__(
        self,
        store: ObjectStorageStore,
        pool: Pool,
        fire: Fire,
        running: int = RUNNING,
        per_account: int = PER_ACCOUNT,
    ):
        self.store, self.pool, self.fire = store, pool, fire
        self.per_account = per_account
        self._running: dict[str, int] = {}  # account -> its handlers running now
        self._parked: dict[str, list[tuple[int, int, Address]]] = {}  # due, waiting for its account
        self._due: dict[Address, int] = {}  # each object's alarm time, as last known
        self._heap: list[tuple[int, int, Address]] = []  # (due ms, order, address); stale ones skipped
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(running)
        self._tasks: set[asyncio.Task] = set()
        self.fired = 0  # handlers run (for tests and the log)

    def changed(self, address: Address, time_ms: int | None) -> None:
        """An object set (time_ms) or deleted (None) its alarm."""
        if time_ms is None:
            self._due.pop(address, None)
            return
        self._due[address] = time_ms
        heapq.heappush(self._heap, (time_ms, next(self._order), address))
        if len(self._heap) > 4 * len(self._due) + 1024:  # moved many times: drop the stale entries
            self._heap = [(t, next(self._order), a) for a, t in self._due.items()]
            heapq.heapify(self._heap)
        self._wake.set()

    async def run(self) -> None:
        """Resume the alarms kept on disk, then fire each when due, for ever."""
        found = await self.pool(self.store.scan_alarms)
        for address, time_ms in found:
            if address not in self._due:  # one set while the scan ran is newer than the file's read
                self.changed(address, time_ms)
        if found:
            log.info("Durable Object alarms: %d resumed from storage", len(found))
        while True:
            if not self._heap:
                await self._wait(MAX_WAIT_S)
                continue
            time_ms, _, address = self._heap[0]
            if self._due.get(address) != time_ms:
                heapq.heappop(self._heap)  # moved or deleted since
                continue
            delay = (time_ms - now_ms()) / 1000
            if delay > 0:
                await self._wait(min(delay, MAX_WAIT_S))
                continue
            entry = heapq.heappop(self._heap)
            account = address[0]
            if self._running.get(account, 0) >= self.per_account:
                self._parked.setdefault(account, []).append(entry)  # back when one of its ends
                continue
            del self._due[address]
            self._running[account] = self._running.get(account, 0) + 1
            await self._slots.acquire()
            task = asyncio.create_task(self._run_one(address, time_ms))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _wait(self, seconds: float) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass

    async def _run_one(self, address: Address, time_ms: int) -> None:
        try:
            retries = await self.pool(self.store.begin_alarm, address, time_ms)
            if retries is None:  # moved or deleted since the scheduler last heard
                return
            self.fired += 1
            try:
                outcome = await self.fire(address, retries, time_ms)
            except Exception:  # the runtime's side failed: retried as a failed handler is
                log.exception("Durable Object alarm of %s(%s) failed to run", address[2], address[3][:8])
                outcome = "error"
            if outcome == "gone":
                log.warning(
                    "Durable Object %s(%s) of %s: its worker or class is gone; its alarm is dropped",
                    address[2], address[3][:8], address[1],
                )  # fmt: skip
                await self.pool(self.store.drop_alarm, address)
                return
            following = await self.pool(self.store.end_alarm, address, outcome == "ok", now_ms())
            if following is not None and address not in self._due:
                self.changed(address, following)
        except Exception:  # a storage failure: this alarm waits for the next start
            log.exception("Durable Object alarm of %s(%s): storage failed", address[2], address[3][:8])
        finally:
            self._slots.release()
            account = address[0]
            self._running[account] -= 1
            if not self._running[account]:
                del self._running[account]
            for entry in self._parked.pop(account, []):
                heapq.heappush(self._heap, entry)
            self._wake.set()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
