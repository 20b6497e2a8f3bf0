"""A runtime shared by two accounts: `local` serves the attacker's worker (edge dev's own), and
`victim` has a deployed worker of its own. Every hostile test tries one escape and then checks
that the victim still answers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest

from runtime.control.state import State
from tests.integration.dev_server import REPO, DevServer

ATTACKER = (Path(__file__).parent / "attacker_worker.py").read_text()

VICTIM = """
from workers import Response

async def on_fetch(request, env):
    return Response("victim ok:" + (request.headers.get("authorization") or ""))
"""


class Edge:
    """The running runtime, the attacker's worker at /<path>, and the victim beside it."""

    def __init__(self, server: DevServer, victim_token: str, folder: Path):
        self.server, self.url, self.victim_token, self.dir = server, server.url, victim_token, folder
        self.pid = server.proc.pid

    def attack(self, method: str, path: str, timeout: float = 60, **kw) -> httpx.Response:
        return httpx.request(method, f"{self.url}/{path}", timeout=timeout, **kw)

    def victim(self) -> httpx.Response:
        return httpx.get(f"{self.url}/", headers={"x-edge-worker": "victim/victim"}, timeout=60)

    def assert_victim_answers(self) -> None:
        r = self.victim()
        assert (r.status_code, r.text) == (200, "victim ok:"), r.text
        assert self.server.proc.poll() is None, "the runtime died"

    def born(self) -> str:
        return self.attack("GET", "born").text


@pytest.fixture(scope="package")
def edge(tmp_path_factory) -> Edge:
    d = tmp_path_factory.mktemp("hostile")
    (d / "attacker").mkdir()
    (d / "attacker" / "worker.py").write_text(ATTACKER)
    (d / "attacker" / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "attacker"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [limits]
        cpu_ms = 1000
        memory_mb = 96
        [edge]
        pops = ["ICN"]
        models = ["@edge/moonshotai/kimi-k2-mini"]
        models_dir = "{REPO / "models"}"
    """)
    )
    state_dir = d / "attacker" / ".edge"
    state_dir.mkdir()
    victim_token = State(state_dir / "state.db").create_token("victim")
    with DevServer(d / "attacker" / "wrangler-like.toml", cwd=d / "attacker") as server:
        r = httpx.put(
            f"{server.url}/client/v4/accounts/victim/workers/scripts/victim",
            headers={"authorization": f"Bearer {victim_token}"},
            json={"main": "worker.py", "files": {"worker.py": VICTIM}},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        edge = Edge(server, victim_token, d)
        edge.assert_victim_answers()
        yield edge
