"""What `edge dev` says in its terminal when something is wrong (issue 57): a worker that does not
load after a save, and a port another process holds. Each runs `edge dev` as a real process and
reads its stdout and stderr, as the user in front of it does."""

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from tests.integration.dev_server import REPO

pytestmark = pytest.mark.slow


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
