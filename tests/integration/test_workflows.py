"""Workflows through a real `edge dev` started from a folder holding only a worker and its
wrangler.jsonc: dependent and concurrent steps, retries, NonRetryableError, sleep, wait_for_event
with send_event, the admin API behind `edge workflows`, and a restart of edge dev while an
instance sleeps (it completes, and its finished step does not run again)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

WORKER = """
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
        retries = 0 if event.payload == "beside" else 1

        @step.do("spin", config={"retries": {"limit": retries, "delay": 10}, "timeout": "300 milliseconds"})
        async def spin():
            while True:
                pass

        @step.do("quick")
        async def quick():
            return 1

        if event.payload == "beside":  # a quick step finishing beside the hung one does not hide it

            @step.do("both", depends=[quick, spin], concurrent=True)
            async def both(quick, spin):
                return quick

            return await both()
        return await spin()


class Big(WorkflowEntrypoint):
    async def run(self, event, step):
        @step.do("big")
        async def big():
            return "x" * (1536 * 1024)

        return await big()


class Broken(WorkflowEntrypoint):
    async def run(self, event, step):
        if event.payload == "config":

            @step.do("odd", config={"retries": {"limit": "many"}})
            async def odd():
                return 1

            return await odd()
        if event.payload == "memory":

            @step.do("hog", config={"retries": {"limit": 0}})
            async def hog():
                return len(bytearray(900 * 2**20))  # past limits.memory_mb (128)

            return await hog()
        if event.payload == "forge":  # claims to sleep without a sleep: it would run again at once, for ever
            from workers.workflow_step import Suspend

            raise Suspend()
        return b"raw bytes"


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
            if op == "log":
                return Response.json({"log": await self.env.KV.get("log:" + body["id"])})
            instance = await flow.get(body["id"])
            if op == "status":
                return Response.json(dict(await instance.status()))
            if op == "event":
                await instance.send_event(type=body["type"], payload=body.get("payload"))
            elif op in ("pause", "resume", "terminate", "restart"):
                await getattr(instance, op)()
            return Response.json({"ok": True})
        except Exception as exc:
            return Response.json({"error": f"{type(exc).__name__}: {exc}"}, status=400)
"""

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
        {"name": "big", "binding": "BIG", "class_name": "Big"},
        {"name": "broken", "binding": "BROKEN", "class_name": "Broken"},
    ],
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flows")
    (folder / "worker.py").write_text(WORKER)
    (folder / "wrangler.jsonc").write_text("// a workflow project\n" + json.dumps(CONFIG, indent=2))
    return folder


class Served:
    """The module's one edge dev; the restart test (last) replaces it once."""

    server: DevServer


@pytest.fixture(scope="module")
def served(project):
    holder = Served()
    holder.server = DevServer(project / "wrangler.jsonc", cwd=project).__enter__()
    yield holder
    holder.server.stop()


@pytest.fixture
def server(served):
    return served.server


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


def edge(server, project, *args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args, "--url", server.url,
         "--config", str(project / "wrangler.jsonc")],
        capture_output=True, text=True, timeout=60, check=False, cwd=project, env=kw.get("env"),
    )  # fmt: skip


def test_sleep_then_wait_for_event_until_send_event(server):
    op(server, op="create", binding="SLEEPER", id="s-1", params={"nap": 300})
    op(server, op="create", binding="SLEEPER", id="s-2", params={"nap": "0 seconds"})
    op(server, op="event", binding="SLEEPER", id="s-2", type="approve", payload={"by": "early"})  # buffered
    waiting = wait_status(server, "SLEEPER", "s-1", {"waiting"})
    assert waiting["status"] == "waiting"
    time.sleep(0.6)  # past the nap: now it waits for the event
    assert op(server, op="status", binding="SLEEPER", id="s-1")["status"] == "waiting"
    op(server, op="event", binding="SLEEPER", id="s-1", type="other", payload={"by": "nobody"})  # not this
    op(server, op="event", binding="SLEEPER", id="s-1", type="approve", payload={"by": "ada"})
    done = wait_status(server, "SLEEPER", "s-1", {"complete", "errored"})
    assert done["status"] == "complete" and done["output"] == {"count": 1, "approved_by": "ada"}
    early = wait_status(server, "SLEEPER", "s-2", {"complete", "errored"})
    assert early["output"] == {"count": 1, "approved_by": "early"}
    assert op(server, op="log", id="s-1") == {"log": "ran;"}  # each step once, over three runs


