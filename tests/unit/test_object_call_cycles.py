"""Durable Object call cycles fail at once (runtime.host.objects): A -> B -> A, longer rings, and two
requests each holding the object the other waits for, from the runtime's own books; nested calls
without a cycle (A -> B -> C, a diamond, the same object again after its call ended) still run."""

from __future__ import annotations

import asyncio

import pytest

from runtime.host.invocation import Invocation
from runtime.host.objects import CALL_CYCLE, DurableObjects, namespace_key
from runtime.host.sockets import SocketHub, SocketOwner
from runtime.host.spec import DurableObjectRef, WorkerSpec
from runtime.isolate import ipc
from runtime.isolate.process import IsolateLimits
from workers.durable_objects import id_from_name

BINDINGS = {"NODE": DurableObjectRef("Node"), "RELAY": DurableObjectRef("Relay")}


def _id(class_name: str, name: str) -> str:
    return id_from_name(namespace_key("acct", "w", class_name), name)


class Hop:
    """A stand-in for an object's isolate: `visit(route)` calls the first object of the route with
    the rest of it (as a script's `await env.NODE.getByName(n).visit(rest)` would), then returns
    the names it went through; `pause` waits in the object before going on."""

    def __init__(self, spec: WorkerSpec, objects: DurableObjects):
        self.spec, self.objects = spec, objects
        self.sockets = SocketOwner(SocketHub(), spec.account, "hop", None)  # (it holds none)

    async def call_object(self, method, args, kwargs, ctx: Invocation):
        route, pause = args[0], kwargs.get("pause", 0)
        me = self.spec.durable_object
        await asyncio.sleep(pause)
        if not route:
            return ipc.ObjectResult(0, [me.class_name])
        binding, name = route[0]
        oid = _id(BINDINGS[binding].class_name, name)
        call = ipc.ObjectCall(1, 1, binding, oid, "visit", [route[1:]], {"pause": pause})
        reply = await self.objects.call(self.spec, call, ctx)
        if reply.error_type is not None:
            return ipc.InvokeError(0, f"{reply.error_type}: {reply.error_message}", "")
        return ipc.ObjectResult(0, [me.class_name, *reply.result])

    async def stop(self) -> None:
        pass


def _caller() -> WorkerSpec:
    return WorkerSpec(
        account="acct",
        name="w",
        version=None,
        script="worker.py",
        vars={},
        ai_binding=None,
        services={},
        limits=IsolateLimits(),
        durable_objects=BINDINGS,
    )


async def _visit(objects: DurableObjects, route: list, pause: float = 0.0, ctx: Invocation | None = None):
    binding, name = route[0]
    call = ipc.ObjectCall(1, 1, binding, _id(BINDINGS[binding].class_name, name), "visit", [route[1:]], {})
    call.kwargs["pause"] = pause
    reply = await objects.call(_caller(), call, ctx or Invocation(None, None, 0.0))
    return reply.result if reply.error_type is None else f"{reply.error_type}: {reply.error_message}"


def run(coro_fn):
    async def go():
        objects = DurableObjects(lambda spec: Hop(spec, objects))
        try:
            return await asyncio.wait_for(coro_fn(objects), 10)  # a cycle that waits fails here
        finally:
            await objects.stop()

    return asyncio.run(go())


def test_a_call_back_to_an_object_in_the_chain_fails_at_once_naming_it():
    a, b = _id("Node", "a"), _id("Relay", "b")
    out = run(lambda objects: _visit(objects, [("NODE", "a"), ("RELAY", "b"), ("NODE", "a")]))
    # Relay's call back to Node(a) is refused; the error comes back up the chain as it is
    assert out.startswith(
        f"Error: {CALL_CYCLE}: Durable Object call cycle: Node({a}) -> Relay({b}) -> Node({a})"
    )


def test_longer_rings_fail_and_nested_calls_without_a_cycle_run():
    async def go(objects):
        ring = await _visit(objects, [("NODE", "a"), ("RELAY", "b"), ("NODE", "c"), ("RELAY", "b")])
        chain = await _visit(objects, [("NODE", "a"), ("RELAY", "b"), ("NODE", "c")])
        again = await _visit(objects, [("RELAY", "b"), ("NODE", "a")])  # b -> a after a's call ended
        return ring, chain, again

    ring, chain, again = run(go)
    b, c = _id("Relay", "b"), _id("Node", "c")
    assert f"call cycle: Relay({b}) -> Node({c}) -> Relay({b})" in ring
    assert chain == ["Node", "Relay", "Node"] and again == ["Relay", "Node"]


def test_a_diamond_waits_its_turn_and_is_no_cycle():
    async def go(objects):
        # a -> b -> d and a -> c -> d at once (two requests): d serves one, then the other
        return await asyncio.gather(
            _visit(objects, [("NODE", "a"), ("RELAY", "b"), ("NODE", "d")], pause=0.05),
            _visit(objects, [("NODE", "c"), ("RELAY", "e"), ("NODE", "d")], pause=0.05),
        )

    assert run(go) == [["Node", "Relay", "Node"]] * 2


def test_two_requests_holding_what_the_other_waits_for_fail_at_once():
    async def go(objects):
        # request 1: a -> b; request 2: b -> a, each pausing in its first object first
        return await asyncio.gather(
            _visit(objects, [("NODE", "a"), ("RELAY", "b")], pause=0.1),
            _visit(objects, [("RELAY", "b"), ("NODE", "a")], pause=0.1),
        )

    first, second = run(go)
    results = [r for r in (first, second) if isinstance(r, list)]
    refused = [r for r in (first, second) if isinstance(r, str)]
    assert len(results) == 1 and len(refused) == 1  # one is refused, so the other finishes
    assert CALL_CYCLE in refused[0] and "call cycle" in refused[0]


def test_the_chain_crosses_a_worker_in_between():
    """A request that an object's call made (through a service binding) carries the chain: the
    worker calling back into that object is refused too."""
    a = _id("Node", "a")

    async def go(objects):
        # Node(a) runs (holding its turn) while a request nested in its call calls it
        held = asyncio.ensure_future(_visit(objects, [("NODE", "a")], pause=0.3))
        await asyncio.sleep(0.1)
        key = ("acct", "w", None, "Node", a)
        nested = Invocation(None, None, 0.0, objects=(key,))
        out = await _visit(objects, [("NODE", "a")], ctx=nested)
        fresh = await _visit(objects, [("NODE", "a")])  # not nested: it waits its turn, then runs
        return out, await held, fresh

    out, held, fresh = run(go)
    assert f"call cycle: Node({a}) -> worker w -> Node({a})" in out
    assert held == ["Node"] and fresh == ["Node"]


@pytest.mark.parametrize("forged", [(), (("acct", "w", None, "Node", "f" * 64),)])
def test_what_a_script_sends_does_not_decide(forged):
    """The chain lives in the runtime's Invocation, never in a message: an object's call
    back is refused whatever the call carries (no field of ObjectCall names a chain)."""
    assert "objects" not in ipc.ObjectCall.__struct_fields__
    a, b = _id("Node", "a"), _id("Relay", "b")
    out = run(
        lambda objects: _visit(
            objects,
            [("NODE", "a"), ("RELAY", "b"), ("NODE", "a")],
            ctx=Invocation(None, None, 0.0, objects=forged),
        )
    )
    assert f"Node({a}) -> Relay({b}) -> Node({a})" in out
