"""The Workers platform around a worker, against a real `edge dev`: accounts and tokens, the Workers
AI REST and OpenAI-compatible APIs, deploys with versions, rollback and gradual splits, secrets,
service bindings, limits enforced by the OS, tail and metrics."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow
MODEL = "@edge/moonshotai/kimi-k2-mini"

APP = """
import logging
from workers import WorkerEntrypoint, Response, fetch

class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = request.url.split("/", 3)[-1].split("?")[0]
        query = {}
        if "?" in request.url:
            query = dict(p.split("=", 1) for p in request.url.split("?", 1)[1].split("&"))
        if path == "":
            return Response.json({"greeting": self.env.GREETING, "has_secret": "API_KEY" in self.env,
                                  "secret_len": len(self.env.API_KEY) if "API_KEY" in self.env else 0})
        if path == "spin":
            while True:
                pass
        if path == "bomb":
            hoard = [bytearray(50 * 1024 * 1024) for _ in range(40)]
            return Response(str(len(hoard)))
        if path == "boom":
            raise ValueError("deliberate")
        if path == "log":
            print("printed", request.method)
            logging.getLogger("app").error("logged")
            return Response("logged")
        if path == "fetch":
            try:
                r = await fetch(query["url"].replace("%2F", "/").replace("%3A", ":"))
                return Response(f"{r.status}:{await r.text()}")
            except Exception as exc:
                return Response(f"refused:{exc}", status=502)
        if path == "svc":
            r = await self.env.HELPER.fetch("https://helper/hello")
            return Response(await r.text())
        if path == "peek":
            try:
                return Response(open(query["path"].replace("%2F", "/")).read()[:20])
            except OSError as exc:
                return Response(type(exc).__name__, status=403)
        return Response("not found", status=404)
"""

HELPER_V1 = """
from workers import Response

