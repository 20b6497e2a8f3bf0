"""A WebSocket request the worker does not take gets the worker's answer as an HTTP response,
through a real `edge dev`: a Durable Object room at its socket cap (the 500 the object's refusal
becomes, passed on by the worker with its headers), a worker's own error with a body, a
streaming answer, and the server serving others afterwards."""

from __future__ import annotations

import contextlib
import json
import textwrap

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from runtime.host.sockets import PER_OWNER
from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

WORKER = """
from js import WebSocketPair
from workers import DurableObject, Response, WorkerEntrypoint


class Room(DurableObject):
    async def fetch(self, request):
        client, server = WebSocketPair.new().object_values()
        self.ctx.acceptWebSocket(server, ["chat"])
        return Response(None, status=101, web_socket=client)

    async def webSocketMessage(self, ws, message):
        ws.send(f"room: {message}")


async def chunks():
    yield b"not "
    yield b"here"


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = "/" + request.url.split("/", 3)[3].split("?")[0]
        if path.startswith("/room/"):  # the room's answer passed on as it is: a 101, or its error
            return await self.env.ROOM.getByName(path.split("/")[2]).fetch(request)
        if path == "/json":
            return Response.json({"why": "no sockets here"}, status=403, headers={"x-why": "policy"})
        if path == "/stream":
            return Response(chunks(), status=409, headers={"content-type": "text/plain"})
        return Response("expected /room/NAME", status=404)
"""

CONFIG = {
    "name": "denials-app",
    "main": "worker.py",
    "compatibility_date": "2025-01-01",
    "durable_objects": {"bindings": [{"name": "ROOM", "class_name": "Room"}]},
    "migrations": [{"tag": "v1", "new_sqlite_classes": ["Room"]}],
}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    folder = tmp_path_factory.mktemp("denials-app")
    (folder / "worker.py").write_text(textwrap.dedent(WORKER))
    config = folder / "wrangler.jsonc"
    config.write_text(json.dumps(CONFIG, indent=2))
    with DevServer(config, cwd=folder) as server:
        yield server


def _ws(dev: DevServer, path: str):
    return connect(dev.url.replace("http", "ws") + path, open_timeout=60, close_timeout=5)


def _refused(dev: DevServer, path: str):
    with pytest.raises(InvalidStatus) as refused:
        _ws(dev, path).close()
    return refused.value.response


def _room_works(dev: DevServer, name: str) -> None:
    with _ws(dev, f"/room/{name}") as ws:
        ws.send("ping")
        assert ws.recv(timeout=30) == "room: ping"


def test_a_room_at_its_socket_cap_answers_the_next_client_500(dev):
    with contextlib.ExitStack() as held:
        for _ in range(PER_OWNER):
            held.enter_context(_ws(dev, "/room/full"))
        for _ in range(2):  # and again: the server is not stuck on the first refusal
            response = _refused(dev, "/room/full")
            assert response.status_code == 500
            assert b"more than 64 WebSockets" in response.body
            assert json.loads(response.body)["error"]["message"]
            assert response.headers.get_all("content-length") == [str(len(response.body))]
        _room_works(dev, "other")  # another room, meanwhile
    assert "MultipleValuesError" not in dev.log.read_text()


def test_a_workers_json_and_streaming_answers_reach_the_client(dev):
    response = _refused(dev, "/json")
    assert response.status_code == 403 and json.loads(response.body) == {"why": "no sockets here"}
    assert response.headers["x-why"] == "policy"
    response = _refused(dev, "/stream")
    assert response.status_code == 409 and response.body == b"not here"
    response = _refused(dev, "/nowhere")
    assert response.status_code == 404 and response.body == b"expected /room/NAME"
    _room_works(dev, "after")
