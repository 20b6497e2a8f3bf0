"""The PoP node interface both kinds of node implement, and the typed status they report (which a
remote node serves and parses)."""

import asyncio
import inspect

import httpx
import msgspec
import pytest

from edge_sim.node import PopNodeLike
from edge_sim.pop import PopNode
from edge_sim.remote import RemotePopNode, create_pop_app
from edge_sim.request import GenerateRequest
from edge_sim.status import PopStatus
from engine import SamplingParams
from tests.conftest import TINY_MODEL

MODEL = TINY_MODEL  # what the fra_node fixture serves
TOKEN = "node-token"


def remote_for(node: PopNode) -> RemotePopNode:
    """A RemotePopNode driving `node` through its real HTTP app, in process."""
    remote = RemotePopNode(node.pop, "http://fra.node", token=TOKEN)
    remote._client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_pop_app(node, TOKEN)),
        headers={"authorization": f"Bearer {TOKEN}"},
    )
    return remote


def protocol_members() -> dict[str, object]:
    return {
        name: value
        for name, value in vars(PopNodeLike).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


@pytest.mark.parametrize("cls", [PopNode, RemotePopNode])
def test_both_node_kinds_declare_every_member_with_the_same_shape(cls):
    members = protocol_members()
    assert {"take_down", "bring_up", "generate", "stream", "refresh", "status", "has_room"} <= set(members)
    for name, declared in members.items():
        actual = inspect.getattr_static(cls, name, None)
        if isinstance(declared, property):  # a property, or a plain attribute (PopNode.up): on the
            assert actual is None or isinstance(actual, property), name  # instance, checked below
            continue
        assert actual is not None, f"{cls.__name__} lacks {name}"
        # async on both where the protocol says so: callers never ask which kind of node they hold
        assert inspect.iscoroutinefunction(actual) == inspect.iscoroutinefunction(declared), name
        assert inspect.isasyncgenfunction(actual) == (name == "stream"), name
        assert list(inspect.signature(actual).parameters) == list(inspect.signature(declared).parameters), (
            name
        )


def test_instances_satisfy_the_runtime_checkable_protocol(fra_node):
    remote = RemotePopNode(fra_node.pop, "http://nowhere.invalid", token=TOKEN)
    assert isinstance(fra_node, PopNodeLike) and isinstance(remote, PopNodeLike)  # every member present
    for n in (fra_node, remote):
        assert isinstance(n.up, bool) and isinstance(n.in_flight, int) and isinstance(n.code, str)
    assert not isinstance(object(), PopNodeLike)


def test_status_is_a_typed_struct_with_the_keys_pops_shows(fra_node):
    req = GenerateRequest(model=MODEL, prompt="def f(x):", params=SamplingParams(max_tokens=2))
    asyncio.run(fra_node.generate(req))
    status = fra_node.status()
    assert isinstance(status, PopStatus) and status.code == "FRA" and status.up
    m = status.models[MODEL]
    assert m.kv_blocks_total > 0 and m.kv_blocks_used == 0 and m.generated_tokens >= 2 and m.recent_steps
    view = msgspec.to_builtins(status)  # what /cdn-cgi/edge/pops shows: a local node has no remote keys
    assert {"code", "city", "up", "gpus", "queue_depth", "in_flight", "models", "refused"} <= set(view)
    assert "remote" not in view and "reachable" not in view
    assert {"weights", "kv_cache_dtype", "kv_blocks_total", "kv_blocks_used", "waiting", "running"} <= set(
        view["models"][MODEL]
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(status), type=PopStatus) == status


def test_a_remote_node_serves_and_parses_the_same_status(fra_node):
    async def scenario():
        remote = remote_for(fra_node)
        try:
            assert await remote.refresh() is True
            status = remote.status()
            assert status.remote == "http://fra.node" and status.reachable
            assert msgspec.structs.replace(status, remote=None, reachable=None).models.keys() == {MODEL}
            assert (
                remote.serves(MODEL)
                and remote.has_room()
                and remote.formats(MODEL) == fra_node.formats(MODEL)
            )
            assert remote.route_load(MODEL).as_tuple() == pytest.approx(
                fra_node.route_load(MODEL).as_tuple()
            )  # the router ranks both alike
            assert await remote.take_down() == 0 and not fra_node.up and not remote.up
            await remote.bring_up()
            assert fra_node.up and remote.up
        finally:
            await remote._client.aclose()

    asyncio.run(scenario())
