"""The control plane against a real `edge dev` and a real `edge pop serve`: every /cdn-cgi/edge/
endpoint that changes or reveals state needs the admin token, the open ones (health, metrics)
name no worker, control bodies are capped, no /client/v4/ or /cdn-cgi/ path ever reaches a worker
(with the caller's API token), and a remote PoP node obeys only its node token."""

import asyncio
import os
import stat
import subprocess
import sys
import textwrap
import time

import httpx
import msgspec
import pytest

from tests.integration.dev_server import REPO, DevServer, free_port

pytestmark = pytest.mark.slow

# A worker that shows what reached it: anything answered by the runtime lacks x-from-worker.
ECHO = """
import os
from workers import WorkerEntrypoint, Response

class Default(WorkerEntrypoint):
    async def fetch(self, request):
        if "/peek?" in request.url:  # try to read the admin token: its file, the environment
            path = request.url.split("?path=", 1)[1].replace("%2F", "/")
            try:
                found = open(path).read()
            except OSError as exc:
                found = type(exc).__name__
            env = {k: v for k, v in os.environ.items() if "TOKEN" in k}
            return Response.json({"file": found, "env": env})
        return Response.json(
            {"url": request.url, "authorization": request.headers.get("authorization")},
            headers={"x-from-worker": "1"},
        )
"""
WORKER = "echo-secretname"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    d = tmp_path_factory.mktemp("control")
    (d / "worker.py").write_text(textwrap.dedent(ECHO))
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "{WORKER}"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge]
        pops = ["ICN", "FRA"]
        models_dir = "{REPO / "models"}"
    """)
    )
    env = os.environ.pop("EDGE_ADMIN_TOKEN", None)  # edge dev must make and save its own
    try:
        with DevServer(d / "wrangler-like.toml", cwd=d) as srv:
            srv.dir = d
            srv.token = (d / ".edge" / "api-token").read_text().strip()
            srv.admin = (d / ".edge" / "admin-token").read_text().strip()
            yield srv
    finally:
        if env is not None:
            os.environ["EDGE_ADMIN_TOKEN"] = env


def test_a_worker_cannot_read_the_admin_token(project):
    r = httpx.get(
        project.url + "/peek", params={"path": str(project.dir / ".edge" / "admin-token")}, timeout=30
    )
    assert r.status_code == 200 and project.admin not in r.text, r.text
    assert r.json()["env"] == {} and r.json()["file"] in ("PermissionError", "FileNotFoundError")


def bearer(token):
    return {"authorization": f"Bearer {token}"}


def pop_up(project, code):
    pops = httpx.get(project.url + "/cdn-cgi/edge/health", timeout=10).json()["pops"]
    return {p["code"]: p["up"] for p in pops}[code]


def assert_admin_refused(r, status):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == 1124
    assert ".edge/admin-token" in error["message"] and "EDGE_ADMIN_TOKEN" in error["message"]


def test_the_admin_token_is_made_private_saved_and_printed_once(project):
    edge = project.dir / ".edge"
    assert stat.S_IMODE(edge.stat().st_mode) == 0o700
    assert stat.S_IMODE((edge / "admin-token").stat().st_mode) == 0o600
    assert project.admin.startswith("edgeadm_") and project.admin != project.token
    assert project.log.read_text().count(project.admin) == 1


@pytest.mark.parametrize("who", ["nobody", "api token", "wrong", "not bearer"])
def test_taking_a_pop_down_needs_the_admin_token(project, who):
    headers = {
        "nobody": {},
        "api token": bearer(project.token),
        "wrong": bearer(project.admin[:-1] + "x"),
        "not bearer": {"authorization": project.admin},
    }[who]
    r = httpx.post(project.url + "/cdn-cgi/edge/pops/ICN/down", headers=headers, timeout=30)
    assert_admin_refused(r, 403 if who in ("api token", "wrong") else 401)
    assert pop_up(project, "ICN")  # it stayed up
    r = httpx.post(project.url + "/cdn-cgi/edge/pops/ICN/up", headers=headers, timeout=30)
    assert r.status_code in (401, 403)


def test_the_admin_takes_a_pop_down_and_brings_it_up(project):
    r = httpx.post(project.url + "/cdn-cgi/edge/pops/ICN/down", headers=bearer(project.admin), timeout=30)
    try:
        assert r.status_code == 200 and r.json()["up"] is False
        assert not pop_up(project, "ICN")
    finally:
        r = httpx.post(project.url + "/cdn-cgi/edge/pops/ICN/up", headers=bearer(project.admin), timeout=30)
    assert r.status_code == 200 and pop_up(project, "ICN")


def test_pop_internals_need_the_admin_token(project):
    assert_admin_refused(httpx.get(project.url + "/cdn-cgi/edge/pops", timeout=30), 401)
    assert_admin_refused(
        httpx.get(project.url + "/cdn-cgi/edge/pops", headers=bearer(project.token), timeout=30), 403
    )
    r = httpx.get(project.url + "/cdn-cgi/edge/pops", headers=bearer(project.admin), timeout=30)
    assert r.status_code == 200 and {p["code"] for p in r.json()["pops"]} == {"ICN", "FRA"}


def test_model_reload_needs_the_admin_token_and_a_small_body(project):
    url = project.url + "/cdn-cgi/edge/models/reload"
    big = b'{"model": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    assert_admin_refused(httpx.post(url, content=big, timeout=60), 401)  # refused unread
    assert_admin_refused(httpx.post(url, json={"model": "@edge/moonshotai/kimi-k2-mini"}, timeout=60), 401)
    r = httpx.post(url, content=big, headers=bearer(project.admin), timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == 1113
    # the admin reaches the handler (an unknown name changes nothing) and the server keeps serving
    r = httpx.post(url, json={"model": "no-such-model"}, headers=bearer(project.admin), timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == 1120
    assert httpx.get(project.url + "/cdn-cgi/edge/health", timeout=10).status_code == 200
    assert httpx.get(project.url + "/", timeout=30).headers.get("x-from-worker") == "1"


def test_a_megabyte_body_to_a_pop_endpoint_is_refused_and_the_pop_stays_up(project):
    r = httpx.post(
        project.url + "/cdn-cgi/edge/pops/ICN/down",
        content=b"x" * (1024 * 1024 + 1),
        headers=bearer(project.admin),
        timeout=60,
    )
    assert r.status_code == 413 and pop_up(project, "ICN")


def test_health_and_metrics_stay_open_without_worker_names(project):
    httpx.get(project.url + "/", timeout=30)  # one request, so there is a worker series to hide
    health = httpx.get(project.url + "/cdn-cgi/edge/health", timeout=10)
    assert health.status_code == 200 and set(health.json()) == {"status", "worker", "pops", "models"}
    assert health.json()["worker"] == WORKER  # the dev worker's name only, as before
    open_view = httpx.get(project.url + "/cdn-cgi/edge/metrics", timeout=10)
    assert open_view.status_code == 200
    assert "edge_requests_total" in open_view.text
    assert "worker=" not in open_view.text and WORKER not in open_view.text
    for token in ("nope", project.token):  # a wrong token is the open view, not an error
        text = httpx.get(project.url + "/cdn-cgi/edge/metrics", headers=bearer(token), timeout=10).text
        assert WORKER not in text
    admin_view = httpx.get(project.url + "/cdn-cgi/edge/metrics", headers=bearer(project.admin), timeout=10)
    assert f'edge_worker_requests_total{{outcome="ok",worker="{WORKER}"}}' in admin_view.text


CF_404 = [
    ("GET", "/client/v4/anything"),
    ("GET", "/client/v4"),
    ("DELETE", "/client/v4/accounts/local/workers/scripts/x/versions/y"),
    ("PROPFIND", "/client/v4/accounts/local"),
]
CF_405 = [
    ("GET", "/client/v4/accounts/local/ai/v1/chat/completions", "POST"),
    ("GET", "/client/v4/accounts/local/ai/run/@edge/moonshotai/kimi-k2-mini", "POST"),
    ("POST", "/client/v4/accounts/local/ai/models/search", "GET"),
]
CDN_404 = [("GET", "/cdn-cgi/anything"), ("POST", "/cdn-cgi/edge/nothing"), ("GET", "/cdn-cgi")]
CDN_405 = [
    ("GET", "/cdn-cgi/edge/pops/ICN/down", "POST"),
    ("GET", "/cdn-cgi/edge/models/reload", "POST"),
    ("POST", "/cdn-cgi/edge/health", "GET"),
]


def never_the_worker(project, method, path):
    r = httpx.request(method, project.url + path, headers=bearer(project.token), timeout=30)
    assert "x-from-worker" not in r.headers and project.token not in r.text, (path, r.text)
    return r


def test_the_echo_worker_shows_what_reaches_it(project):
    r = httpx.get(project.url + "/client/v5/x", headers=bearer(project.token), timeout=30)
    assert r.headers["x-from-worker"] == "1" and r.json()["authorization"] == f"Bearer {project.token}"


def test_embeddings_are_answered_by_the_api_in_openais_shape(project):
    # a body naming no embedding model; the OpenAI API says so itself (the worker never sees the call)
    r = never_the_worker(project, "POST", "/client/v4/accounts/local/ai/v1/embeddings")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(("method", "path"), CF_404)
def test_an_api_path_nothing_serves_is_a_cloudflare_404(project, method, path):
    r = never_the_worker(project, method, path)
    assert r.status_code == 404
    body = r.json()
    assert body["success"] is False and body["result"] is None and body["messages"] == []
    assert body["errors"][0]["code"] == 7000


@pytest.mark.parametrize(("method", "path", "allow"), CF_405)
def test_an_api_path_with_another_method_is_a_cloudflare_405(project, method, path, allow):
    r = never_the_worker(project, method, path)
    assert r.status_code == 405 and allow in r.headers["allow"]
    assert r.json()["success"] is False and r.json()["errors"][0]["code"] == 7001


@pytest.mark.parametrize(("method", "path"), CDN_404)
def test_a_cdn_cgi_path_nothing_serves_is_answered_by_the_runtime(project, method, path):
    r = never_the_worker(project, method, path)
    assert r.status_code == 404 and r.json()["error"]["code"] == 1120


@pytest.mark.parametrize(("method", "path", "allow"), CDN_405)
def test_a_cdn_cgi_path_with_another_method_is_a_405(project, method, path, allow):
    r = never_the_worker(project, method, path)
    assert r.status_code == 405 and allow in r.headers["allow"] and r.json()["error"]["code"] == 1120
    assert pop_up(project, "ICN")


def test_existing_api_routes_still_work(project):
    r = httpx.get(
        project.url + "/client/v4/accounts/local/ai/models/search", headers=bearer(project.token), timeout=30
    )
    assert r.status_code == 200 and r.json()["success"] is True


def test_the_cli_sends_the_admin_token_and_says_where_to_find_it(project):
    def pop(*args, env=None):
        return subprocess.run(
            [sys.executable, "-m", "runtime.cli", "pop", *args, "--url", project.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=project.dir,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        )

    listed = pop("list")
    assert listed.returncode == 0 and "ICN up" in listed.stdout, listed.stderr
    wrong = pop("down", "ICN", env={"EDGE_ADMIN_TOKEN": "wrong"})
    assert wrong.returncode == 2 and "admin-token" in wrong.stderr and pop_up(project, "ICN")
    elsewhere = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "pop", "list", "--url", project.url, "--config", "nope.toml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=project.dir,
        env={k: v for k, v in os.environ.items() if k != "EDGE_ADMIN_TOKEN"} | {"PYTHONPATH": str(REPO)},
    )
    assert elsewhere.returncode == 2 and "EDGE_ADMIN_TOKEN" in elsewhere.stderr


# --- a remote PoP node --------------------------------------------------------------------------------


def test_pop_serve_refuses_to_start_without_a_node_token(project):
    env = {k: v for k, v in os.environ.items() if k != "EDGE_NODE_TOKEN"} | {"PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "pop", "serve", "--name", "FRA", "--port", str(free_port()),
         "--config", str(project.dir / "wrangler-like.toml")],
        capture_output=True, text=True, timeout=60, check=False, cwd=project.dir, env=env,
    )  # fmt: skip
    assert r.returncode == 2 and "EDGE_NODE_TOKEN" in r.stderr


@pytest.fixture(scope="module")
def node(project):
    port, token = free_port(), "node-" + os.urandom(16).hex()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "pop", "serve", "--name", "FRA", "--port", str(port),
         "--config", str(project.dir / "wrangler-like.toml"), "--log-level", "warning"],
        cwd=project.dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "EDGE_NODE_TOKEN": token},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                pytest.fail(f"edge pop serve exited with {proc.returncode}:\n{proc.stdout.read()}")
            try:
                if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url, token
    finally:
        proc.kill()
        proc.wait(timeout=20)


def node_health(url, token=None):
    r = httpx.get(url + "/v1/health", headers=bearer(token) if token else {}, timeout=10)
    assert r.status_code == 200
    return msgspec.msgpack.decode(r.content)


def test_a_remote_node_obeys_only_its_node_token(node):
    url, token = node
    assert node_health(url) == {"up": True}  # open liveness, nothing about models or load
    for headers, status in (({}, 401), (bearer("wrong"), 403), (bearer(token[:-1]), 403)):
        for action in ("down", "up"):
            assert httpx.post(f"{url}/v1/{action}", headers=headers, timeout=10).status_code == status
        assert (
            httpx.post(f"{url}/v1/generate", content=b"\x80", headers=headers, timeout=10).status_code
            == status
        )
        assert node_health(url)["up"] is True
    r = httpx.post(f"{url}/v1/down", content=b"x" * (1024 * 1024 + 1), headers=bearer(token), timeout=30)
    assert r.status_code == 413 and node_health(url)["up"] is True
    r = httpx.post(f"{url}/v1/generate", content=b"x" * (9 * 1024 * 1024), headers=bearer(token), timeout=30)
    assert r.status_code == 413
    assert httpx.post(f"{url}/v1/shutdown", headers=bearer(token), timeout=10).status_code == 404
    assert "models" in node_health(url, token)
    assert httpx.post(f"{url}/v1/down", headers=bearer(token), timeout=10).status_code == 200
    try:
        assert node_health(url)["up"] is False
    finally:
        assert httpx.post(f"{url}/v1/up", headers=bearer(token), timeout=10).status_code == 200
    assert node_health(url)["up"] is True


def test_the_runtimes_remote_node_sends_the_node_token(node, monkeypatch):
    from edge_sim.errors import EdgeError
    from edge_sim.remote import RemotePopNode
    from edge_sim.topology import Topology

    url, token = node
    pop = Topology.default().pop("FRA")

    async def check():
        monkeypatch.delenv("EDGE_NODE_TOKEN", raising=False)
        monkeypatch.setenv("EDGE_NODE_TOKEN_FRA", "wrong")
        stranger = RemotePopNode(pop, url)
        assert await stranger.refresh() is False and not stranger.up and stranger.models() == []
        with pytest.raises(EdgeError, match="node token"):
            await stranger.take_down()
        await stranger._client.aclose()
        monkeypatch.setenv("EDGE_NODE_TOKEN_FRA", token)
        trusted = RemotePopNode(pop, url)
        assert await trusted.refresh() is True and trusted.up and trusted.models()
        assert await trusted.take_down() == 0 and not trusted.up
        await trusted.bring_up()
        assert trusted.up
        await trusted._client.aclose()

    asyncio.run(check())
