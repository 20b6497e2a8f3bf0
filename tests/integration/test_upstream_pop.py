"""A PoP whose engine is a real, separate OpenAI-compatible server: another `edge dev` (its OpenAI
endpoint, with its API token) is the upstream, and the front `edge dev`'s FRA forwards to it
(`backend = "openai"`), with an in-process ICN beside it to fail over to."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.faults.project import events, outcome, token, write_project
from tests.integration.dev_server import REPO, DevServer, free_port

MODEL = "@edge/moonshotai/kimi-k2-mini"
PARIS = {"x-edge-client-location": "Paris"}
FRA = {"code": "FRA", "city": "Frankfurt", "country": "DE", "continent": "EU", "lat": 50.11, "lon": 8.68}
KEY_ENV = "EDGE_TEST_UPSTREAM_KEY"


def front_topology(folder: Path, base_url: str, cache_salt: bool = False) -> None:
    """FRA forwards to `base_url`, one request at a time (the rest wait in its fair queue)."""
    pop = "".join(f"{k} = {json.dumps(v)}\n" for k, v in FRA.items())
    (folder / "topology.toml").write_text(
        f"[[pop]]\n{pop}timezone = 'Europe/Berlin'\ngpus = {{ H200 = 8 }}\n"
        f"[pop.upstream]\nbackend = 'openai'\nbase_url = {json.dumps(base_url)}\n"
        f"api_key_env = '{KEY_ENV}'\ncache_salt = {str(cache_salt).lower()}\nmax_concurrent = 1\n"
        f"[[pop.upstream.models]]\nname = '{MODEL}'\nupstream_model = '{MODEL}'\n"
        "weights = 'fp8'\nkv_cache = 'fp8_e4m3'\n"
    )


def upstream_project(folder: Path) -> Path:
    folder.mkdir()
    return write_project(folder, pops=("ICN",))


def front_project(folder: Path, base_url: str, cache_salt: bool = False) -> Path:
    folder.mkdir()
    front_topology(folder, base_url, cache_salt)
    config = write_project(folder, pops=("ICN", "FRA"))
    config.write_text(config.read_text().replace("[edge]\n", '[edge]\ntopology = "topology.toml"\n'))
    return config


def openai(server: DevServer, folder: Path, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(
        f"{server.url}/client/v4/accounts/local/ai/v1/{path}",
        json=body,
        headers={**token(folder), **PARIS},
        timeout=120,
        **kw,
    )


def start_proxy(target: str, record: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests/integration/recording_proxy.py"), target, str(port), str(record)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            assert proc.poll() is None, "the recording proxy exited during start-up"
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError("the recording proxy did not start")


@contextmanager
def running_upstream(folder: Path, monkeypatch: pytest.MonkeyPatch):
    """The upstream edge dev, its OpenAI base URL, and a restart on the same port."""
    config = upstream_project(folder)
    servers = [DevServer(config, cwd=folder)]
    servers[0].__enter__()
    monkeypatch.setenv(KEY_ENV, token(folder)["authorization"][len("Bearer ") :])

    def restart() -> DevServer:
        again = DevServer(config, cwd=folder, port=servers[0].port)
        servers.append(again)
        again.wait_ready()
        return again

    try:
        yield servers[0], f"{servers[0].url}/client/v4/accounts/local/ai", restart
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.stop()


@contextmanager
def running_front(folder: Path, upstream):
    up, base_url, restart = upstream
    config = front_project(folder, base_url)
    with DevServer(config, cwd=folder) as server:
        yield server, folder, up, restart


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    with running_upstream(tmp_path / "upstream", monkeypatch) as up:
        yield up


@pytest.fixture
def front(tmp_path, upstream):
    with running_front(tmp_path / "front", upstream) as pair:
        yield pair


@pytest.fixture(scope="module")
def shared_front(tmp_path_factory):
    """The same pair, shared by the tests that leave both as they found them (no kill, no restart)."""
    folder = tmp_path_factory.mktemp("shared-upstream")
    with pytest.MonkeyPatch.context() as monkeypatch:
        with running_upstream(folder / "upstream", monkeypatch) as up:
            with running_front(folder / "front", up) as pair:
                yield pair


def test_chat_completions_plain_and_streamed_are_served_through_the_upstream(shared_front):
    server, folder, _, _ = shared_front
    body = {"model": MODEL, "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 8}
    r = openai(server, folder, "chat/completions", {**body, "temperature": 0})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["choices"][0]["message"]["content"]
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["timing"]["pop"] == "FRA"
    assert answer["quantization"]["weights"] == "fp8" and answer["quantization"]["kv_cache"] == "fp8_e4m3"

    r = openai(server, folder, "chat/completions", {**body, "temperature": 0, "stream": True})
    assert r.status_code == 200, r.text
    chunks = events(r.text)
    assert chunks[-1] == "[DONE]"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c.get("choices"))
    assert text == answer["choices"][0]["message"]["content"]  # greedy: the same answer streamed

    pops = httpx.get(server.url + "/cdn-cgi/edge/pops", headers=token(folder, "admin-token"), timeout=30)
    fra = next(p for p in pops.json()["pops"] if p["code"] == "FRA")
    assert fra["backend"] == "openai" and fra["models"][MODEL]["weights"] == "fp8"


def test_an_upstream_400_is_a_5004_with_its_message(shared_front):
    server, folder, _, _ = shared_front
    schema = {"type": "string", "pattern": "(?<=a)b"}  # a look-behind: no grammar engine compiles it
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    r = openai(server, folder, "chat/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    # the upstream's own message, named as the upstream's (the runtime prefixes JSON mode's failure)
    assert error["code"] == 5004 and "upstream: response_format: " in error["message"], error
    assert "look-around" in error["message"]


def test_the_upstream_killed_mid_stream_fails_the_stream_reroutes_and_comes_back(front):
    server, folder, up, restart = front
    assert outcome(*_stream(server, 8)) == ("completed", "FRA")

    got, first = {}, threading.Event()

    def long_stream():
        body = {"prompt": "def f():", "n": 2000}
        with httpx.stream("POST", server.url + "/stream", json=body, headers=PARIS, timeout=120) as r:
            parts = []
            for chunk in r.iter_text():
                parts.append(chunk)
                first.set()
            got["outcome"] = outcome(r.status_code, "".join(parts))

    streamer = threading.Thread(target=long_stream)
    streamer.start()
    assert first.wait(60), "the stream never started"
    # sent while FRA's one slot is taken (and ICN is out, so the router cannot prefer it): it
    # waits in FRA's queue
    admin = token(folder, "admin-token")
    pop_state(server, admin, "ICN", "down")
    queued: list = []
    waiter = threading.Thread(target=lambda: queued.append(outcome(*_stream(server, 4))))
    waiter.start()
    for _ in range(100):
        pops = httpx.get(server.url + "/cdn-cgi/edge/pops", headers=admin, timeout=30).json()["pops"]
        if next(p for p in pops if p["code"] == "FRA")["queue_depth"] == 1:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("no request waited in FRA's queue")
    pop_state(server, admin, "ICN", "up")
    up.proc.send_signal(signal.SIGKILL)
    up.proc.wait(timeout=30)
    streamer.join(timeout=120)
    assert not streamer.is_alive(), "the stream hung after its upstream was killed"
    assert got["outcome"][0] == "failed" and got["outcome"][1].isdigit(), got
    waiter.join(timeout=120)
    assert queued == [("completed", "ICN")]  # the queued one was handed back and re-routed, not lost

    # requests while it is down are served at ICN, none lost
    outcomes = [outcome(*_stream(server, 4)) for _ in range(4)]
    assert outcomes == [("completed", "ICN")] * 4, outcomes
    restart()
    assert _until(server, "FRA") == ("completed", "FRA")  # back after its health check


def pop_state(server: DevServer, admin: dict, code: str, action: str) -> None:
    r = httpx.post(f"{server.url}/cdn-cgi/edge/pops/{code}/{action}", headers=admin, json={}, timeout=30)
    assert r.status_code == 200, r.text


def _stream(server: DevServer, n: int) -> tuple[int, str]:
    r = httpx.post(server.url + "/stream", json={"prompt": "def f():", "n": n}, headers=PARIS, timeout=120)
    return r.status_code, r.text


def _until(server: DevServer, pop: str) -> tuple[str, str]:
    for _ in range(100):
        got = outcome(*_stream(server, 4))
        if got[1] == pop:
            return got
        time.sleep(0.2)
    return got


def test_the_tenant_salt_reaches_the_upstream_as_cache_salt(tmp_path, upstream):
    _, base_url, _ = upstream
    record = tmp_path / "salts.jsonl"
    proxy, proxy_url = start_proxy(base_url, record)
    try:
        folder = tmp_path / "front"
        config = front_project(folder, proxy_url, cache_salt=True)
        with DevServer(config, cwd=folder) as server:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "x = "}], "max_tokens": 2}
            for _ in range(2):
                r = openai(server, folder, "chat/completions", body)
                assert r.status_code == 200, r.text
                assert r.json()["timing"]["pop"] == "FRA"
    finally:
        proxy.kill()
        proxy.wait(timeout=30)
    salts = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(salts) == 2 and salts[0] == salts[1], salts  # one tenant: one salt
    assert isinstance(salts[0], str) and len(salts[0]) == 64 and "local" not in salts[0]
