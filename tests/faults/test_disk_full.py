"""The state directory's disk full (the runtime runs in a mount namespace of its own with a small
tmpfs on `.edge/`, filled up by the test): a deploy, a secret write and a KV put each fail with a
503 that says the disk is full, the databases pass `integrity_check`, reads and the deployed
workers keep serving, and writes work again once there is room."""

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.faults.project import OTHER_WORKER, api, integrity, write_project
from tests.integration.dev_server import DevServer

MOUNT = 'mount -t tmpfs -o size=8m,mode=700 edge-faults "$0" && exec "$@"'


def can_mount(folder) -> str | None:
    """Why a private tmpfs cannot be mounted here (not root, no mount namespaces), or None."""
    probe = folder / "probe"
    probe.mkdir()
    try:
        done = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount -t tmpfs t "$0"',
                str(probe),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare is not available ({exc})"
    return None if done.returncode == 0 else f"cannot mount a private tmpfs: {done.stderr.strip()}"


@pytest.fixture
def server(tmp_path):
    why = can_mount(tmp_path)
    if why:
        pytest.skip(f"no small disk for the state directory: {why}")
    (tmp_path / ".edge").mkdir()
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT, str(tmp_path / ".edge"))
    with DevServer(write_project(tmp_path), cwd=tmp_path, prefix=prefix) as srv:
        srv.folder = Path(f"/proc/{srv.proc.pid}/root{tmp_path}")  # the runtime's view: its tmpfs
        srv.state = srv.folder / ".edge"
        yield srv


def fill(folder: str) -> None:
    with open(f"{folder}/filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def deploy(server, body):
    files = {"worker.py": OTHER_WORKER.replace("other ok", body)}
    return api(
        server.url, server.folder, "PUT", "/workers/scripts/other", json={"main": "worker.py", "files": files}
    )


def secret(server, value):
    body = {"name": "TOKEN", "text": value, "type": "secret_text"}
    return api(server.url, server.folder, "PUT", "/workers/scripts/faults/secrets", json=body)


def other(server) -> str:
    return httpx.get(server.url + "/", headers={"x-edge-worker": "local/other"}, timeout=60).text


def test_writes_to_a_full_disk_fail_clearly_and_serving_continues(server):
    assert deploy(server, "v1").status_code == 200 and secret(server, "old").status_code == 200
    assert httpx.get(server.url + "/kv/first", timeout=60).text == "stored" and other(server) == "v1"
    fill(server.state)
    for r in (deploy(server, "v2"), secret(server, "new" * 20_000)):
        assert r.status_code == 503, r.text
        [error] = r.json()["errors"]
        assert error["code"] == 1125 and "full" in error["message"], error
    r = httpx.get(server.url + "/kv/" + "k" * 200, timeout=60)
    assert r.status_code == 503 and "KV store" in r.text and "full" in r.text, r.text

    assert other(server) == "v1" and httpx.get(server.url + "/", timeout=60).text == "ok"
    listed = api(server.url, server.folder, "GET", "/workers/scripts/other/versions")
    assert listed.status_code == 200 and len(listed.json()["result"]["items"]) == 1
    for db in ("state.db", "kv.sqlite"):
        assert integrity(f"{server.state}/{db}") == "ok"

    subprocess.run(["rm", f"{server.state}/filler"], check=True)
    assert deploy(server, "v3").status_code == 200 and other(server) == "v3"
