"""An isolate killed (SIGKILL to its tree's root) while its request sleeps or awaits env.AI.run:
that client gets a 5xx that says the isolate ended, the worker's next request is served by a
fresh isolate, and another worker on the same runtime is untouched (same isolate, still serving)."""

import os
import signal
import threading
import time

import httpx
import pytest

from tests.faults.project import OTHER_WORKER, api, isolate_root, write_project
from tests.integration.dev_server import DevServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("isolate-kill")
    with DevServer(write_project(folder), cwd=folder) as srv:
        srv.folder = folder
        r = api(
            srv.url,
            folder,
            "PUT",
            "/workers/scripts/other",
            json={"main": "worker.py", "files": {"worker.py": OTHER_WORKER}},
        )
        assert r.status_code == 200, r.text
        yield srv


def other(server) -> httpx.Response:
    return httpx.get(server.url + "/", headers={"x-edge-worker": "local/other"}, timeout=60)


def other_root(server) -> int:
    scripts = server.folder / ".edge" / "scripts"
    [bundle] = list(scripts.iterdir())
    return isolate_root(server.proc.pid, bundle)


@pytest.mark.parametrize("path", ["sleep", "generate?n=2000"])
def test_a_killed_isolate_fails_its_request_and_the_next_gets_a_fresh_one(server, path):
    assert httpx.get(server.url + "/", timeout=60).text == "ok"
    assert other(server).text == "other ok"
    root, others = isolate_root(server.proc.pid, server.folder), other_root(server)
    assert root and others
    got = {}

    def call():
        got["r"] = httpx.get(f"{server.url}/{path}", timeout=60)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(1.0)  # it is sleeping, or generating (2000 tokens take far longer than this)
    assert caller.is_alive(), got
    os.kill(root, signal.SIGKILL)
    caller.join(timeout=30)
    assert not caller.is_alive(), "the request hung after its isolate was killed"
    r = got["r"]
    assert r.status_code >= 500, r.text
    assert "isolate for faults ended" in r.text, r.text

    assert httpx.get(server.url + "/", timeout=60).text == "ok"
    fresh = isolate_root(server.proc.pid, server.folder)
    assert fresh and fresh != root
    assert other(server).text == "other ok" and other_root(server) == others
