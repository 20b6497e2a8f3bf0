"""Durable Object call cycles through a real `edge dev`: A -> B -> A (by RPC, or with stub.fetch
first) fails at once, well inside the 300 s wall limit it used to wait for, with DO_CALL_CYCLE and
the chain of ids; A -> B -> C and the same objects called again afterwards still answer."""

from __future__ import annotations

import json
import textwrap

import httpx
import pytest

from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

WORKER = """
import json
from urllib.parse import parse_qs, urlparse
from workers import DurableObject, Response, WorkerEntrypoint


def parse(url):
    query = parse_qs(urlparse(url).query)
    return [part.split(":") for part in query["r"][0].split(",")], query.get("via", ["rpc"])[0]


class Hop(DurableObject):
    async def visit(self, route):
        here = [f"{type(self).__name__}:{self.ctx.id}"]
        if not route:
            return here
        (binding, name), rest = route[0], route[1:]
        return here + await getattr(self.env, binding).getByName(name).visit(rest)

    async def fetch(self, request):
        route, _ = parse(request.url)
        return Response(json.dumps(await self.visit(route[1:])))


class Node(Hop):
    pass


class Relay(Hop):
    pass


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        route, via = parse(request.url)
        ids = {f"{b}:{n}": str(getattr(self.env, b).idFromName(n)) for b, n in route}
        binding, name = route[0]
        stub = getattr(self.env, binding).getByName(name)
        try:
            if via == "fetch":  # the object's fetch threw: a 500 with the error, as from a worker
                response = await stub.fetch(request.url)
                seen = json.loads(await response.text())
                if response.status != 200:
                    return Response.json({"error": seen["error"]["message"], "ids": ids}, status=500)
            else:
                seen = await stub.visit(route[1:])
        except Exception as exc:
            return Response.json({"error": f"{type(exc).__name__}: {exc}", "ids": ids}, status=500)
        return Response.json({"seen": seen, "ids": ids})
"""

CONFIG = {
    "name": "cycles",
    "main": "worker.py",
    "compatibility_date": "2025-01-01",
    "durable_objects": {
        "bindings": [{"name": "NODE", "class_name": "Node"}, {"name": "RELAY", "class_name": "Relay"}]
    },
    "migrations": [{"tag": "v1", "new_sqlite_classes": ["Node", "Relay"]}],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cycles")
    (folder / "worker.py").write_text(textwrap.dedent(WORKER))
    config = folder / "wrangler.jsonc"
    config.write_text(json.dumps(CONFIG, indent=2))
    with DevServer(config, cwd=folder) as srv:
        yield srv


def visit(server, route: str, via: str = "rpc") -> httpx.Response:
    # well under the 300 s wall limit a cycle used to wait for
    return httpx.get(f"{server.url}/", params={"r": route, "via": via}, timeout=30)


@pytest.mark.parametrize("via", ["rpc", "fetch"])
def test_a_call_cycle_fails_at_once_naming_the_chain(server, via):
    r = visit(server, "NODE:a,RELAY:b,NODE:a", via)
    assert r.status_code == 500, r.text
    body = r.json()
    a, b = body["ids"]["NODE:a"], body["ids"]["RELAY:b"]
    cycle = (
        f"DurableObjectError: DO_CALL_CYCLE: Durable Object call cycle: Node({a}) -> Relay({b}) -> Node({a});"
    )
    assert cycle in body["error"], body["error"]
    assert "Durable Object call refused" in server.log.read_text()


def test_nested_calls_without_a_cycle_answer_and_the_objects_are_not_left_waiting(server):
    assert visit(server, "NODE:a,RELAY:b,NODE:a").status_code == 500
    r = visit(server, "NODE:a,RELAY:b,NODE:c")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["seen"] == [
        f"Node:{body['ids']['NODE:a']}",
        f"Relay:{body['ids']['RELAY:b']}",
        f"Node:{body['ids']['NODE:c']}",
    ]
    again = visit(server, "RELAY:b,NODE:a")  # b calls a, now that a's call has ended
    assert again.status_code == 200 and len(again.json()["seen"]) == 2, again.text
