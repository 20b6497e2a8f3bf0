"""The runtime's SQLite files locked by another process (a second connection holding BEGIN
EXCLUSIVE) during a deploy, a secret write and a KV put: each is refused with a 503 that says the
file is locked (after the bounded busy timeout, never a hang or a 500 traceback), nothing is
half-written (`integrity_check` ok, the old secret and deployment stand), and the worker already
deployed keeps serving while the lock is held and after."""

import sqlite3
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from runtime.control.state import State
from tests.faults.project import OTHER_WORKER, api, integrity, write_project
from tests.integration.dev_server import DevServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("state-lock")
    with DevServer(write_project(folder), cwd=folder) as srv:
        srv.folder = folder
        yield srv


@contextmanager
def locked(db):
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def deploy(server, body: str) -> httpx.Response:
    files = {"worker.py": OTHER_WORKER.replace("other ok", body)}
    return api(
        server.url, server.folder, "PUT", "/workers/scripts/other", json={"main": "worker.py", "files": files}
    )


def secret(server, value: str) -> httpx.Response:
    body = {"name": "TOKEN", "text": value, "type": "secret_text"}
    return api(server.url, server.folder, "PUT", "/workers/scripts/faults/secrets", json=body)


def other(server) -> str:
    return httpx.get(server.url + "/", headers={"x-edge-worker": "local/other"}, timeout=60).text


def test_writes_to_a_locked_state_database_are_refused_and_nothing_is_torn(server):
    db = server.folder / ".edge" / "state.db"
    assert deploy(server, "v1").status_code == 200 and secret(server, "old").status_code == 200
    assert other(server) == "v1"
    with locked(db):
        for r in (deploy(server, "v2"), secret(server, "new")):
            assert r.status_code == 503, r.text
            [error] = r.json()["errors"]
            assert error["code"] == 1125 and "locked by another process" in error["message"], error
        assert other(server) == "v1" and httpx.get(server.url + "/", timeout=60).text == "ok"
    assert integrity(db) == "ok"
    state = State(db)
    try:
        assert state.secrets("local", "faults")["TOKEN"] == "old"
        assert len(state.versions("local", "other")) == 1
    finally:
        state.close()
    assert not list((server.folder / ".edge" / "staging").glob("*")), "a refused deploy left files"
    assert other(server) == "v1"
    assert deploy(server, "v3").status_code == 200 and other(server) == "v3"  # and writes work again


def test_serving_goes_on_while_a_write_waits_out_the_lock(server):
    # the write waits (up to the busy timeout) off the event loop, and the request path reads on a
    # connection of its own: requests are served while it waits, not after it gives up
    db = server.folder / ".edge" / "state.db"
    with locked(db):
        outcome: list[httpx.Response] = []
        writer = threading.Thread(target=lambda: outcome.append(secret(server, "waiting")))
        writer.start()
        time.sleep(0.5)  # the write is in flight, waiting on the lock
        served = [other(server) for _ in range(3)]
        token_checked = api(server.url, server.folder, "GET", "/ai/models/search").status_code
        still_waiting = writer.is_alive()
        writer.join(timeout=60)
    assert served == [served[0]] * 3 and token_checked == 200
    assert still_waiting, "the requests were served only once the write had given up"
    assert outcome[0].status_code == 503


def test_a_kv_put_into_a_locked_store_fails_with_a_clear_error(server):
    db = server.folder / ".edge" / "kv.sqlite"
    assert httpx.get(server.url + "/kv/first", timeout=60).text == "stored"
    with locked(db):
        r = httpx.get(server.url + "/kv/second", timeout=60)
        assert r.status_code == 503 and "KV store is locked by another process" in r.text, r.text
        assert httpx.get(server.url + "/", timeout=60).text == "ok"
    assert integrity(db) == "ok"
    assert httpx.get(server.url + "/kv/third", timeout=60).text == "stored"
