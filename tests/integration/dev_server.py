"""Starts `edge dev` as a real subprocess on a free loopback port, for integration tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DevServer:
    def __init__(
        self,
        config: Path,
        cwd: Path = REPO,
        prefix: tuple[str, ...] = (),
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
    ):
        """`prefix`: a command the runtime runs under (tests/faults uses `unshare` to give it a
        small disk of its own); `args`: more `edge dev` arguments; `env`: more environment;
        `port`: a given one (a restart on the same URL), else a free one."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (
            cwd / f".edge-dev-{self.port}.log" if cwd != REPO else Path(f"/tmp/edge-dev-{self.port}.log")
        )
        self._log_file = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "runtime.cli",
                "dev",
                "--config",
                str(config),
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                *args,
            ],
            cwd=cwd,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge dev exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/cdn-cgi/edge/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"edge dev did not become ready:\n{self.log.read_text()}")

    def create_account(self, admin_token: str, name: str = "other") -> str:
        """A second tenant, made as an operator makes one (POST /cdn-cgi/edge/accounts): its API token."""
        made = httpx.post(
            f"{self.url}/cdn-cgi/edge/accounts",
            headers={"authorization": f"Bearer {admin_token}"},
            json={"name": name},
            timeout=30,
        )
        made.raise_for_status()
        return made.json()["token"]["token"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log_file.close()

    def __enter__(self) -> DevServer:
        try:
            self.wait_ready()
        except Exception:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
