"""A thread pool that accounts share fairly: the runtime's binding stores (KV, D1, R2, Durable Object
storage, Vectorize) and its embedding stand-in run blocking work here, never on the event loop.

Work waits in one queue per account, and inside an account in one lane per resource (a database, an
object, an index), served round robin: a thread that frees takes the next account's next lane, so no
account waits behind another's backlog and no lane of an account behind its own other lanes. An
account holds at most `share` threads at once, so one account's slow calls always leave threads to
the others. Long work is sliced: a job that returns a generator runs one `next()` a turn and goes back
to the end of its lane between slices (a D1 script statement by statement, an embedding batch text by
text), so a fair turn is also a fair share of the CPU. What a slice yields is the hook that interrupts
its next slice (`sqlite3.Connection.interrupt`).

A job belongs to the awaiting task: when that task is cancelled (its request ended, the client left,
the runtime stops), a queued job is dropped, a suspended one closed (its `finally` runs: a transaction
rolls back) and a running one interrupted. Threads are daemons and `close()` interrupts every running
job, so a shutdown never waits for a tenant's work.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

RUNTIME = "\x00runtime"  # the runtime's own work (queue claims, alarms, workflow books): one account


class PoolClosed(RuntimeError):
    """The pool was closed (the runtime is stopping) before the job finished."""


@dataclass(eq=False)
class _Job:
    account: str
    lane: Hashable
    call: Callable[[], Any]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    gen: Any = None  # the generator of a sliced job, once its first call returned it
    interrupt: Callable[[], None] | None = None  # stops the slice running now
    cancelled: bool = False


class FairPool:
    def __init__(self, threads: int, share: int | None = None, name: str = "edge-pool"):
        if threads < 1:
            raise ValueError("a pool needs at least one thread")
        self.threads = threads
        self.share = max(1, min(share or threads, threads))  # most threads one account holds at once
        self.name = name
        self._cond = threading.Condition()
        self._queued: OrderedDict[str, OrderedDict[Hashable, deque[_Job]]] = OrderedDict()
        self._running: Counter[str] = Counter()  # threads each account holds now
        self._running_jobs: set[_Job] = set()
        self._workers: list[threading.Thread] = []
        self._closed = False

    # --- from the event loop ------------------------------------------------------------------------

    async def run(self, account: str, fn: Callable[..., Any], *args: Any, lane: Hashable = None) -> Any:
        """`fn(*args)` in a thread of the pool, in `account`'s queue (its `lane` there); its result.
        When `fn` returns a generator, each of its steps is a turn and its return value the result."""
        loop = asyncio.get_running_loop()
        job = _Job(account, lane, lambda: fn(*args), loop.create_future(), loop)
        self._put(job, start=True)
        try:
            return await job.future
        except asyncio.CancelledError:
            self._cancel(job)
            raise

    def waiting(self, account: str | None = None) -> int:
        """Jobs queued (not running), of one account or of all."""
        with self._cond:
            lanes = self._queued.values() if account is None else [self._queued.get(account, {})]
            return sum(len(q) for found in lanes for q in found.values())

    def running(self, account: str) -> int:
        with self._cond:
            return self._running[account]

    def close(self) -> None:
        """Stop: queued jobs fail with PoolClosed, running ones are interrupted; threads are not
        waited for (they are daemons and end after their slice)."""
        with self._cond:
            self._closed = True
            queued = [job for lanes in self._queued.values() for q in lanes.values() for job in q]
            self._queued.clear()
            running = list(self._running_jobs)
            for job in running:
                job.cancelled = True
            self._cond.notify_all()
        for job in queued:
            job.cancelled = True
            _close(job)
            _settle(job, exception=PoolClosed(f"{self.name}: the runtime is stopping"))
        for job in running:
            _interrupt(job)
            _settle(job, exception=PoolClosed(f"{self.name}: the runtime is stopping"))

    def join(self, timeout: float) -> None:
        """After close(): wait, at most `timeout` seconds in all, for the threads to end (a slice
        running finishes first), so that what it writes to can be closed after it."""
        deadline = time.monotonic() + timeout
        for worker in list(self._workers):
            worker.join(max(0.0, deadline - time.monotonic()))

    # --- the queues ----------------------------------------------------------------------------------

    def _put(self, job: _Job, start: bool = False) -> None:
        with self._cond:
            if self._closed:
                raise PoolClosed(f"{self.name}: the runtime is stopping")
            lanes = self._queued.setdefault(job.account, OrderedDict())
            lanes.setdefault(job.lane, deque()).append(job)
            if start and len(self._workers) < self.threads:
                worker = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._workers)}", daemon=True
                )
                self._workers.append(worker)
                worker.start()
            self._cond.notify()

    def _next(self) -> _Job | None:
        """The next job by the round robin (under the lock): the first account under its share, its
        first lane; both go to the back of their orders."""
        for account in list(self._queued):
            if self._running[account] >= self.share:
                continue
            lanes = self._queued[account]
            lane, jobs = next(iter(lanes.items()))
            job = jobs.popleft()
            if jobs:
                lanes.move_to_end(lane)
            else:
                del lanes[lane]
            if lanes:
                self._queued.move_to_end(account)
            else:
                del self._queued[account]
            return job
        return None

    def _cancel(self, job: _Job) -> None:
        with self._cond:
            job.cancelled = True
            lanes = self._queued.get(job.account)
            queued = lanes is not None and job in lanes.get(job.lane, ())
            if queued:
                lanes[job.lane].remove(job)
                if not lanes[job.lane]:
                    del lanes[job.lane]
                if not lanes:
                    del self._queued[job.account]
            running = job in self._running_jobs
        if queued:
            _close(job)  # between slices: its finally runs now (a rollback), not in a later turn
        elif running:
            _interrupt(job)

    # --- the threads ---------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                job = self._next()
                while job is None:
                    if self._closed:
                        return
                    self._cond.wait()
                    job = self._next()
                self._running[job.account] += 1
                self._running_jobs.add(job)
            again = stop = False
            try:
                again = self._step(job)
            finally:
                with self._cond:
                    self._running[job.account] -= 1
                    self._running_jobs.discard(job)
                    stop = job.cancelled and again  # cancelled while its slice ran: no requeue
                    self._cond.notify()
            if stop:
                _close(job)
            elif again:
                try:
                    self._put(job)
                except PoolClosed:
                    _close(job)
                    _settle(job, exception=PoolClosed(f"{self.name}: the runtime is stopping"))

    def _step(self, job: _Job) -> bool:
        """One turn of `job`; True when it has more slices to run."""
        if job.cancelled:
            _close(job)
            return False
        try:
            if job.gen is None:
                value = job.call()
                if not inspect.isgenerator(value):
                    _settle(job, result=value)
                    return False
                job.gen = value
            hook = job.gen.send(None)
            job.interrupt = hook if callable(hook) else None
        except StopIteration as stop:
            _settle(job, result=stop.value)
            return False
        except BaseException as exc:  # the job's own failure: the awaiting task raises it
            _settle(job, exception=exc)
            return False
        return True


def run_inline(slices: Any) -> Any:
    """A sliced job (a generator) run to its end in the calling thread: its return value."""
    try:
        while True:
            next(slices)
    except StopIteration as stop:
        return stop.value


def _close(job: _Job) -> None:
    if job.gen is not None:
        try:
            job.gen.close()
        except Exception:  # its cleanup failed: nothing waits for it any more
            pass


def _interrupt(job: _Job) -> None:
    if job.interrupt is not None:
        try:
            job.interrupt()
        except Exception:
            pass


def _settle(job: _Job, result: Any = None, exception: BaseException | None = None) -> None:
    def settle() -> None:
        if job.future.done():
            return
        if exception is not None:
            job.future.set_exception(exception)
        else:
            job.future.set_result(result)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # its loop has closed: nobody waits
        pass
