"""Durable Object alarms and WebSockets through a real `edge dev` (a worker and a wrangler.jsonc
in a folder of their own), one server for the module, restarted once at the end.

Alarms: setAlarm / getAlarm / deleteAlarm, the handler run when due with alarm_info, a failing
handler retried (retryCount, isRetry), an object re-arming its alarm for "now" in a loop not
starving another's, and an alarm set before the restart firing after it.

WebSockets: a plain worker's echo socket; two clients of one Durable Object (Cloudflare's
chat-room shape) seeing each other's messages before and after the object hibernates (its isolate
stopped, woken for the next message with its sockets and their attachments); hostile clients and
scripts: a giant frame, a flood of frames, a client that never reads, sockets a script leaves open
past the bound, the server serving others throughout."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import textwrap
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

WORKER = """
import secrets
import time

import asgi
from js import WebSocketPair
from workers import DurableObject, Response, WorkerEntrypoint


class Clock(DurableObject):
    async def arm(self, ms_from_now, fail_times=0):
        await self.ctx.storage.put("fail", fail_times)
        await self.ctx.storage.setAlarm(int(time.time() * 1000) + ms_from_now)
        return await self.ctx.storage.getAlarm()

    async def disarm(self):
        await self.ctx.storage.deleteAlarm()
        return await self.ctx.storage.getAlarm()

    async def alarm(self, alarm_info):
        fired = (await self.ctx.storage.get("fired")) or []
        fired.append([alarm_info.retryCount, alarm_info.isRetry, await self.ctx.storage.getAlarm()])
        await self.ctx.storage.put("fired", fired)
        fail = (await self.ctx.storage.get("fail")) or 0
        if fail > 0:
            await self.ctx.storage.put("fail", fail - 1)
            raise RuntimeError("not yet")

    async def report(self):
        fired = (await self.ctx.storage.get("fired")) or []
        return {"fired": fired, "alarm": await self.ctx.storage.getAlarm()}


class Spinner(DurableObject):
    async def spin(self):
        await self.ctx.storage.setAlarm(0)

    async def alarm(self):
        n = (await self.ctx.storage.get("n")) or 0
        await self.ctx.storage.put("n", n + 1)
        if n < 100:
            await self.ctx.storage.setAlarm(int(time.time() * 1000))  # again at once, as a hostile loop

    async def count(self):
        return (await self.ctx.storage.get("n")) or 0


closes = []  # the close events this isolate's echo sockets saw