def test_pause_resume_terminate_and_restart(server):
    op(server, op="create", binding="IDLE", id="i-1")
    assert wait_status(server, "IDLE", "i-1", {"waiting"})["status"] == "waiting"
    op(server, op="pause", binding="IDLE", id="i-1")
    assert op(server, op="status", binding="IDLE", id="i-1")["status"] == "paused"
    assert "paused" in op(server, op="pause", binding="IDLE", id="i-1")["error"]
    op(server, op="resume", binding="IDLE", id="i-1")
    assert wait_status(server, "IDLE", "i-1", {"waiting"})["status"] == "waiting"
    op(server, op="terminate", binding="IDLE", id="i-1")
    assert op(server, op="status", binding="IDLE", id="i-1")["status"] == "terminated"
    assert "terminated" in op(server, op="event", binding="IDLE", id="i-1", type="nothing")["error"]
    op(server, op="restart", binding="IDLE", id="i-1")
    assert wait_status(server, "IDLE", "i-1", {"waiting"})["status"] == "waiting"


def test_edge_workflows_trigger_describe_and_list(server, project):
    made = edge(
        server, project, "workflows", "trigger", "pipeline", "--params", '{"a": 20, "b": 22}', "--id", "cli-1"
    )
    assert made.returncode == 0 and "cli-1" in made.stdout, made.stderr
    wait_status(server, "PIPELINE", "cli-1", {"complete"})
    shown = edge(server, project, "workflows", "describe", "pipeline", "cli-1")
    described = json.loads(shown.stdout)
    assert described["status"] == "complete" and described["output"]["sum"] == 42
    assert [s["name"] for s in described["steps"]] == ["fetch a", "fetch b", "sum", "double"]
    assert all(s["success"] and s["attempts"] == 1 for s in described["steps"])
    assert described["created"].endswith("Z") and described["params"] == {"a": 20, "b": 22}
    listed = edge(server, project, "workflows", "list")
    assert listed.returncode == 0 and "pipeline  (Pipeline)" in listed.stdout and "complete" in listed.stdout
    missing = edge(server, project, "workflows", "trigger", "nosuch")
    assert missing.returncode != 0 and "no workflow 'nosuch'" in missing.stderr
    token = (project / ".edge" / "api-token").read_text().strip()
    url = f"{server.url}/client/v4/accounts/local/workflows/pipeline/instances"
    odd = httpx.post(
        url, json={"instance_id": "x", "parms": {}}, headers={"authorization": f"Bearer {token}"}
    )
    assert odd.status_code == 400 and "parms" in odd.json()["errors"][0]["message"]


# --- hostile ----------------------------------------------------------------------------------------


def test_a_step_that_never_returns_is_cut_retried_then_errors_while_others_are_served(server):
    op(server, op="create", binding="HANG", id="h-1")
    assert wait_status(server, "HANG", "h-1", {"running"})["status"] == "running"
    op(server, op="create", id="p-during", params={"a": 1, "b": 2})  # served meanwhile
    assert wait_status(server, "PIPELINE", "p-during", {"complete"})["output"]["sum"] == 3
    hung = wait_status(server, "HANG", "h-1", {"errored", "complete"}, timeout=60)
    assert hung["status"] == "errored"
    assert "did not finish within its timeout of 300 ms" in hung["error"]["message"]
    op(server, op="create", binding="HANG", id="h-2", params="beside")
    beside = wait_status(server, "HANG", "h-2", {"errored", "complete"}, timeout=60)
    assert beside["status"] == "errored" and "step 'spin' did not finish" in beside["error"]["message"]


def test_huge_params_and_results_are_refused_with_what_to_do(server):
    huge = op(server, op="create", id="p-huge", params={"blob": "x" * (1100 * 1024)})
    assert "params is" in huge["error"] and "the limit is 1024 KiB" in huge["error"]
    op(server, op="create", binding="BIG", id="b-1")
    big = wait_status(server, "BIG", "b-1", {"errored", "complete"})
    assert big["status"] == "errored" and "the result of step 'big'" in big["error"]["message"]
    assert "store it in KV or R2" in big["error"]["message"]


