"""A call never outlives the request that made it: the isolate's calls in flight are cancelled when
their request ends (runtime.isolate.calls.CallDesk), and a D1 script cancelled mid-way stops at the
statement it was running, its later statements never applied, its database free for the next call
(runtime.bindings.BindingStores on runtime.control.fair_pool)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.bindings import BindingError, BindingRef, BindingStores
from runtime.isolate import ipc
from runtime.isolate.calls import ENDED, CallDesk, Link
from runtime.isolate.host import QuietHost

SLOW = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {}) SELECT count(*) FROM c;"


def test_a_requests_calls_in_flight_end_with_it_and_the_isolate_hears_so():
    async def main():
        sent: list[ipc.Message] = []
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def binding(call: ipc.BindingCall) -> ipc.BindingReply:
            started.set()
            try:
                await asyncio.sleep(3600)  # a store call that would run on
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return ipc.BindingReply(call.call, result="late")

        async def deliver(msg):
            sent.append(msg)
            return True

        tasks = set()

        def spawn(coro):
            task = asyncio.create_task(coro)
            tasks.add(task)
            return task

        host = QuietHost()
        host.binding = binding  # a store call that runs on until cancelled
        desk = CallDesk(host, Link(sent.append, deliver, spawn))
        desk.take(ipc.BindingCall(call=1, request=7, binding="DB", method="exec", args=["x"], kwargs={}))
        desk.take(ipc.BindingCall(call=2, request=8, binding="DB", method="exec", args=["x"], kwargs={}))
        await started.wait()
        assert desk.in_flight(7) == 1 and desk.in_flight(8) == 1
        desk.end(7)
        await asyncio.wait_for(cancelled.wait(), 5)
        await asyncio.sleep(0)
        assert desk.in_flight(7) == 0 and desk.in_flight(8) == 1  # the other request's call runs on
        ended = [m for m in sent if isinstance(m, ipc.BindingReply)]
        assert [(m.call, m.error_message) for m in ended] == [(1, ENDED)]
        desk.end_all()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert desk.in_flight(8) == 0

    asyncio.run(main())


def test_a_cancelled_d1_script_stops_where_it_was_and_frees_its_database(tmp_path):
    async def main():
        stores = BindingStores(tmp_path / "state")
        db = BindingRef("d1", "main")
        await stores.call("a", db, "exec", ["CREATE TABLE t (v INTEGER)"], {})
        script = "INSERT INTO t VALUES (1);" + SLOW.format(20_000_000) + "INSERT INTO t VALUES (2);"
        flood = asyncio.create_task(stores.call("a", db, "exec", [script], {}))
        await asyncio.sleep(0.3)  # its slow statement runs (about 3 s here, under the 5 s limit)
        rows = await stores.call("a", BindingRef("d1", "other"), "query", ["SELECT 1", []], {})
        assert rows["rows"] == [[1]]  # another database of the account is served meanwhile
        flood.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flood
        counted = await asyncio.wait_for(stores.call("a", db, "query", ["SELECT v FROM t", []], {}), 30)
        assert counted["rows"] == [[1]]  # the statement before stays; the one after never ran
        stores.close()

    asyncio.run(main())


def test_a_whole_d1_call_is_bounded_in_time(tmp_path, monkeypatch):
    from runtime.bindings import d1

    monkeypatch.setattr(d1, "CALL_S", 0.3)

    async def main():
        stores = BindingStores(tmp_path / "state")
        db = BindingRef("d1", "main")
        quick = SLOW.format(200_000)
        with pytest.raises(BindingError, match="ran past 0.3 s in all"):
            await stores.call("a", db, "exec", [quick * 500], {})  # each statement far under 5 s
        assert (await stores.call("a", db, "query", ["SELECT 2", []], {}))["rows"] == [[2]]
        stores.close()

    asyncio.run(main())
