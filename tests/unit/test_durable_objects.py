"""Durable Objects: ids, the per-object store, and instances in their own isolates (one per id,
calls one at a time, storage scoped by the runtime)."""

import asyncio
import os
import stat
import textwrap
from types import SimpleNamespace

import pytest

from runtime.bindings import BindingStores
from runtime.bindings.common import BindingError
from runtime.control.dashboard_feed import DashboardFeed
from runtime.control.tail import TailHub
from runtime.host.invocation import Invocation
from runtime.host.objects import DurableObjects, namespace_key
from runtime.host.sockets import SocketHub
from runtime.host.spec import DurableObjectRef, WorkerSpec
from runtime.host.worker import WorkerHandle
from runtime.isolate import ipc
from runtime.isolate.process import IsolateLimits
from workers.durable_objects import (
    DurableObjectId,
    DurableObjectNamespace,
    check_rpc_value,
    id_from_name,
    new_unique_id,
    valid_id,
)

# --- ids --------------------------------------------------------------------------------------------


def test_ids_are_deterministic_per_namespace_and_validated():
    key, other = namespace_key("local", "w", "Counter"), namespace_key("local", "w", "Room")
    a = id_from_name(key, "a")
    assert a == id_from_name(key, "a") and len(a) == 64 and set(a) <= set("0123456789abcdef")
    assert a != id_from_name(key, "b") and a != id_from_name(other, "a")
    assert valid_id(key, a) and not valid_id(other, a)
    assert not valid_id(key, a.upper()) and not valid_id(key, a[:-1]) and not valid_id(key, None)
    u1, u2 = new_unique_id(key), new_unique_id(key)
    assert u1 != u2 and valid_id(key, u1)

    ns = DurableObjectNamespace("COUNTER", key, None)
    assert ns.idFromName("a") == ns.idFromName("a") and str(ns.idFromName("a")) == a
    assert ns.idFromName("a").name == "a" and ns.idFromString(a).toString() == a
    with pytest.raises(TypeError, match="Invalid Durable Object ID"):
        ns.idFromString(id_from_name(other, "a"))
    with pytest.raises(TypeError, match="Invalid Durable Object ID"):
        ns.idFromString("zz" * 32)
    with pytest.raises(TypeError):
        ns.get("not an id")
    assert isinstance(ns.newUniqueId(), DurableObjectId)


def test_rpc_values_must_be_json_like():
    check_rpc_value([1, 2.5, "x", b"y", None, True, {"a": [1]}], "args")
    for bad in ({1: 2}, object(), {1, 2}, 2**70):
        with pytest.raises(TypeError):
            check_rpc_value([bad], "args")


# --- the store ----------------------------------------------------------------------------------------


