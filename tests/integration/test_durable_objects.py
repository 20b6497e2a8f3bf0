"""Durable Objects through a real `edge dev`: a counter object bound with durable_objects.bindings
and declared in migrations, reached by RPC and by stub.fetch, two ids independent, its storage
surviving a restart of edge dev."""

from __future__ import annotations

import json
import stat
import textwrap

import httpx
import pytest

from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

WORKER = """
from workers import DurableObject, Response, WorkerEntrypoint


class Counter(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)

    async def increment(self, by=1):
        n = (await self.ctx.storage.get("n")) or 0
        await self.ctx.storage.put("n", n + by)
        return n + by

    async def fetch(self, request):
        n = (await self.ctx.storage.get("n")) or 0
        return Response.json({"n": n, "id": str(self.ctx.id), "url": request.url})


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        parts = request.url.split("?")[0].split("/")
        action, name = parts[3], parts[4]
        stub = self.env.COUNTER.get(self.env.COUNTER.idFromName(name))
        if action == "inc":
            return Response(str(await stub.increment(2)))
        if action == "peek":
            return await stub.fetch("https://counter/peek")
        return Response("?", status=404)
"""

CONFIG = {
    "name": "do-app",
    "main": "worker.py",
    "compatibility_date": "2025-01-01",
    "durable_objects": {"bindings": [{"name": "COUNTER", "class_name": "Counter"}]},
    "migrations": [
        {"tag": "v1", "new_sqlite_classes": ["Counter"]},
        {"tag": "v2", "renamed_classes": [{"from": "Old", "to": "Older"}], "deleted_classes": ["Older"]},
    ],
}


def test_a_counter_survives_a_restart_and_two_ids_are_independent(tmp_path):
    (tmp_path / "worker.py").write_text(textwrap.dedent(WORKER))
    config = tmp_path / "wrangler.jsonc"
    config.write_text("// a Durable Object app\n" + json.dumps(CONFIG, indent=2))

    with DevServer(config, cwd=tmp_path) as dev:
        assert [httpx.get(f"{dev.url}/inc/a", timeout=60).text for _ in range(3)] == ["2", "4", "6"]
        assert httpx.get(f"{dev.url}/inc/b", timeout=60).text == "2"
        peek = httpx.get(f"{dev.url}/peek/a", timeout=60)
        assert peek.status_code == 200, peek.text
        body = peek.json()
        assert body["n"] == 6 and len(body["id"]) == 64 and body["url"] == "https://counter/peek"
    log = dev.log.read_text()
    assert "not simulated" not in log

    with DevServer(config, cwd=tmp_path) as dev:  # a fresh edge dev: the storage is on disk
        assert httpx.get(f"{dev.url}/inc/a", timeout=60).text == "8"
        assert httpx.get(f"{dev.url}/inc/b", timeout=60).text == "4"

    files = list((tmp_path / ".edge" / "do").rglob("*.sqlite"))
    assert len(files) == 2 and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert all(f.parent.name == "Counter" and f.parent.parent.name == "do-app" for f in files)