async def on_fetch(request, env):
    return Response("helper v1")
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    d = tmp_path_factory.mktemp("platform")
    (d / "app").mkdir()
    (d / "app" / "worker.py").write_text(textwrap.dedent(APP))
    (d / "app" / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "app"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [ai]
        binding = "AI"
        [vars]
        GREETING = "hi"
        [[services]]
        binding = "HELPER"
        service = "helper"
        [limits]
        cpu_ms = 400
        memory_mb = 96
        [edge]
        pops = ["ICN", "FRA"]
        models_dir = "{REPO / "models"}"
    """)
    )
    (d / "helper").mkdir()
    (d / "helper" / "worker.py").write_text(textwrap.dedent(HELPER_V1))
    (d / "helper" / "wrangler-like.toml").write_text(
        textwrap.dedent("""
        name = "helper"
        main = "worker.py"
        compatibility_date = "2026-11-01"
    """)
    )
    with DevServer(d / "app" / "wrangler-like.toml", cwd=d / "app") as srv:
        srv.token = (d / "app" / ".edge" / "api-token").read_text().strip()
        srv.dir = d
        yield srv


def cli(project, *args, stdin=None, cwd=None):
    env = {**os.environ, "EDGE_API_TOKEN": project.token, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args, "--url", project.url],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd or project.dir / "app",
        env=env,
    )


def api(project, method, path, token=None, headers=None, **kw):
    auth = {"authorization": f"Bearer {token or project.token}"} if token != "" else {}
    url = f"{project.url}/client/v4/accounts/local{path}"
    return httpx.request(method, url, headers={**auth, **(headers or {})}, timeout=120, **kw)


# --- tokens and the AI APIs --------------------------------------------------------------------------


def test_every_api_call_needs_the_right_token(project):
    assert api(project, "POST", f"/ai/run/{MODEL}", token="", json={"prompt": "x"}).status_code == 401
    bad = api(project, "POST", f"/ai/run/{MODEL}", token="edge_nope", json={"prompt": "x"})
    assert bad.status_code == 401 and bad.json()["errors"][0]["code"] == 10000
    other = httpx.post(
        f"{project.url}/client/v4/accounts/someone-else/ai/run/{MODEL}",
        headers={"authorization": f"Bearer {project.token}"},
        json={"prompt": "x"},
        timeout=30,
    )
    assert other.status_code == 403 and "another account" in other.json()["errors"][0]["message"]
    assert api(project, "GET", "/workers/scripts/app/versions", token="").status_code == 401


def test_workers_ai_rest_api(project):
    r = api(
        project,
        "POST",
        f"/ai/run/{MODEL}",
        json={"prompt": "def f():", "max_tokens": 4},
        headers={"x-edge-client-location": "Paris"},
    )
    body = r.json()
    assert r.status_code == 200 and body["success"] and body["errors"] == []
    assert body["result"]["usage"]["completion_tokens"] == 4 and body["result"]["timing"]["pop"] == "FRA"
    assert "server-timing" in r.headers
    bad = api(project, "POST", f"/ai/run/{MODEL}", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["code"] == 5004
    missing = api(project, "POST", "/ai/run/@edge/none", json={"prompt": "x"})
    assert missing.json()["errors"][0]["code"] == 5007
    with httpx.stream(
        "POST",
        f"{project.url}/client/v4/accounts/local/ai/run/{MODEL}",
        headers={"authorization": f"Bearer {project.token}"},
        json={"prompt": "import os", "max_tokens": 3, "stream": True},
        timeout=60,
    ) as s:
        text = s.read().decode()
    assert text.strip().endswith("data: [DONE]") and '"usage"' in text
    search = api(project, "GET", "/ai/models/search").json()["result"]
    entry = next(m for m in search if m["name"] == MODEL)
    assert entry["quantization"]["kv_cache"] == "auto" and entry["quantization"]["weights"] == "bf16"
    assert entry["properties"][0]["value"] == "4096" and entry["quality"]


def test_the_official_openai_client_works(project):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{project.url}/client/v4/accounts/local/ai/v1", api_key=project.token)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
    )
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 5
    pieces = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            temperature=0,
            stream=True,
        )
        if c.choices
    ]
    assert "".join(pieces) == chat.choices[0].message.content
    completion = client.completions.create(model=MODEL, prompt="def fib(n):", max_tokens=4, temperature=0)
    assert completion.choices[0].text and completion.usage.completion_tokens == 4
    assert MODEL in [m.id for m in client.models.list()]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="@edge/none", messages=[{"role": "user", "content": "x"}])


# --- deploys, versions, service bindings ----------------------------------------------------------------


def test_deploy_versions_rollback_and_gradual_splits(project):
    helper = project.dir / "helper"
    first = cli(project, "deploy", "--config", "wrangler-like.toml", "-m", "first", cwd=helper)
    assert first.returncode == 0, first.stderr
    r = httpx.get(project.url + "/", headers={"x-edge-worker": "local/helper"}, timeout=30)
    assert r.text == "helper v1"
    assert httpx.get(project.url + "/svc", timeout=30).text == "helper v1"  # the app's service binding

    (helper / "worker.py").write_text(HELPER_V1.replace("v1", "v2"))
    assert cli(project, "deploy", "-m", "second", cwd=helper).returncode == 0
    assert httpx.get(project.url + "/svc", timeout=30).text == "helper v2"
    versions = [line.split()[0] for line in cli(project, "versions", "list", cwd=helper).stdout.splitlines()]
    assert len(versions) == 2
    v2, v1 = versions

    # a script that fails to import never replaces the active version
    (helper / "worker.py").write_text("def broken(:\n")
    bad = cli(project, "deploy", cwd=helper)
    assert bad.returncode == 2 and "SyntaxError" in bad.stderr and "unchanged" in bad.stderr
    assert httpx.get(project.url + "/svc", timeout=30).text == "helper v2"

    assert "rolled back helper to version " + v1 in cli(project, "rollback", cwd=helper).stdout
    assert httpx.get(project.url + "/svc", timeout=30).text == "helper v1"

    split = cli(project, "versions", "deploy", f"{v1}@50", f"{v2}@50", cwd=helper)
    assert split.returncode == 0, split.stderr
    seen = {}
    for key in ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"):
        answers = {
            httpx.get(
                project.url + "/",
                headers={"x-edge-worker": "local/helper", "cloudflare-workers-version-key": key},
                timeout=30,
            ).text
            for _ in range(3)
        }
        assert len(answers) == 1  # sticky per key
        seen[key] = answers.pop()
    assert set(seen.values()) == {"helper v1", "helper v2"}  # and both versions serve
    deployments = cli(project, "deployments", "list", cwd=helper).stdout.splitlines()
    assert len(deployments) == 4 and "@50%" in deployments[0]
    assert cli(project, "versions", "deploy", f"{v1}@60", f"{v2}@30", cwd=helper).returncode == 2


# --- secrets, limits, isolation ------------------------------------------------------------------------


def test_secrets_reach_the_env_and_nothing_else(project):
    put = cli(project, "secret", "put", "API_KEY", stdin="s3cret-value\n")
    assert put.returncode == 0, put.stderr
    assert httpx.get(project.url + "/", timeout=30).json() == {
        "greeting": "hi",
        "has_secret": True,
        "secret_len": 12,
    }
    assert cli(project, "secret", "list").stdout.split() == ["API_KEY"]
    listing = api(project, "GET", "/workers/scripts/app/secrets").text
    assert "s3cret" not in listing
    assert "s3cret" not in (project.log.read_text())


def test_limits_are_enforced_and_other_requests_carry_on(project):
    spin = httpx.get(project.url + "/spin", timeout=60)
    assert spin.status_code == 500 and spin.json()["error"]["code"] == 1102
    bomb = httpx.get(project.url + "/bomb", timeout=60)
    assert bomb.status_code == 500 and bomb.json()["error"]["code"] == 1102
    boom = httpx.get(project.url + "/boom", timeout=60)
    assert boom.json()["error"] == {"code": 1101, "message": "Worker threw exception: ValueError: deliberate"}
    assert httpx.get(project.url + "/", timeout=30).json()["greeting"] == "hi"


def test_a_worker_cannot_read_other_workers_files_or_the_database(project):
    scripts = project.dir / "app" / ".edge" / "scripts"
    other = next(scripts.glob("*/worker.py"))
    for path in (
        other,
        project.dir / "app" / ".edge" / "state.db",
        project.dir / "app" / ".edge" / "api-token",
    ):
        r = httpx.get(project.url + "/peek", params={"path": str(path)}, timeout=30)
        assert (r.status_code, r.text) == (403, "FileNotFoundError"), path  # not in the jail's view


def test_fetch_goes_through_the_runtime_with_its_rules(project):
    own = f"{project.url}/client/v4/accounts/local/workers/scripts/app/versions"
    r = httpx.get(project.url + "/fetch", params={"url": own}, timeout=30)
    assert r.status_code == 502 and "control API" in r.text
    r = httpx.get(project.url + "/fetch", params={"url": "http://x.other.edge.localhost:1/"}, timeout=30)
    assert "another account" in r.text
    ok = httpx.get(project.url + "/fetch", params={"url": project.url + "/cdn-cgi/edge/health"}, timeout=30)
    assert ok.status_code == 502  # /cdn-cgi is the runtime's too


def test_tail_streams_outcomes_and_logs_and_metrics_count_them(project):
    events = []

    def listen():
        with httpx.stream(
            "GET",
            f"{project.url}/client/v4/accounts/local/workers/scripts/app/tail",
            headers={"authorization": f"Bearer {project.token}"},
            timeout=30,
        ) as r:
            for line in r.iter_lines():
                if line.strip():
                    events.append(json.loads(line))
                if len(events) >= 3:
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    for _ in range(50):
        if events:
            break
        time.sleep(0.1)
    httpx.get(project.url + "/log", timeout=30)
    httpx.get(project.url + "/boom", timeout=30)
    thread.join(timeout=30)
    log_event, boom_event = events[1], events[2]
    assert log_event["outcome"] == "ok" and [x["message"] for x in log_event["logs"]] == [
        "printed GET",
        "logged",
    ]
    assert boom_event["outcome"] == "exception" and boom_event["exceptions"][0]["name"] == "ValueError"
    admin = os.environ.get("EDGE_ADMIN_TOKEN") or (project.dir / "app" / ".edge" / "admin-token").read_text()
    metrics = httpx.get(
        project.url + "/cdn-cgi/edge/metrics",
        headers={"authorization": f"Bearer {admin.strip()}"},
        timeout=30,
    ).text
    assert 'edge_worker_requests_total{outcome="exception",worker="app"}' in metrics
    assert 'edge_ai_tokens_total{kind="completion",model="@edge/moonshotai/kimi-k2-mini"}' in metrics


def test_edge_dev_reloads_the_worker_when_its_source_changes(project):
    worker = project.dir / "app" / "worker.py"
    original = worker.read_text()
    try:
        worker.write_text(original.replace('"greeting": self.env.GREETING', '"greeting": "reloaded"'))
        for _ in range(60):
            if httpx.get(project.url + "/", timeout=30).json()["greeting"] == "reloaded":
                break
            time.sleep(0.25)
        assert httpx.get(project.url + "/", timeout=30).json()["greeting"] == "reloaded"
    finally:
        worker.write_text(original)
