"""The pool accounts share (runtime.control.fair_pool): one account's backlog never holds another's
call, long work takes turns a slice at a time, and a call ends with the task that awaits it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime.control.fair_pool import FairPool, PoolClosed


def blocker(gate: threading.Event, started: list, name: str):
    def run():
        started.append(name)
        assert gate.wait(10), "the test never opened the gate"
        return name

    return run


async def wait_until(predicate, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition never held")


def test_an_account_holds_at_most_its_share_and_another_is_served_meanwhile():
    async def main():
        pool = FairPool(4, share=2, name="t")
        gate, started = threading.Event(), []
        flood = [asyncio.create_task(pool.run("a", blocker(gate, started, f"a{i}"))) for i in range(8)]
        await wait_until(lambda: len(started) == 2)
        other = await asyncio.wait_for(pool.run("b", lambda: "b"), 10)  # while a's 8 calls wait
        assert other == "b"
        assert pool.running("a") == 2 and pool.waiting("a") == 6 and not any(t.done() for t in flood)
        gate.set()
        assert sorted(await asyncio.gather(*flood)) == [f"a{i}" for i in range(8)]
        pool.close()

    asyncio.run(main())


def test_sliced_work_takes_turns_with_another_account():
    """One thread, a 50-slice job of account a running: b's call runs after at most one of a's
    slices, not after all of them."""

    async def main():
        pool = FairPool(1, name="t")
        order: list[str] = []
        first, b_queued = threading.Event(), threading.Event()

        def long_job():
            for i in range(50):
                order.append(f"a{i}")
                if i == 0:
                    first.set()
                if i == 1:
                    assert b_queued.wait(10)  # a slice still running when b's call comes
                yield
            return "a done"

        a = asyncio.create_task(pool.run("a", long_job))
        await wait_until(first.is_set)
        b = asyncio.create_task(pool.run("b", lambda: order.append("b") or "b"))
        await wait_until(lambda: pool.waiting("b") == 1)
        b_queued.set()
        assert await b == "b"
        assert await a == "a done"
        assert order.index("b") <= 2, order[:5]
        assert [x for x in order if x != "b"] == [f"a{i}" for i in range(50)]  # nothing lost or reordered
        pool.close()

    asyncio.run(main())


def test_lanes_of_one_account_take_turns():
    async def main():
        pool = FairPool(1, name="t")
        order: list[str] = []
        gate, started = threading.Event(), []
        hold = asyncio.create_task(pool.run("a", blocker(gate, started, "hold"), lane="db1"))
        await wait_until(lambda: started)
        backlog = [
            asyncio.create_task(pool.run("a", lambda i=i: order.append(f"db1-{i}"), lane="db1"))
            for i in range(5)
        ]
        await asyncio.sleep(0)
        other = asyncio.create_task(pool.run("a", lambda: order.append("kv"), lane="kv"))
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(hold, other, *backlog)
        assert order.index("kv") <= 1, order  # not behind db1's whole backlog
        pool.close()

    asyncio.run(main())


def test_a_cancelled_call_is_dropped_from_the_queue_or_interrupted_and_closed():
    async def main():
        pool = FairPool(1, name="t")
        ran, closed, interrupted = [], [], threading.Event()
        gate, started = threading.Event(), []
        hold = asyncio.create_task(pool.run("a", blocker(gate, started, "hold")))
        await wait_until(lambda: started)
        queued = asyncio.create_task(pool.run("b", lambda: ran.append("queued")))
        await wait_until(lambda: pool.waiting() == 1)
        queued.cancel()  # its task takes the cancellation (and drops the job) before the thread frees
        with pytest.raises(asyncio.CancelledError):
            await queued
        gate.set()
        await hold
        await asyncio.sleep(0.05)
        assert ran == [] and pool.waiting() == 0  # never run

        def sliced():
            try:
                yield interrupted.set  # the hook that stops the next slice
                assert interrupted.wait(10)  # a slice that runs until it is interrupted
                yield
                ran.append("after the interrupt")
            finally:
                closed.append(True)

        running = asyncio.create_task(pool.run("a", sliced))
        await wait_until(lambda: pool.running("a") == 1)
        await asyncio.sleep(0.02)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await wait_until(lambda: closed)
        assert interrupted.is_set() and ran == []  # interrupted, then closed: no slice after it
        pool.close()

    asyncio.run(main())


def test_close_fails_what_waits_and_interrupts_what_runs():
    async def main():
        pool = FairPool(1, name="t")
        stop = threading.Event()

        def sliced():
            yield stop.set
            assert stop.wait(10)
            yield

        running = asyncio.create_task(pool.run("a", sliced))
        await wait_until(lambda: pool.running("a") == 1)
        await asyncio.sleep(0.02)
        queued = asyncio.create_task(pool.run("b", lambda: "never"))
        await asyncio.sleep(0.01)
        pool.close()
        for task in (running, queued):
            with pytest.raises(PoolClosed):
                await task
        assert stop.is_set()
        with pytest.raises(PoolClosed):
            await pool.run("c", lambda: "after close")
        assert all(t.daemon for t in threading.enumerate() if t.name.startswith("t-"))

    asyncio.run(main())


def test_a_jobs_failure_reaches_its_caller_and_the_pool_keeps_serving():
    async def main():
        pool = FairPool(2, name="t")

        def boom():
            raise ValueError("bad input")

        def sliced_boom():
            yield
            raise KeyError("late")

        with pytest.raises(ValueError, match="bad input"):
            await pool.run("a", boom)
        with pytest.raises(KeyError, match="late"):
            await pool.run("a", sliced_boom)
        assert await pool.run("a", lambda: 7) == 7
        pool.close()

    asyncio.run(main())
