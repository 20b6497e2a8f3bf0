"""A remote PoP node (`edge pop serve`) SIGKILLed with a stream running there, then restarted on
the same port: the running stream ends with an error that names a code (not a hang, not a silent
cut), health checks mark the node down (requests go to the next PoP), and bring it back (requests
are served there again)."""

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.faults.project import outcome, write_project
from tests.integration.dev_server import DevServer, free_port

PARIS = {"x-edge-client-location": "Paris"}


def start_node(folder, port: int) -> subprocess.Popen:
    """`edge pop serve` as FRA on `port`, once its health check answers."""
    node = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "pop", "serve", "--name", "FRA", "--port", str(port)]
        + ["--config", str(folder / "wrangler-like.toml"), "--log-level", "warning"],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                return node
        except httpx.HTTPError:
            assert node.poll() is None, "edge pop serve exited during start-up"
            time.sleep(0.1)
    node.kill()
    raise TimeoutError("edge pop serve did not start")


def served_at(server, body=None) -> tuple[str, str]:
    r = httpx.post(
        server.url + "/stream", json=body or {"prompt": "def f():", "n": 3}, headers=PARIS, timeout=60
    )
    return outcome(r.status_code, r.text)


def until(server, wanted: str) -> tuple[str, str]:
    """Ask from Paris until FRA's state shows (health checks run every 2 s); the last outcome."""
    for _ in range(100):
        got = served_at(server)
        if got[1] == wanted:
            return got
        time.sleep(0.1)
    return got


@pytest.fixture
def edge(tmp_path, monkeypatch):
    port = free_port()
    monkeypatch.setenv("EDGE_NODE_TOKEN", "node-token-for-the-fault-test")
    fra = {"code": "FRA", "city": "Frankfurt", "country": "DE", "continent": "EU", "lat": 50.11, "lon": 8.68}
    fra |= {"timezone": "Europe/Berlin", "url": f"http://127.0.0.1:{port}"}
    fields = ", ".join(f"{k} = {json.dumps(v)}" for k, v in fra.items())
    (tmp_path / "topology.toml").write_text(f"pop = [{{ {fields}, gpus = {{ H200 = 8 }} }}]\n")
    config = write_project(tmp_path, pops=("ICN", "FRA"))
    config.write_text(config.read_text().replace("[edge]\n", '[edge]\ntopology = "topology.toml"\n'))
    nodes = [start_node(tmp_path, port)]
    try:
        with DevServer(config, cwd=tmp_path) as srv:
            yield srv, nodes, lambda: nodes.append(start_node(tmp_path, port))
    finally:
        for node in nodes:
            node.kill()
            node.wait(timeout=30)


def test_a_killed_remote_pop_fails_its_stream_is_routed_around_and_comes_back(edge):
    server, nodes, restart = edge
    assert served_at(server) == ("completed", "FRA")

    got, first = {}, threading.Event()

    def long_stream():
        body = {"prompt": "def f():", "n": 2000}
        with httpx.stream("POST", server.url + "/stream", json=body, headers=PARIS, timeout=60) as r:
            parts = []
            for chunk in r.iter_text():
                parts.append(chunk)
                first.set()
            got["outcome"] = outcome(r.status_code, "".join(parts))

    streamer = threading.Thread(target=long_stream)
    streamer.start()
    assert first.wait(60), "the stream never started"
    nodes[0].send_signal(signal.SIGKILL)
    nodes[0].wait(timeout=30)
    streamer.join(timeout=60)
    assert not streamer.is_alive(), "the stream hung after its PoP was killed"
    assert got["outcome"][0] == "failed" and got["outcome"][1].isdigit(), got

    assert until(server, "ICN") == ("completed", "ICN")  # marked down: Paris goes to ICN
    restart()
    assert until(server, "FRA") == ("completed", "FRA")  # back after its health check
