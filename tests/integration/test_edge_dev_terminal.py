"""What `edge dev` says in its terminal when something is wrong (issue 57): a worker that does not
load after a save, and a port another process holds. Each runs `edge dev` as a real process and
reads its stdout and stderr, as the user in front of it does."""

import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow


def _wait_for(srv: DevServer, text: str, timeout: float = 20.0) -> str:
    """edge dev's terminal so far, once it shows `text`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = srv.log.read_text()
        if text in seen:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"edge dev never printed {text!r}:\n{srv.log.read_text()}")


def test_a_worker_that_stops_loading_on_a_save_says_why_in_the_terminal_and_when_it_loads_again(tmp_path):
    # issue 57, item 2: the terminal said `reloaded hello`, then a bare 503; only the HTTP body
    # named the SyntaxError
    subprocess.run([sys.executable, "-m", "runtime.cli", "init", "hello"], cwd=tmp_path, check=True)
    folder = tmp_path / "hello"
    worker = folder / "worker.py"
    good = worker.read_text()
    assert good.splitlines()[4] == "    async def fetch(self, request):"  # line 5, broken below
    with DevServer(folder / "wrangler.jsonc", cwd=folder, args=("--log-level", "info")) as srv:
        assert httpx.get(srv.url + "/", timeout=30).status_code == 200
        worker.write_text(good.replace("fetch(self, request):", "fetch(self, request:"))
        seen = _wait_for(srv, "SyntaxError")  # printed when saved, before any request
        said = seen[seen.index("SyntaxError") - 300 :]
        assert f'File "{worker}", line 5' in said, said  # the file as the user knows it
        assert "'(' was never closed" in said and "fetch(self, request:" in said, said
        assert httpx.get(srv.url + "/", timeout=30).status_code == 503
        worker.write_text(good)
        seen = _wait_for(srv, "loads again")
        assert httpx.get(srv.url + "/", timeout=30).status_code == 200
    assert seen.count("worker.py failed to load") == 1, seen  # once, not again for the request's 503


def test_a_busy_port_is_refused_before_any_model_loads_naming_its_holder(tmp_path):
    # issue 57, item 4: a second edge dev loaded the models for ~10 s, then died with `address
    # already in use` and `terminate called without an active exception` (exit 134)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "runtime.cli", "dev", "--config", str(REPO / "wrangler-like.toml")]
            + ["--port", str(port)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert f"127.0.0.1:{port} is already in use" in out, out
    assert f"pid {os.getpid()}" in out, out  # the holder, found through /proc
    assert re.search(r"run edge dev with --port \d+", out), out  # what to do instead
    assert "GPU PoP" not in out and "terminate called" not in out, out  # no model was loaded
    assert took < 15, took  # the check comes before the runtime is even imported
