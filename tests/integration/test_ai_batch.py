"""The Workers AI batch API against a real `edge dev`: queued through REST (?queueRequest=true)
and through a worker's env.AI.run, polled until done, results equal to direct greedy runs, kept
across a restart, refused to another account, a bad item refused with its index."""

import json
import textwrap
import time

import httpx
import pytest

from runtime.bench.devserver import write_project
from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow
MODEL = "@edge/moonshotai/kimi-k2-mini"
GREEDY = {"max_tokens": 4, "temperature": 0, "seed": 7}
WORKER = """
from workers import AIError, Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        body = await request.json()
        try:
            if body.get("queue"):
                out = await self.env.AI.run("@MODEL@", {"requests": body["requests"]}, {"queueRequest": True})
            else:
                out = await self.env.AI.run("@MODEL@", {"request_id": body["request_id"]})
        except AIError as exc:
            return Response.json({"error": str(exc)}, status=400)
        return Response.json(out)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch")
    write_project(d, "batch", worker=textwrap.dedent(WORKER).replace("@MODEL@", MODEL))
    return d


def start(d):
    srv = DevServer(d / "wrangler-like.toml", cwd=d)
    srv.__enter__()
    srv.token = (d / ".edge" / "api-token").read_text().strip()
    srv.admin = (d / ".edge" / "admin-token").read_text().strip()
    return srv


def run(srv, body, query="", token=None):
    return httpx.post(
        f"{srv.url}/client/v4/accounts/local/ai/run/{MODEL}{query}",
        headers={"authorization": f"Bearer {token or srv.token}"},
        json=body,
        timeout=120,
    )


def poll_until_done(srv, ident, via_worker=False, timeout=240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if via_worker:
            out = httpx.post(srv.url + "/", json={"request_id": ident}, timeout=60).json()
        else:
            out = run(srv, {"request_id": ident}).json()["result"]
        if "responses" in out:
            return out
        assert out["status"] in ("queued", "running"), out
        time.sleep(0.3)
    raise TimeoutError(f"batch {ident} not done")


def test_batch_via_rest_and_worker_matches_direct_runs_and_survives_restart(project):
    prompts = ["def fib(n):", "import os"]
    srv = start(project)
    try:
        queued = run(srv, {"requests": [{"prompt": p, **GREEDY} for p in prompts]}, "?queueRequest=true")
        assert queued.status_code == 200, queued.text
        body = queued.json()["result"]
        assert body["status"] == "queued" and body["model"] == MODEL and body["request_id"]
        done = poll_until_done(srv, body["request_id"])
        direct = [run(srv, {"prompt": p, **GREEDY}).json()["result"] for p in prompts]
        assert [r["id"] for r in done["responses"]] == [0, 1]
        for got, want in zip(done["responses"], direct, strict=True):
            assert got["success"] is True and got["result"]["response"] == want["response"]
        # a worker queues through env.AI.run and polls the same way
        r = httpx.post(
            srv.url + "/", json={"queue": True, "requests": [{"prompt": prompts[0], **GREEDY}]}, timeout=60
        )
        assert r.status_code == 200 and r.json()["status"] == "queued", r.text
        from_worker = poll_until_done(srv, r.json()["request_id"], via_worker=True)
        assert from_worker["responses"][0]["result"]["response"] == direct[0]["response"]
        # another account: the same refusal as an id that never existed
        other_token = srv.create_account(srv.admin)
        url = f"{srv.url}/client/v4/accounts/other/ai/run/{MODEL}"
        theirs = httpx.post(
            url, headers={"authorization": f"Bearer {other_token}"}, json={"request_id": body["request_id"]}
        )
        unknown = httpx.post(
            url, headers={"authorization": f"Bearer {other_token}"}, json={"request_id": "nope"}
        )
        assert theirs.status_code == unknown.status_code == 404
        assert json.dumps(theirs.json()).replace(body["request_id"], "X") == json.dumps(
            unknown.json()
        ).replace("nope", "X")
        # a bad item refuses the batch, naming its index
        bad = run(
            srv, {"requests": [{"prompt": "x"}, {"prompt": "y", "temperature": 99}]}, "?queueRequest=true"
        )
        assert bad.status_code == 400 and "requests.1" in bad.json()["errors"][0]["message"]
        unqueued = run(srv, {"requests": [{"prompt": "x"}]})
        assert unqueued.status_code == 400 and "queueRequest" in unqueued.json()["errors"][0]["message"]
    finally:
        srv.stop()
    srv = start(project)  # results are kept in the state database
    try:
        assert run(srv, {"request_id": body["request_id"]}).json()["result"] == done
    finally:
        srv.stop()