def test_a_bad_step_config_or_output_errors_the_instance_saying_what_to_change(server):
    op(server, op="create", binding="BROKEN", id="c-1", params="config")
    op(server, op="create", binding="BROKEN", id="c-2", params="output")
    config = wait_status(server, "BROKEN", "c-1", {"errored", "complete"})
    assert config["status"] == "errored" and "retries.limit is 0 to 10000" in config["error"]["message"]
    output = wait_status(server, "BROKEN", "c-2", {"errored", "complete"})
    assert output["status"] == "errored" and "must be JSON-serializable" in output["error"]["message"]
    op(server, op="create", binding="BROKEN", id="c-4", params="memory")
    hog = wait_status(server, "BROKEN", "c-4", {"errored", "complete"})
    assert hog["status"] == "errored" and "ran out of memory (limits.memory_mb)" in hog["error"]["message"]
    op(server, op="create", binding="BROKEN", id="c-3", params="forge")
    forged = wait_status(server, "BROKEN", "c-3", {"errored", "complete"})
    assert forged["status"] == "errored" and "never raise Suspend" in forged["error"]["message"]


def test_another_accounts_instance_is_not_found(server, project):
    made = edge(server, project, "accounts", "create", "intruder")
    token = made.stdout.strip()
    assert made.returncode == 0 and token, made.stderr
    headers = {"authorization": f"Bearer {token}"}
    theirs = httpx.get(
        f"{server.url}/client/v4/accounts/intruder/workflows/pipeline/instances/p-1", headers=headers
    )
    assert theirs.status_code == 404 and "instance.not_found" in theirs.text
    ours = httpx.get(
        f"{server.url}/client/v4/accounts/local/workflows/pipeline/instances/p-1", headers=headers
    )
    assert ours.status_code == 403
    # the same worker deployed to that account: its env.PIPELINE names the same workflow, and finds nothing
    assert op(server, op="status", id="p-1")["status"] == "complete"  # ours, seen by our worker
    theirs_dir = project / "intruder"
    theirs_dir.mkdir()
    (theirs_dir / "worker.py").write_text(WORKER)
    (theirs_dir / "wrangler.jsonc").write_text(json.dumps({**CONFIG, "account_id": "intruder"}))
    env = {**os.environ, "EDGE_API_TOKEN": token, "PYTHONPATH": str(REPO)}
    deployed = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "deploy", "--url", server.url,
         "--config", str(theirs_dir / "wrangler.jsonc")],
        capture_output=True, text=True, timeout=60, check=False, cwd=theirs_dir, env=env,
    )  # fmt: skip
    assert deployed.returncode == 0, deployed.stderr
    intruder = {"x-edge-worker": "intruder/flows"}
    found = httpx.post(server.url + "/", json={"op": "status", "id": "p-1"}, headers=intruder, timeout=30)
    assert "instance.not_found" in found.json()["error"]


# --- last: a restart, then the bound (it leaves the account full) ---------------------------------


def test_a_killed_edge_dev_resumes_a_sleeping_instance_and_does_not_rerun_its_finished_step(served, project):
    old = served.server
    op(old, op="create", binding="SLEEPER", id="r-1", params={"nap": "1 second"})
    assert wait_status(old, "SLEEPER", "r-1", {"waiting"})["status"] == "waiting"
    assert op(old, op="log", id="r-1") == {"log": "ran;"}
    old.proc.kill()  # no goodbye: as a crash or a power cut
    old.proc.wait()
    old._log_file.close()
    served.server = new = DevServer(project / "wrangler.jsonc", cwd=project, port=old.port).__enter__()
    assert op(new, op="status", binding="SLEEPER", id="r-1")["status"] in ("waiting", "running")  # replaying
    op(new, op="event", binding="SLEEPER", id="r-1", type="approve", payload={"by": "after restart"})
    done = wait_status(new, "SLEEPER", "r-1", {"complete", "errored"})
    assert done["status"] == "complete" and done["output"] == {"count": 1, "approved_by": "after restart"}
    assert op(new, op="log", id="r-1") == {"log": "ran;"}  # the finished step did not run again


def test_unfinished_instances_are_bounded_per_account(server):
    made = 0
    while True:
        batch = [{"id": f"bound-{made + i}"} for i in range(100)]
        result = op(server, op="batch", binding="IDLE", batch=batch)
        if "error" in result:
            break
        made += 100
        assert made <= 1000
    assert "at most 1000 may be queued, running, paused or waiting at once" in result["error"]
    held = int(re.search(r"this account has (\d+) unfinished", result["error"]).group(1))
    rest = [{"id": f"rest-{i}"} for i in range(1000 - held)]  # up to the bound exactly
    if rest:  # none when the earlier tests' instances left the account exactly at the bound
        assert "ids" in op(server, op="batch", binding="IDLE", batch=rest)
    assert "at most 1000" in op(server, op="create", binding="IDLE", id="one-more")["error"]
    assert "at most 1000" in op(server, op="create", id="p-over", params={"a": 0, "b": 0})["error"]
