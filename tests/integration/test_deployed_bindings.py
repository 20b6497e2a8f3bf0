"""A deployed version gets its bindings as the dev worker does (runtime.host.registry builds both
specs by one loop over runtime.bindings.kinds): a real `edge dev`, `edge deploy` of a second
worker with KV, a queue producer and a Durable Object, then requests to the deployed version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

# the dev worker: consumes the queue the deployed worker produces to, recording each message in KV
DEV = """
    from workers import Response, WorkerEntrypoint


    class Default(WorkerEntrypoint):
        async def fetch(self, request):
            return Response("dev")

        async def queue(self, batch):
            for message in batch.messages:
                await self.env.SEEN.put("got:" + message.body["name"], "1")
                message.ack()
"""

DEPLOYED = """
    from urllib.parse import parse_qs, urlsplit

    from workers import DurableObject, Response, WorkerEntrypoint


    class Counter(DurableObject):
        async def increment(self):
            n = ((await self.ctx.storage.get("n")) or 0) + 1
            await self.ctx.storage.put("n", n)
            return n


    class Default(WorkerEntrypoint):
        async def fetch(self, request):
            url = urlsplit(request.url)
            name = parse_qs(url.query).get("name", ["x"])[0]
            if url.path == "/inc":
                stub = self.env.COUNTER.get(self.env.COUNTER.idFromName(name))
                return Response(str(await stub.increment()))
            if url.path == "/send":
                await self.env.JOBS.send({"name": name})
                return Response("queued")
            if url.path == "/seen":
                return Response(str(await self.env.SEEN.get("got:" + name)))
            return Response("not found", status=404)
"""


def edge_deploy(project, url: str, token: str) -> subprocess.CompletedProcess:
    """`edge deploy --url URL` in `project`, as the account of `token`."""
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", "deploy", "--url", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=project,
        env={**os.environ, "EDGE_API_TOKEN": token, "PYTHONPATH": str(REPO)},
    )


def test_a_deployed_version_has_its_queue_producer_and_durable_object(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "worker.py").write_text(textwrap.dedent(DEV))
    dev_config = {
        "name": "consumer",
        "main": "worker.py",
        "compatibility_date": "2026-11-01",
        "kv_namespaces": [{"binding": "SEEN", "id": "seen"}],
        "queues": {"consumers": [{"queue": "jobs", "max_batch_size": 1, "max_batch_timeout": 0.1}]},
    }
    (tmp_path / "dev" / "wrangler.json").write_text(json.dumps(dev_config))
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "worker.py").write_text(textwrap.dedent(DEPLOYED))
    app_config = {
        "name": "store",
        "main": "worker.py",
        "compatibility_date": "2026-11-01",
        "kv_namespaces": [{"binding": "SEEN", "id": "seen"}],
        "queues": {"producers": [{"binding": "JOBS", "queue": "jobs"}]},
        "durable_objects": {"bindings": [{"name": "COUNTER", "class_name": "Counter"}]},
        "migrations": [{"tag": "v1", "new_sqlite_classes": ["Counter"]}],
    }
    (tmp_path / "app" / "wrangler.json").write_text(json.dumps(app_config))

    with DevServer(tmp_path / "dev" / "wrangler.json", cwd=tmp_path / "dev") as dev:
        token = (tmp_path / "dev" / ".edge" / "api-token").read_text().strip()
        deploy = edge_deploy(tmp_path / "app", dev.url, token)
        assert deploy.returncode == 0, deploy.stderr
        assert "not deployed" not in deploy.stderr  # producers and Durable Objects are

        def get(path: str, name: str) -> httpx.Response:
            headers = {"x-edge-worker": "local/store"}
            return httpx.get(f"{dev.url}{path}", params={"name": name}, headers=headers, timeout=60)

        assert [get("/inc", "a").text for _ in range(3)] == ["1", "2", "3"]
        assert get("/inc", "b").text == "1"
        sent = get("/send", "m1")
        assert sent.status_code == 200 and sent.text == "queued", sent.text
        deadline = time.monotonic() + 30
        while get("/seen", "m1").text != "1" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert get("/seen", "m1").text == "1"  # delivered to the dev worker's consumer


SEARCHER = """
    from workers import Response, WorkerEntrypoint


    class Default(WorkerEntrypoint):
        async def fetch(self, request):
            if request.url.endswith("/add"):
                item = await self.env.NOTES.items.uploadAndPoll("owl.md", "The owl hunts at dusk.")
                return Response(item.status)
            found = await self.env.KB.get("notes").search({"query": "owl dusk"})
            return Response(found.chunks[0].item.key if found.chunks else "none")
"""


def test_a_deployed_version_has_its_ai_search_bindings(tmp_path):
    """[[ai_search]] and [[ai_search_namespaces]] travel in the deploy upload (source_dir does not:
    a deployed version reads no folder of the deployer's), and reach the deploying account's
    instances."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "worker.py").write_text(textwrap.dedent(DEV))
    dev_config = {"name": "dev", "main": "worker.py", "compatibility_date": "2026-11-01"}
    (tmp_path / "dev" / "wrangler.json").write_text(json.dumps(dev_config))
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "worker.py").write_text(textwrap.dedent(SEARCHER))
    app_config = {
        "name": "searcher",
        "main": "worker.py",
        "compatibility_date": "2026-11-01",
        "ai_search": [{"binding": "NOTES", "instance_name": "notes"}],
        "ai_search_namespaces": [{"binding": "KB", "namespace": "default"}],
    }
    (tmp_path / "app" / "wrangler.json").write_text(json.dumps(app_config))
    with DevServer(tmp_path / "dev" / "wrangler.json", cwd=tmp_path / "dev") as dev:
        token = (tmp_path / "dev" / ".edge" / "api-token").read_text().strip()
        made = httpx.post(
            f"{dev.url}/client/v4/accounts/local/ai-search/namespaces/default/instances",
            json={"id": "notes"},
            headers={"authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert made.status_code == 200, made.text
        deploy = edge_deploy(tmp_path / "app", dev.url, token)
        assert deploy.returncode == 0, deploy.stderr
        headers = {"x-edge-worker": "local/searcher"}
        added = httpx.get(f"{dev.url}/add", headers=headers, timeout=60)
        assert added.status_code == 200 and added.text == "completed", added.text
        assert httpx.get(f"{dev.url}/find", headers=headers, timeout=60).text == "owl.md"
