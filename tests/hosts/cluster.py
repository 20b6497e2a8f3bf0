"""An edge across test hosts: `edge pop serve` for each GPU PoP inside its own network namespace
(tests/hosts/netns.py), listening on the host's own address, and `edge dev` in the root namespace
with a topology whose PoPs point at those addresses, so every generation crosses a veth link.

Each node has its own node token (edge dev gets them as EDGE_NODE_TOKEN_<CODE>). Clients call the
Workers AI REST API with `x-edge-client-location`; the answer's timing says which PoP served it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec

from edge_sim.topology import Topology
from tests.faults.project import MODEL, token, write_project
from tests.hosts.netns import Host, Hosts
from tests.integration.dev_server import REPO, DevServer

NODE_PORT = 9000
HEALTH_INTERVAL_S = 2.0  # edge_sim.remote.health_checks' default, which edge dev runs


def topology_toml(urls: dict[str, str]) -> str:
    """The shipped topology's entries for these PoPs, each with its node's URL."""
    lines = []
    for code, url in urls.items():
        pop = msgspec.to_builtins(Topology.default().pop(code)) | {"url": url, "gpus": {"H200": 8}}
        gpus = ", ".join(f"{k} = {v}" for k, v in pop.pop("gpus").items())
        fields = ", ".join(f"{k} = {json.dumps(v)}" for k, v in pop.items() if v is not None)
        lines.append(f"{{ {fields}, gpus = {{ {gpus} }} }}")
    return "pop = [\n  " + ",\n  ".join(lines) + "\n]\n"


class Cluster:
    """GPU PoPs `codes`, one per test host, and `edge dev` driving them (call close() always)."""

    def __init__(self, folder: Path, hosts: Hosts, codes: tuple[str, ...], dev_args: tuple[str, ...] = ()):
        self.folder, self.hosts = folder, hosts
        self.host = {code: hosts[i] for i, code in enumerate(codes)}
        self.tokens = {code: f"node-token-{code.lower()}-{i}" for i, code in enumerate(codes)}
        self.url = {code: f"http://{h.address}:{NODE_PORT}" for code, h in self.host.items()}
        (folder / "topology.toml").write_text(topology_toml(self.url))
        self.config = write_project(folder, pops=codes)
        text = self.config.read_text().replace("[edge]\n", '[edge]\ntopology = "topology.toml"\n')
        self.config.write_text(text)
        self.nodes: dict[str, subprocess.Popen] = {}
        self.dev: DevServer | None = None
        try:
            for code in codes:
                self.start_node(code)
            env = {f"EDGE_NODE_TOKEN_{code}": t for code, t in self.tokens.items()}
            self.dev = DevServer(self.config, cwd=folder, args=dev_args, env=env)
            self.dev.wait_ready()
            for code in codes:  # edge dev's first health checks have reached every node
                self.until_served_by(self.city(code), code)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def city(code: str) -> str:
        return Topology.default().pop(code).city

    def start_node(self, code: str) -> None:
        """`edge pop serve` as `code` inside its host; returns once it answers over the link."""
        host: Host = self.host[code]
        log = open(self.folder / f"node-{code}.log", "a")  # noqa: SIM115 - the child holds it
        argv = [sys.executable, "-m", "runtime.cli", "pop", "serve", "--name", code]
        argv += ["--host", host.address, "--port", str(NODE_PORT), "--config", str(self.config)]
        env = {"PYTHONPATH": str(REPO), "EDGE_NODE_TOKEN": self.tokens[code]}
        proc = self.hosts.popen(
            host,
            argv + ["--log-level", "warning"],
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**_base_env(), **env},
        )
        log.close()
        self.nodes[code] = proc
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"edge pop serve {code} exited:\n{self.node_log(code)}"
            try:
                if httpx.get(self.url[code] + "/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError(
            f"edge pop serve {code} did not answer at {self.url[code]}:\n{self.node_log(code)}"
        )

    def node_log(self, code: str) -> str:
        return (self.folder / f"node-{code}.log").read_text()[-3000:]

    def kill_node(self, code: str) -> None:
        self.nodes[code].kill()  # SIGKILL
        self.nodes[code].wait(timeout=30)

    def run(self, location: str, max_tokens: int = 4, **body) -> httpx.Response:
        """A Workers AI REST call from a client at `location`."""
        return httpx.post(
            f"{self.dev.url}/client/v4/accounts/local/ai/run/{MODEL}",
            # raw: a code completion, long enough to stream (a prompt alone goes through the chat template)
            json={"prompt": "def f():", "raw": True, "max_tokens": max_tokens, "temperature": 0, **body},
            headers={**token(self.folder), "x-edge-client-location": location},
            timeout=60,
        )

    def stream(self, location: str, max_tokens: int) -> httpx.Response:
        """A streamed Workers AI REST call from `location`, open (use it as a context manager)."""
        return httpx.stream(
            "POST",
            f"{self.dev.url}/client/v4/accounts/local/ai/run/{MODEL}",
            json={
                "prompt": "def f():",
                "raw": True,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            },
            headers={**token(self.folder), "x-edge-client-location": location},
            timeout=60,
        )

    def node_health(self, code: str, node_token: str | None = None) -> httpx.Response:
        """GET the node's /v1/health straight over its link, with `node_token` (default: its own)."""
        auth = {"authorization": f"Bearer {node_token or self.tokens[code]}"}
        return httpx.get(self.url[code] + "/v1/health", headers=auth, timeout=10)

    def generated_tokens(self, code: str) -> int:
        """Tokens the node has generated, by its own count."""
        status = msgspec.msgpack.decode(self.node_health(code).content)
        return sum(m["generated_tokens"] for m in status["models"].values())

    def served_by(self, location: str) -> str:
        """Which PoP answered a short call from `location` (or the error, when none did)."""
        r = self.run(location)
        if r.status_code != 200:
            return f"{r.status_code}: {r.text[:200]}"
        return r.json()["result"]["timing"]["pop"]

    def until_served_by(self, location: str, code: str, timeout: float = 30.0) -> str:
        """Ask from `location` until `code` answers (health checks run every 2 s); the last answer."""
        deadline = time.monotonic() + timeout
        while (got := self.served_by(location)) != code and time.monotonic() < deadline:
            time.sleep(0.2)
        return got

    def pops(self) -> dict[str, dict]:
        """`/cdn-cgi/edge/pops` as the runtime's health checks last saw them, by code."""
        r = httpx.get(
            self.dev.url + "/cdn-cgi/edge/pops", headers=token(self.folder, "admin-token"), timeout=10
        )
        r.raise_for_status()
        return {p["code"]: p for p in r.json()["pops"]}

    def close(self) -> None:
        if self.dev is not None:
            self.dev.stop()
        self.hosts.close()


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("EDGE_NODE_TOKEN")}