def test_storage_get_put_list_delete_and_sql(tmp_path):
    stores = BindingStores(tmp_path)
    oid = "a" * 64

    def call(method, args, kwargs=None):
        return stores.objects.call("acct", "w", "Counter", oid, method, args, kwargs or {})

    assert call("get", ["n"]) is None
    call("put", ["n", 1])
    call("put", [{"a1": {"x": [1, "two"]}, "a2": b"bytes", "b": None}])
    assert call("get", ["n"]) == 1 and call("get", [["n", "a2", "nope"]]) == {"n": 1, "a2": b"bytes"}
    assert list(call("list", [], {"prefix": "a"})) == ["a1", "a2"]
    assert list(call("list", [], {"reverse": True, "limit": 2})) == ["n", "b"]
    assert list(call("list", [], {"start": "a2", "end": "n"})) == ["a2", "b"]
    assert list(call("list", [], {"startAfter": "a2"})) == ["b", "n"]
    assert call("delete", ["n"]) is True and call("delete", ["n"]) is False
    assert call("delete", [["a1", "a2", "zz"]]) == 2
    with pytest.raises(BindingError, match="cannot cross"):
        call("put", ["k", {1, 2}])
    with pytest.raises(BindingError, match="unknown option"):
        call("get", ["n"], {"object_id": "b" * 64})  # no call can name another object

    out = call(
        "sql.exec", ["CREATE TABLE t (x); INSERT INTO t VALUES (1), (2); SELECT x FROM t ORDER BY x", []]
    )
    assert out["columns"] == ["x"] and out["rows"] == [[1], [2]]
    assert call("sql.exec", ["SELECT ? || ? AS g", ["a", "b"]])["rows"] == [["ab"]]
    for sql in (
        "SELECT * FROM __cf_kv",
        "DELETE FROM __cf_kv",
        "ATTACH 'x' AS y",
        "BEGIN",
        "PRAGMA journal_mode",
    ):
        with pytest.raises(BindingError):
            call("sql.exec", [sql, []])

    other = stores.objects.call("acct", "w", "Counter", "b" * 64, "get", ["b"], {})
    assert other is None  # another object's storage is another file
    path = stores.objects.path("acct", "w", "Counter", oid)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in (path.parent, path.parent.parent, tmp_path / "do"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    stores.close()


# --- instances -----------------------------------------------------------------------------------------

SCRIPT = """
import asyncio, secrets
from workers import DurableObject, WorkerEntrypoint, Response

class Counter(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.token = secrets.token_hex(8)

    async def increment(self, by=1):
        n = (await self.ctx.storage.get("n")) or 0
        await asyncio.sleep(0.2)  # another call would read the same n here, were calls not serialized
        await self.ctx.storage.put("n", n + by)
        return n + by

    async def who(self):
        return {"token": self.token, "id": str(self.ctx.id)}

    async def rows(self):
        self.ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS t (x)")  # synchronous, as on Cloudflare
        await self.ctx.storage.sql.exec("INSERT INTO t VALUES (?)", 7)  # the cursor may be awaited too
        cursor = self.ctx.storage.sql.exec("SELECT count(*) AS c, max(x) AS m FROM t")
        return cursor.one()

    async def fail(self):
        raise ValueError("no good")

    async def bad_result(self):
        return {1, 2}

    async def forge(self, other):
        return await self.ctx.storage._transport("get", ["n"], {"object_id": other})

class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return Response("ok")
"""


class _State:
    def secrets(self, account, name):
        return {}


@pytest.fixture
def objects(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(SCRIPT))
    fake = SimpleNamespace(
        secrets=_State(),
        bindings=BindingStores(tmp_path / ".edge"),
        tail=TailHub(),
        sockets=SocketHub(),
        feed=DashboardFeed(),
    )
    fake.on_alarm = None
    fake.objects = DurableObjects(lambda spec: WorkerHandle(spec, fake))
    spec = WorkerSpec(
        account="acct",
        name="w",
        version=None,
        script=str(script),
        vars={},
        ai_binding=None,
        services={},
        limits=IsolateLimits(),
        durable_objects={
            "COUNTER": DurableObjectRef("Counter"),
            "OTHER": DurableObjectRef("Counter", "elsewhere"),
        },
    )
    caller = WorkerHandle(spec, fake)  # never started: it only makes calls
    caller.requests[1] = Invocation(None, None, 0.0)
    key = namespace_key("acct", "w", "Counter")

    async def call(name, method, *args, binding="COUNTER", **kwargs):
        oid = id_from_name(key, name) if len(name) != 64 else name
        reply = await fake.objects.call(
            caller.spec, ipc.ObjectCall(1, 1, binding, oid, method, list(args), kwargs), caller.requests[1]
        )
        if reply.error_type is not None:
            raise RuntimeError(f"{reply.error_type}: {reply.error_message}")
        return reply.result

    yield SimpleNamespace(call=call, runtime=fake, caller=caller, key=key)
    fake.bindings.close()


def run(objects, coro):
    async def go():
        try:
            return await coro
        finally:
            await objects.runtime.objects.stop()

    return asyncio.run(go())


def test_one_instance_per_id_and_calls_one_at_a_time(objects):
    async def go():
        first = await asyncio.gather(objects.call("a", "increment"), objects.call("a", "increment"))
        a1, a2, b = (
            await objects.call("a", "who"),
            await objects.call("a", "who"),
            await objects.call("b", "who"),
        )
        return first, a1, a2, b, objects.runtime.objects.running(), await objects.call("b", "increment", by=5)

    first, a1, a2, b, running, b_count = run(objects, go())
    assert sorted(first) == [1, 2]  # serialized: the second read-modify-write saw the first's write
    assert a1 == a2 and a1["token"] != b["token"] and running == 2
    assert a1["id"] == id_from_name(objects.key, "a")
    assert b_count == 5  # two ids, two storages


def test_storage_survives_the_instance_and_sql_cursor(objects):
    async def go():
        await objects.call("a", "increment", 3)
        await objects.runtime.objects.stop()  # as when idle: the next call starts a fresh isolate
        return (
            await objects.call("a", "increment"),
            await objects.call("a", "rows"),
            await objects.call("a", "rows"),
        )

    n, rows1, rows2 = run(objects, go())
    assert n == 4 and rows1 == {"c": 1, "m": 7} and rows2 == {"c": 2, "m": 7}


def test_errors_private_methods_bad_ids_and_other_workers(objects):
    async def go():
        out = {}
        for label, coro in {
            "fail": objects.call("a", "fail"),
            "private": objects.call("a", "_secret"),
            "ctx": objects.call("a", "ctx"),
            "missing": objects.call("a", "nope"),
            "bad_result": objects.call("a", "bad_result"),
            "bad_arg": objects.call("a", "increment", {1: 2}),
            "bad_id": objects.call("f" * 64, "who"),
            "other_worker": objects.call("a", "who", binding="OTHER"),
            "unbound": objects.call("a", "who", binding="NOPE"),
        }.items():
            try:
                await coro
                out[label] = "no error"
            except RuntimeError as exc:
                out[label] = str(exc)
        return out

    out = run(objects, go())
    assert out["fail"] == "ValueError: no good"
    assert "private" in out["private"] and "no method" in out["ctx"] and "no method" in out["missing"]
    assert "set cannot cross" in out["bad_result"] and "dict keys must be strings" in out["bad_arg"]
    assert "Invalid Durable Object ID" in out["bad_id"]
    assert "another worker's Durable Object" in out["other_worker"] and "'elsewhere'" in out["other_worker"]
    assert "no Durable Object binding named 'NOPE'" in out["unbound"]


def test_an_object_cannot_reach_another_objects_storage(objects):
    async def go():
        await objects.call("b", "increment", 9)
        other = id_from_name(objects.key, "b")
        try:
            await objects.call("a", "forge", other)  # a hostile object names another's id
            forged = "no error"
        except RuntimeError as exc:
            forged = str(exc)
        # a worker (not an object) naming the storage binding reaches nothing
        plain = await objects.caller.calls.binding(ipc.BindingCall(1, 1, "ctx.storage", "get", ["n"]))
        return forged, plain, await objects.call("a", "increment")

    forged, plain, a = run(objects, go())
    assert "unknown option(s) object_id" in forged
    assert plain.error_type == "TypeError" and "ctx.storage" in plain.error_message
    assert a == 1  # a's storage never saw b's 9
    assert os.path.exists(
        objects.runtime.bindings.objects.path("acct", "w", "Counter", id_from_name(objects.key, "b"))
    )


def test_a_script_cannot_start_objects_without_bound(objects, monkeypatch):
    from runtime.host import objects as host_objects

    monkeypatch.setattr(host_objects, "MAX_RUNNING_PER_ACCOUNT", 2)

    async def go():
        for name in ("a", "b", "c"):  # the third evicts the least recently used idle one
            await objects.call(name, "increment")
        running = objects.runtime.objects.running()
        again = await objects.call("a", "increment")  # restarted; its storage kept
        return running, again

    running, again = run(objects, go())
    assert running == 2 and again == 2


def test_when_every_running_object_is_busy_a_new_one_is_refused(objects, monkeypatch):
    from runtime.host import objects as host_objects

    monkeypatch.setattr(host_objects, "MAX_RUNNING_PER_ACCOUNT", 1)

    async def go():
        busy = asyncio.ensure_future(objects.call("a", "increment"))  # holds its turn a while
        while objects.runtime.objects.running() == 0:  # "a" is registered and waiting
            await asyncio.sleep(0.01)
        try:
            await objects.call("b", "increment")
            refused = None
        except RuntimeError as exc:
            refused = str(exc)
        return await busy, refused

    first, refused = run(objects, go())
    assert first == 1 and refused is not None and "busy at once" in refused
