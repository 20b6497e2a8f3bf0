"""Workflows through a real `edge dev` started from a folder holding only a worker and its
wrangler.jsonc: dependent and concurrent steps, retries, NonRetryableError, sleep, wait_for_event
with send_event, the admin API behind `edge workflows`, and a restart of edge dev while an
instance sleeps (it completes, and its finished step does not run again)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

WORKER = '''
import json
from workers import Response, WorkerEntrypoint, WorkflowEntrypoint
from workers.workflows import NonRetryableError


class Pipeline(WorkflowEntrypoint):
    async def run(self, event, step):
        @step.do("fetch a")
        async def fetch_a():
            return event.payload["a"]

        @step.do("fetch b")
        async def fetch_b():
            return event.payload["b"]

        @step.do("sum", depends=[fetch_a, fetch_b], concurrent=True)
        async def total(fetch_a, fetch_b):
            return fetch_a + fetch_b

        @step.do("double", depends=[total])
        async def double(result):
            return result * 2

        return {"sum": await total(), "double": await double(), "id": event.instance_id}


class Flaky(WorkflowEntrypoint):
    async def run(self, event, step):
        @step.do("flaky", config={"retries": {"limit": 3, "delay": 10, "backoff": "constant"}})
        async def flaky():
            n = int(await self.env.KV.get("tries:" + event.instance_id) or 0) + 1
            await self.env.KV.put("tries:" + event.instance_id, str(n))
            if n < 3:
                raise ValueError(f"try {n} fails")
            return n

        @step.do("refuse")
        async def refuse():
            if event.payload.get("refuse"):
                raise NonRetryableError("no, never")
            return "fine"

        return {"tries": await flaky(), "refuse": await refuse()}


class Sleeper(WorkflowEntrypoint):
    async def run(self, event, step):
        @step.do("count")
        async def count():
            log = (await self.env.KV.get("log:" + event.instance_id)) or ""
            await self.env.KV.put("log:" + event.instance_id, log + "ran;")
            return len(log) // 4 + 1

        first = await count()
        await step.sleep("nap", event.payload.get("nap", "1 second"))
        approval = await step.wait_for_event("approval", "approve", timeout="1 hour")
        return {"count": first, "approved_by": approval["payload"]["by"]}


class Hang(WorkflowEntrypoint):
    async def run(self, event, step):
        @step.do("spin", config={"retries": {"limit": 1, "delay": 10}, "timeout": "1 second"})
        async def spin():
            while True:
                pass

        return await spin()


class Idle(WorkflowEntrypoint):
    async def run(self, event, step):
        await step.wait_for_event("never", "nothing", timeout="1 hour")


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        body = json.loads(await request.text() or "{}")
        flow = getattr(self.env, body.get("binding", "PIPELINE"))
        op = body["op"]
        try:
            if op == "create":
                instance = await flow.create(id=body.get("id"), params=body.get("params"))
                return Response.json({"id": instance.id})
            if op == "batch":
                made = await flow.create_batch(body["batch"])
                return Response.json({"ids": [i.id for i in made]})
            instance = await flow.get(body["id"])
            if op == "status":
                return Response.json(dict(await instance.status()))
            if op == "event":
                await instance.send_event(type=body["type"], payload=body.get("payload"))
            elif op in ("pause", "resume", "terminate", "restart"):
                await getattr(instance, op)()
            elif op == "log":
                return Response.json({"log": await self.env.KV.get("log:" + body["id"])})
            return Response.json({"ok": True})
        except Exception as exc:
            return Response.json({"error": f"{type(exc).__name__}: {exc}"}, status=400)
'''

CONFIG = {
    "name": "flows",
    "main": "worker.py",
    "compatibility_date": "2025-11-01",
    "kv_namespaces": [{"binding": "KV", "id": "flows-kv"}],
    "workflows": [
        {"name": "pipeline", "binding": "PIPELINE", "class_name": "Pipeline"},
        {"name": "flaky", "binding": "FLAKY", "class_name": "Flaky"},
        {"name": "sleeper", "binding": "SLEEPER", "class_name": "Sleeper"},
        {"name": "hang", "binding": "HANG", "class_name": "Hang"},
        {"name": "idle", "binding": "IDLE", "class_name": "Idle"},
    ],
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flows")
    (folder / "worker.py").write_text(WORKER)
    (folder / "wrangler.jsonc").write_text("// a workflow project\n" + json.dumps(CONFIG, indent=2))
    return folder


@pytest.fixture(scope="module")
def server(project):
    with DevServer(project / "wrangler.jsonc", cwd=project) as srv:
        yield srv


def op(server, **body):
    r = httpx.post(server.url + "/", json=body, timeout=30)
    return r.json()


def wait_status(server, binding, ident, want, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        status = op(server, op="status", binding=binding, id=ident)
        if status.get("status") in want or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def test_dependent_and_concurrent_steps_complete_with_their_output(server):
    made = op(server, op="create", id="p-1", params={"a": 2, "b": 5})
    assert made == {"id": "p-1"}
    status = wait_status(server, "PIPELINE", "p-1", {"complete", "errored"})
    assert status == {"status": "complete", "output": {"sum": 7, "double": 14, "id": "p-1"}, "error": None}
    generated = op(server, op="create", params={"a": 1, "b": 1})["id"]
    assert len(generated) >= 32 and generated != "p-1"
    again = op(server, op="create", id="p-1", params={"a": 0, "b": 0})
    assert "already exists" in again["error"]


def test_failed_steps_are_retried_and_a_non_retryable_error_errors_the_instance(server):
    op(server, op="create", binding="FLAKY", id="f-1", params={})
    op(server, op="create", binding="FLAKY", id="f-2", params={"refuse": True})
    done = wait_status(server, "FLAKY", "f-1", {"complete", "errored"})
    assert done["status"] == "complete" and done["output"] == {"tries": 3, "refuse": "fine"}
    refused = wait_status(server, "FLAKY", "f-2", {"complete", "errored"})
    assert refused["status"] == "errored"
    assert refused["error"]["name"] == "NonRetryableError" and "no, never" in refused["error"]["message"]
