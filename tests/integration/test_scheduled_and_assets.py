"""Scheduled handlers, handlers without a request argument, and static assets, as a user meets
them: a real `edge dev` in a temporary project (no AI binding, so no engine loads), real HTTP."""

import asyncio
import json
import os
import textwrap
import threading
import time

import httpx
import pytest

from runtime.isolate import ipc
from runtime.isolate.host import QuietHost
from runtime.isolate.process import Isolate
from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

WORKER = """
    from urllib.parse import urlsplit

    from workers import Response, WorkerEntrypoint

    RUNS = []  # the isolate's memory lasts between events: what the scheduled handler did


    class Default(WorkerEntrypoint):
        async def fetch(self, request):
            path = urlsplit(request.url).path
            if path == "/runs":
                return Response.json(RUNS)
            if path.startswith("/via-binding"):
                name = path.removeprefix("/via-binding") or "/hello.txt"
                r = await self.env.ASSETS.fetch("https://assets.local" + name)
                body = await r.text()
                return Response.json({"status": r.status, "body": body, "etag": r.headers.get("etag")})
            return Response(f"worker: {request.method} {path}")

        async def scheduled(self, controller, env, ctx):
            print(f"scheduled {controller.cron}")
            if controller.cron == "0 0 * * *":
                raise RuntimeError("the nightly job failed")

            async def record():
                await __import__("asyncio").sleep(0.05)  # waitUntil work ends before the event does
                at, kind = controller.scheduledTime, controller.type
                RUNS.append({"cron": controller.cron, "at": at, "type": kind})

            ctx.waitUntil(record())
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("sched")
    (d / "worker.py").write_text(textwrap.dedent(WORKER))
    (d / "public" / "app").mkdir(parents=True)
    (d / "public" / "index.html").write_text("<h1>spa</h1>")
    (d / "public" / "hello.txt").write_text("hello asset")
    (d / "public" / "app" / "style.css").write_text("body{}")
    (d / "secret.txt").write_text("not public")
    os.symlink(d / "secret.txt", d / "public" / "leak.txt")
    (d / "wrangler.jsonc").write_text(
        textwrap.dedent("""
        {
          "name": "sched",
          "main": "worker.py",
          "compatibility_date": "2026-11-01",
          "triggers": {"crons": ["0 0 1 1 *"]},  // never on its own during the test
          "assets": {"directory": "./public", "binding": "ASSETS",
                     "not_found_handling": "single-page-application"},
        }
    """)
    )
    with DevServer(d / "wrangler.jsonc", cwd=d) as srv:
        srv.dir = d
        srv.token = (d / ".edge" / "api-token").read_text().strip()
        yield srv


def tail(server, count: int, action) -> list[dict]:
    """The first `count` tail events after `action()` ran (edge tail's stream)."""
    events: list[dict] = []
    connected = threading.Event()

    def listen():
        with httpx.stream(
            "GET",
            f"{server.url}/client/v4/accounts/local/workers/scripts/sched/tail",
            headers={"authorization": f"Bearer {server.token}"},
            timeout=30,
        ) as r:
            for line in r.iter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "connected":
                    connected.set()
                    continue
                events.append(event)
                if len(events) >= count:
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert connected.wait(10)
    action()
    thread.join(timeout=30)
    return events


def test_the_scheduled_handler_runs_through_cdn_cgi_handler_scheduled(server):
    r = httpx.get(server.url + "/cdn-cgi/handler/scheduled?cron=*+*+*+*+*&time=1767225600000", timeout=30)
    assert (r.status_code, r.text) == (200, "Ran scheduled event")
    runs = httpx.get(server.url + "/runs", timeout=30).json()
    assert {"cron": "* * * * *", "at": 1767225600000, "type": "scheduled"} in runs  # waitUntil's too
    now = httpx.get(server.url + "/cdn-cgi/handler/scheduled", params={"cron": "*/5 * * * *"}, timeout=30)
    assert now.status_code == 200
    latest = httpx.get(server.url + "/runs", timeout=30).json()[-1]
    assert latest["cron"] == "*/5 * * * *" and abs(latest["at"] - time.time() * 1000) < 60_000


def test_scheduled_events_show_in_the_tail_with_their_outcome(server):
    def fire():
        ok = httpx.get(server.url + "/cdn-cgi/handler/scheduled", params={"cron": "*/10 * * * *"}, timeout=30)
        assert ok.status_code == 200
        failed = httpx.get(
            server.url + "/cdn-cgi/handler/scheduled", params={"cron": "0 0 * * *"}, timeout=30
        )
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error["code"] == 1101 and "RuntimeError: the nightly job failed" in error["message"]

    ok, failed = tail(server, 2, fire)
    assert ok["outcome"] == "ok" and ok["event"]["cron"] == "*/10 * * * *"
    assert isinstance(ok["event"]["scheduledTime"], int)
    assert [log["message"] for log in ok["logs"]] == ["scheduled */10 * * * *"]
    assert failed["outcome"] == "exception" and failed["event"]["cron"] == "0 0 * * *"
    assert failed["exceptions"][0]["name"] == "RuntimeError"


def test_the_scheduled_route_is_the_runtimes(server):
    r = httpx.post(server.url + "/cdn-cgi/handler/scheduled", timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    bad = httpx.get(server.url + "/cdn-cgi/handler/scheduled?time=soon", timeout=30)
    assert bad.status_code == 400


def test_assets_are_served_before_the_worker(server):
    r = httpx.get(server.url + "/hello.txt", timeout=30)
    assert r.status_code == 200 and r.text == "hello asset"
    assert r.headers["content-type"] == "text/plain; charset=utf-8" and r.headers["cf-ray"]
    etag = r.headers["etag"]
    again = httpx.get(server.url + "/hello.txt", headers={"if-none-match": etag}, timeout=30)
    assert again.status_code == 304 and again.content == b""
    assert httpx.get(server.url + "/", timeout=30).text == "<h1>spa</h1>"
    assert httpx.get(server.url + "/app/style.css", timeout=30).headers["content-type"].startswith("text/css")
    assert httpx.head(server.url + "/hello.txt", timeout=30).headers["etag"] == etag


def test_misses_and_other_methods_reach_the_worker_and_navigations_get_the_spa(server):
    assert httpx.get(server.url + "/api/users", timeout=30).text == "worker: GET /api/users"
    assert httpx.post(server.url + "/hello.txt", timeout=30).text == "worker: POST /hello.txt"
    page = httpx.get(server.url + "/settings/profile", headers={"sec-fetch-mode": "navigate"}, timeout=30)
    assert page.status_code == 200 and page.text == "<h1>spa</h1>"


def test_no_request_leaves_the_assets_folder(server):
    for path in ("/leak.txt", "/%2e%2e/secret.txt", "/..%2fsecret.txt", "/app/%2e%2e/%2e%2e/worker.py"):
        r = httpx.get(server.url + path, timeout=30)
        assert "not public" not in r.text and "RUNS" not in r.text, path
        assert r.text.startswith("worker: "), (path, r.text)  # not an asset: the worker answered


def test_env_assets_fetch_reaches_the_assets(server):
    got = httpx.get(server.url + "/via-binding", timeout=30).json()
    assert got["status"] == 200 and got["body"] == "hello asset" and got["etag"]
    missing = httpx.get(server.url + "/via-binding/nowhere", timeout=30).json()
    assert missing["status"] == 200 and missing["body"] == "<h1>spa</h1>"  # not_found_handling applies
    leak = httpx.get(server.url + "/via-binding/leak.txt", timeout=30).json()
    assert leak["status"] == 200 and leak["body"] == "<h1>spa</h1>"  # the symlink out is not served


# --- handler shapes, in a real isolate ----------------------------------------------------------


async def _no_ai(call):
    return ipc.AIReply(call.call)


def _in_isolate(tmp_path, source, fn):
    (tmp_path / "worker.py").write_text(textwrap.dedent(source))

    async def go():
        iso = Isolate("shapes", tmp_path / "worker.py", {"WHO": "env"}, None, QuietHost(ai=_no_ai))
        await iso.start()
        try:
            return iso.entry, await fn(iso)
        finally:
            await iso.stop()

    return asyncio.run(go())


def test_fetch_without_a_request_argument_and_a_scheduled_only_controller(tmp_path):
    source = """
        from workers import Response, WorkerEntrypoint
        SEEN = []

        class Default(WorkerEntrypoint):
            async def fetch(self):
                return Response(f"{self.env.WHO}: {SEEN}")

            async def scheduled(self, controller):
                SEEN.append(controller.cron)
                controller.noRetry()
    """

    async def fn(iso):
        done = await iso.schedule("*/5 * * * *", 1000)
        answer = await iso.invoke("GET", "http://x/", [], b"", {})
        return done, answer

    entry, (done, answer) = _in_isolate(tmp_path, source, fn)
    assert entry == "Default.fetch, Default.scheduled"
    assert isinstance(done, ipc.InvokeResult) and done.headers == [("no-retry", "true")]
    assert answer.body == b"env: ['*/5 * * * *']"


def test_module_level_on_scheduled_and_a_worker_without_fetch(tmp_path):
    source = """
        CALLS = []

        async def on_scheduled(controller, env, ctx):
            CALLS.append((controller.cron, controller.scheduledTime, env.WHO))
            if len(CALLS) > 1:
                raise ValueError(f"second run: {CALLS}")
    """

    async def fn(iso):
        first = await iso.schedule("0 * * * *", 42)
        second = await iso.schedule("0 * * * *", 43)
        fetched = await iso.invoke("GET", "http://x/", [], b"", {})
        return first, second, fetched

    entry, (first, second, fetched) = _in_isolate(tmp_path, source, fn)
    assert entry == "on_scheduled"
    assert isinstance(first, ipc.InvokeResult) and first.headers == []
    assert isinstance(second, ipc.InvokeError)
    assert "ValueError: second run: [('0 * * * *', 42, 'env'), ('0 * * * *', 43, 'env')]" in second.message
    assert isinstance(fetched, ipc.InvokeError) and "no fetch handler" in fetched.message


def test_a_scheduled_event_to_a_worker_without_a_scheduled_handler_says_what_to_add(tmp_path):
    source = """
        async def on_fetch(request, env, ctx):
            return None
    """
    _, result = _in_isolate(tmp_path, source, lambda iso: iso.schedule("* * * * *", 0))
    assert isinstance(result, ipc.InvokeError) and "no scheduled handler" in result.message