async def asgi_echo(scope, receive, send):  # an ASGI app's WebSocket, as FastAPI's run
    assert scope["type"] == "websocket" and (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while (message := await receive())["type"] == "websocket.receive":
        await send({"type": "websocket.send", "text": "asgi: " + message["text"]})


class Room(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.born = secrets.token_hex(4)  # a new isolate (after hibernation) has another

    async def fetch(self, request):
        client, server = WebSocketPair.new().object_values()
        self.ctx.acceptWebSocket(server, ["chat"])
        server.serializeAttachment({"name": request.url.split("name=")[1]})
        return Response(None, status=101, web_socket=client)

    async def webSocketMessage(self, ws, message):
        who = ws.deserializeAttachment()["name"]
        for other in self.ctx.getWebSockets("chat"):
            other.send(f"{who}: {message} [{self.born}]")

    async def webSocketClose(self, ws, code, reason, was_clean):
        who = ws.deserializeAttachment()["name"]
        for other in self.ctx.getWebSockets("chat"):
            other.send(f"{who} left [{self.born}]")


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = "/" + request.url.split("/", 3)[3].split("?")[0]
        if path == "/closes":
            return Response.json(closes)
        if path.split("/")[1] in ("spin", "arm", "disarm", "report"):
            return await self.alarms(request)
        if request.headers.get("upgrade", "").lower() != "websocket":
            return Response("expected a WebSocket", status=426)
        if path == "/asgi":
            return await asgi.fetch(asgi_echo, request, self.env)
        if path == "/room":
            return await self.env.ROOM.getByName("lobby").fetch(request)
        client, server = WebSocketPair()
        server.accept()
        if path == "/echo":
            def on_message(event):
                if event.data == "crash":
                    import os

                    os._exit(3)  # the isolate dies with the socket open
                if event.data == "flood-me":
                    for _ in range(600):
                        server.send("x" * 65536)
                else:
                    server.send(event.data)

            server.addEventListener("message", on_message)
            server.addEventListener("close", lambda event: closes.append([event.code, event.reason]))
        return Response(None, status=101, web_socket=client)  # /hold: open, and left so

    async def alarms(self, request):
        parts = request.url.split("?")[0].split("/")
        action, name = parts[3], parts[4]
        if action == "spin":
            spinner = self.env.SPINNER.getByName(name)
            if len(parts) > 5:
                return Response(str(await spinner.count()))
            await spinner.spin()
            return Response("spinning")
        clock = self.env.CLOCK.getByName(name)
        if action == "arm":
            return Response.json(await clock.arm(int(parts[5]), int(parts[6])))
        if action == "disarm":
            return Response.json(await clock.disarm())
        return Response.json(await clock.report())
"""

CONFIG = {
    "name": "events-app",
    "main": "worker.py",
    "compatibility_date": "2025-01-01",
    "durable_objects": {
        "bindings": [
            {"name": "CLOCK", "class_name": "Clock"},
            {"name": "SPINNER", "class_name": "Spinner"},
            {"name": "ROOM", "class_name": "Room"},
        ]
    },
    "migrations": [{"tag": "v1", "new_sqlite_classes": ["Clock", "Spinner", "Room"]}],
    "edge": {"hibernate_s": 1.0},
}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    folder = tmp_path_factory.mktemp("events-app")
    (folder / "worker.py").write_text(textwrap.dedent(WORKER))
    path = folder / "wrangler.jsonc"
    path.write_text(json.dumps(CONFIG, indent=2))
    return path


@pytest.fixture(scope="module")
def dev(config):
    with DevServer(config, cwd=config.parent) as server:
        yield server


def _ws(dev: DevServer, path: str):
    return connect(dev.url.replace("http", "ws") + path, open_timeout=60, close_timeout=5)


def _echo_works(dev: DevServer) -> None:
    with _ws(dev, "/echo") as ws:
        ws.send("ping")
        assert ws.recv(timeout=30) == "ping"


def _hibernations(dev: DevServer) -> float:
    text = httpx.get(f"{dev.url}/cdn-cgi/edge/metrics", timeout=30).text
    found = re.search(r"^edge_durable_object_hibernations_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_worker_echoes_text_and_bytes(dev):
    with _ws(dev, "/echo") as ws:
        ws.send("hello")
        assert ws.recv(timeout=30) == "hello"
        ws.send(b"\x00\x01binary")
        assert ws.recv(timeout=30) == b"\x00\x01binary"
    assert httpx.get(f"{dev.url}/echo", timeout=30).status_code == 426  # plain HTTP: the worker's answer


def test_an_asgi_app_takes_a_websocket(dev):
    with _ws(dev, "/asgi") as ws:
        for text in ("one", "two"):
            ws.send(text)
            assert ws.recv(timeout=30) == f"asgi: {text}"


def test_two_clients_of_a_room_see_each_other_through_hibernation(dev):
    with _ws(dev, "/room?name=alice") as alice, _ws(dev, "/room?name=bob") as bob:
        alice.send("hello")
        first = alice.recv(timeout=30)
        assert first.startswith("alice: hello [") and bob.recv(timeout=30) == first
        born = first.split("[")[1]
        _wait_for_hibernation(dev, _hibernations(dev))
        bob.send("still here?")  # wakes it: a new isolate, the sockets and attachments intact
        again = bob.recv(timeout=30)
        assert again.startswith("bob: still here? [") and alice.recv(timeout=30) == again
        assert again.split("[")[1] != born  # the constructor ran again: it was another isolate
        _wait_for_hibernation(dev, _hibernations(dev))
        bob.close()  # a close wakes it too: alice hears of it, bob's attachment still his
        left = alice.recv(timeout=30)
        assert left.startswith("bob left [") and left.split("[")[1] != again.split("[")[1]


def _wait_for_hibernation(dev: DevServer, before: float) -> None:
    deadline = time.monotonic() + 30
    while _hibernations(dev) <= before and time.monotonic() < deadline:  # idle 1 s: it hibernates
        time.sleep(0.2)
    assert _hibernations(dev) > before


def test_an_isolate_that_dies_closes_its_sockets_and_the_next_request_gets_a_new_one(dev):
    with _ws(dev, "/echo") as ws, pytest.raises(ConnectionClosed) as closed:
        ws.send("crash")
        ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1012
    _echo_works(dev)


def test_a_giant_frame_is_cut_with_1009(dev):
    with _ws(dev, "/echo") as ws:
        ws.send("x" * (2 * 1024 * 1024))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1009 and "1 MiB" in closed.value.rcvd.reason
    _echo_works(dev)


def test_a_flood_of_frames_is_cut_with_1008(dev):
    with _ws(dev, "/echo") as ws, pytest.raises(ConnectionClosed) as closed:
        for _ in range(3000):
            ws.send("0123456789")
        while True:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1008 and "faster than the worker reads" in closed.value.rcvd.reason
    _echo_works(dev)


def test_a_client_that_never_reads_is_cut_and_memory_stays_bounded(dev):
    rss_before = _rss_mb(dev.proc.pid)
    seen = len(httpx.get(f"{dev.url}/closes", timeout=30).json())
    raw = socket.create_connection(("127.0.0.1", dev.port))
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.sendall(
        b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(1)
    assert head.startswith(b"HTTP/1.1 101")
    payload, mask = b"flood-me", os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    raw.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
    try:  # 600 messages of 64 KiB asked for, never read: the runtime cuts it rather than keep them
        deadline = time.monotonic() + 30
        closes: list = []
        while not closes and time.monotonic() < deadline:
            closes = httpx.get(f"{dev.url}/closes", timeout=30).json()[seen:]
            time.sleep(0.2)
        assert closes and closes[0][0] == 1008 and "the client is not reading" in closes[0][1], closes
        assert _rss_mb(dev.proc.pid) - rss_before < 32  # not the 37.5 MiB it was sent
    finally:
        raw.close()
    _echo_works(dev)


def test_sockets_a_script_leaves_open_are_bounded(dev):
    with contextlib.ExitStack() as held:
        for _ in range(64):
            held.enter_context(_ws(dev, "/hold"))
        with pytest.raises(InvalidStatus) as refused:
            _ws(dev, "/hold")
        assert refused.value.response.status_code == 500
        assert b"more than 64 WebSockets" in refused.value.response.body
    deadline = time.monotonic() + 30
    while True:  # the closes reach the runtime: room again
        try:
            _echo_works(dev)
            break
        except InvalidStatus:
            assert time.monotonic() < deadline
            time.sleep(0.2)


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _report(dev: DevServer, name: str) -> dict:
    r = httpx.get(f"{dev.url}/report/{name}", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _until(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


# last: it restarts the module's server
def test_alarms_fire_retry_stay_fair_and_survive_a_restart(dev, config):
    assert httpx.get(f"{dev.url}/spin/s", timeout=60).text == "spinning"  # re-arms for ever
    before = int(time.time() * 1000)
    armed = httpx.get(f"{dev.url}/arm/a/300/1", timeout=60).json()  # fails once, then succeeds
    assert isinstance(armed, int) and armed >= before + 300
    assert httpx.get(f"{dev.url}/arm/gone/60000/0", timeout=60).json() >= before + 60000
    assert httpx.get(f"{dev.url}/disarm/gone", timeout=60).json() is None

    # the first try fails, the retry (2 s later) succeeds; during each run getAlarm() is None
    fired = _until(lambda: len(_report(dev, "a")["fired"]) >= 2 and _report(dev, "a"))
    assert fired == {"fired": [[0, False, None], [1, True, None]], "alarm": None}, fired
    assert int(httpx.get(f"{dev.url}/spin/s/count", timeout=60).text) >= 2  # it was spinning
    assert _report(dev, "gone") == {"fired": [], "alarm": None}

    armed = httpx.get(f"{dev.url}/arm/later/4000/0", timeout=60).json()
    assert _report(dev, "later") == {"fired": [], "alarm": armed}
    dev.stop()  # the restart: the module's server ends here
    assert "failed (try 1): RuntimeError: not yet" in dev.log.read_text()

    with DevServer(config, cwd=config.parent) as dev:  # set before the restart, due after it: it fires
        fired = _until(lambda: _report(dev, "later")["fired"])
        assert fired == [[0, False, None]]
        assert _report(dev, "later")["alarm"] is None
        assert _report(dev, "gone")["fired"] == []
