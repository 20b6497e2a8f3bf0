"""The runtime's state killed (SIGKILL) in the middle of deploys and secret writes: after each
kill the database passes `PRAGMA integrity_check`, every deployment names versions that are wholly
there (each file exactly as uploaded), and every secret reads back whole, old value or new."""

import hashlib
import os
import signal
import subprocess
import sys
import time

from runtime.control.state import State

WRITER = r"""
import hashlib, itertools, sys
from runtime.control.state import State

state = State(sys.argv[1])
for i in itertools.count():
    body = (f"# version {i}\n" + "x = 1\n" * 40_000)
    files = {"worker.py": body, "sum": hashlib.sha256(body.encode()).hexdigest()}
    version = state.add_version("local", "w", "worker.py", files, {"vars": {}}, f"v{i}")
    state.deploy("local", "w", [(version, 100)], f"v{i}")
    state.put_secret("local", "w", "TOKEN", f"secret-{i}-" + "s" * 1000)
    print(i, flush=True)
"""
KILLS = 4


def test_a_kill_mid_deploy_or_mid_secret_write_leaves_whole_versions(tmp_path):
    db = tmp_path / "state" / "state.db"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for kill in range(KILLS):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, env=env)
        for _ in range(2 + kill):  # let it write a few, then kill it wherever it is
            assert proc.stdout.readline(), "the writer stopped by itself"
        time.sleep(0.01 * kill)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()

        state = State(db)
        try:
            assert state.query("PRAGMA integrity_check") == [("ok",)]
            deployments = state.deployments("local", "w")
            assert deployments, "no deployment survived"
            for d in deployments:
                for v in d["versions"]:
                    version = state.version("local", "w", v["version_id"])
                    assert version is not None, f"deployment {d['id']} names a missing version"
                    body = version["files"]["worker.py"]
                    assert hashlib.sha256(body.encode()).hexdigest() == version["files"]["sum"]
            assert state.secrets("local", "w")["TOKEN"].startswith("secret-")
        finally:
            state.close()
