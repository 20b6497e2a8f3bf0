"""Sockets a Durable Object offered through stub.fetch and its worker never passed on expire on
their own (runtime.host.sockets): after OFFER_S the room holds them no longer and takes new ones,
with no later offer needed; and the front answers a WebSocket request the worker did not take
with the worker's whole response, whatever its shape (runtime.host.front._deny)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import WebSocketRoute
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from runtime.host import front, sockets
from runtime.host.sockets import OFFER_S, PER_OWNER, SocketHub, SocketOwner
from runtime.isolate import ipc


async def _never(sock, event):
    raise AssertionError("not delivered in these tests")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _full_room(hub: SocketHub) -> tuple[SocketOwner, list[str]]:
    room = SocketOwner(hub, "acct", "Room", _never)
    tokens = []
    for ws in range(1, PER_OWNER + 1):
        sock = room.open(ipc.SocketOffer(ws=ws, tags=["chat"]), 1)
        tokens.append(hub.offer(sock))
    assert "more than 64 WebSockets" in room.open(ipc.SocketOffer(ws=PER_OWNER + 1, tags=[]), 1)
    return room, tokens


def test_offers_never_passed_on_expire_at_the_next_check_without_another_offer():
    clock = _Clock()
    hub = SocketHub(clock=clock)
    room, tokens = _full_room(hub)
    clock.now += OFFER_S - 0.01
    assert "more than 64" in room.open(ipc.SocketOffer(ws=100, tags=[]), 1)  # not yet
    assert hub.count("acct") == PER_OWNER
    clock.now += 0.02
    offered = list(room.sockets.values())
    sock = room.open(ipc.SocketOffer(ws=100, tags=[]), 1)  # the check itself sweeps: room again
    assert not isinstance(sock, str)
    never = ("close", (1011, "the WebSocket was never passed on to a client"))
    assert all(s.closed and s.outbox[-1] == never for s in offered)
    assert list(room.sockets) == [100] and hub.count("acct") == 1
    assert all(hub.claim(t, "acct") is None for t in tokens)  # expired: never claimable again


def test_an_expired_offer_is_not_claimable_and_a_claimed_one_never_expires():
    clock = _Clock()
    hub = SocketHub(clock=clock)
    room = SocketOwner(hub, "acct", "Room", _never)
    kept, late = (room.open(ipc.SocketOffer(ws=ws), 1) for ws in (1, 2))
    kept_token, late_token = hub.offer(kept), hub.offer(late)
    assert hub.claim(kept_token, "acct") is kept
    clock.now += OFFER_S
    assert hub.claim(late_token, "acct") is None and late.closed
    hub.expire_offers()
    assert not kept.closed and list(room.sockets) == [1] and hub.count("acct") == 1


def test_an_offer_expires_by_itself_on_a_running_loop(monkeypatch):
    monkeypatch.setattr(sockets, "OFFER_S", 0.05)

    async def run() -> None:
        hub = SocketHub()
        room = SocketOwner(hub, "acct", "Room", _never)
        offered = room.open(ipc.SocketOffer(ws=1, tags=[]), 1)
        claimed = room.open(ipc.SocketOffer(ws=2, tags=[]), 1)
        hub.offer(offered)
        assert hub.claim(hub.offer(claimed), "acct") is claimed
        await asyncio.sleep(0.2)  # no check, no offer: the timer alone
        assert offered.closed and list(room.sockets) == [2] and hub.count("acct") == 1
        assert not claimed.closed
        await hub.stop()

    asyncio.run(run())


# --- the front's answer to a WebSocket request the worker did not take ----------------------------


async def _stream():
    yield b"still "
    yield "streaming"


def _object_error() -> Response:
    """An object's error passed on by its worker: the object's own Content-Length kept among the
    headers, next to the one the worker's response sets (as runtime.host.worker builds it)."""
    inner = JSONResponse({"error": {"code": 10013, "message": "more than 64 WebSockets"}}, status_code=500)
    outer = Response(inner.body, status_code=500)
    for name, value in inner.headers.items():
        outer.headers.append(name, value)
    return outer


ANSWERS = {
    "/passed-on": _object_error,
    "/json": lambda: JSONResponse({"why": "no"}, status_code=403, headers={"x-why": "policy"}),
    "/stream": lambda: StreamingResponse(_stream(), status_code=409, headers={"content-length": "3"}),
    "/endless": lambda: StreamingResponse(_endless(), status_code=503),
}


async def _endless():
    while True:
        yield b"x" * 4096
        await asyncio.sleep(0)


async def _route(websocket) -> None:
    await front._deny(websocket, ANSWERS[websocket.scope["path"]]())


@pytest.fixture(scope="module")
def server():
    config = uvicorn.Config(Starlette(routes=[WebSocketRoute("/{p}", _route)]), port=0, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"ws://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _refused(url: str):
    with pytest.raises(InvalidStatus) as refused, contextlib.closing(connect(url, open_timeout=30)):
        pass
    response = refused.value.response
    assert response.headers.get_all("content-length") == [str(len(response.body))]
    return response


def test_every_shape_of_answer_reaches_the_client_whole(server):
    passed_on = _refused(server + "/passed-on")
    assert passed_on.status_code == 500 and b"more than 64 WebSockets" in passed_on.body
    assert passed_on.headers["content-type"] == "application/json"
    json_answer = _refused(server + "/json")
    assert (json_answer.status_code, json_answer.body) == (403, b'{"why":"no"}')
    assert json_answer.headers["x-why"] == "policy"
    streamed = _refused(server + "/stream")
    assert (streamed.status_code, streamed.body) == (409, b"still streaming")
    endless = _refused(server + "/endless")
    assert endless.status_code == 503 and len(endless.body) == front.DENIAL_BYTES
