"""`edge dev` as a user runs it: a real server process, real HTTP, the demo worker and the model."""

import os
import re
import textwrap

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

CLIENTS = {"Seoul": "ICN", "Paris": "FRA", "New York": "IAD"}


@pytest.fixture(scope="module")
def server():
    with DevServer(REPO / "wrangler-like.toml") as srv:
        yield srv


def admin(folder):
    """The admin token edge dev saved in `folder`/.edge (or the one the environment gives it)."""
    token = os.environ.get("EDGE_ADMIN_TOKEN") or (folder / ".edge" / "admin-token").read_text().strip()
    return {"authorization": f"Bearer {token}"}


def ask(server, body, where=None, **kw):
    headers = {"x-edge-client-location": where} if where else {}
    return httpx.post(server.url + "/", content=body, headers=headers, timeout=120, **kw)


def test_clients_on_three_continents_are_served_by_their_nearest_pop(server):
    seen = {}
    for city, pop in CLIENTS.items():
        r = ask(server, '{"prompt": "def fib(n):"}', city)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["usage"]["completion_tokens"] > 0 and isinstance(out["response"], str)
        t = out["timing"]
        assert t["pop"] == pop, (city, t)
        parts = t["client_rtt_ms"] + t["backbone_rtt_ms"] + t["queue_ms"] + t["prefill_ms"] + t["decode_ms"]
        assert t["total_ms"] == pytest.approx(parts, abs=0.01)
        assert t["prefill_ms"] > 0 and t["decode_ms"] > 0 and t["client_rtt_ms"] >= 2.0
        # The headers carry the same account, and the ray names the ingress PoP as Cloudflare's does.
        assert re.fullmatch(r"[0-9a-f]{16}-" + t["ingress"], r.headers["cf-ray"])
        assert r.headers["x-edge-quantization"].endswith("attention=bf16, kv_cache=auto")
        timing = dict(re.findall(r"([a-z-]+);dur=([0-9.]+)", r.headers["server-timing"]))
        assert float(timing["total"]) == pytest.approx(t["total_ms"], abs=0.01)
        assert float(timing["decode"]) == pytest.approx(t["decode_ms"], abs=0.01)
        seen[city] = t["pop"]
    assert len(set(seen.values())) == 3


def test_default_location_comes_from_the_config(server):
    r = ask(server, '{"prompt": "import os"}')
    assert r.status_code == 200 and r.json()["timing"]["ingress"] == "ICN"  # client_location = "Seoul"


def test_lat_lon_location(server):
    r = ask(server, '{"prompt": "x", "max_tokens": 2}', "-33.9, 18.4")  # Cape Town
    assert r.status_code == 200, r.text
    assert r.headers["cf-ray"].endswith("-CPT")


@pytest.mark.parametrize(
    "body, where, status, fragment",
    [
        ("not json", None, 400, "send a JSON body"),
        ('{"text": "no prompt"}', None, 400, '"prompt" string'),
        ('{"prompt": "x", "model": "@edge/nobody/nothing"}', None, 400, "5007: no such model"),
        ('{"prompt": "x", "max_tokens": -3}', None, 400, "5004: "),
        ('{"prompt": "x"}', "Atlantis", 400, "unknown location 'Atlantis'"),
    ],
)
def test_bad_input_gets_a_clear_error_and_the_next_request_is_served(server, body, where, status, fragment):
    r = ask(server, body, where)
    error = r.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert r.status_code == status and fragment in message, r.text
    ok = ask(server, '{"prompt": "def f():", "max_tokens": 3}', "Seoul")
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] > 0


def test_a_worker_that_raises_gets_1101_and_the_runtime_keeps_serving(tmp_path):
    (tmp_path / "worker.py").write_text(
        textwrap.dedent("""
        from workers import WorkerEntrypoint, Response

        class Default(WorkerEntrypoint):
            async def fetch(self, request):
                if request.url.endswith("/boom"):
                    raise RuntimeError("deliberate failure")
                return Response.json({"ok": True, "colo": request.cf["colo"], "greeting": self.env.GREETING})
    """)
    )
    (tmp_path / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "raiser"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [vars]
        GREETING = "hi"
        [edge]
        client_location = "Sydney"
        pops = ["SYD"]
        models_dir = "{REPO / "models"}"
    """)
    )
    with DevServer(tmp_path / "wrangler-like.toml", cwd=tmp_path) as srv:
        bad = httpx.get(srv.url + "/boom", timeout=30)
        assert bad.status_code == 500
        assert bad.json()["error"] == {
            "code": 1101,
            "message": "Worker threw exception: RuntimeError: deliberate failure",
        }
        good = httpx.get(srv.url + "/", timeout=30)
        assert good.status_code == 200 and good.json() == {"ok": True, "colo": "SYD", "greeting": "hi"}


def test_an_oversized_body_is_refused(server):
    # Send a real 101 MB body: the runtime must refuse it without handing it to the worker.
    big = b"x" * (101 * 1024 * 1024)
    r = httpx.post(server.url + "/", content=big, timeout=120)
    assert r.status_code == 413 and r.json()["error"]["code"] == 1113
    assert ask(server, '{"prompt": "x", "max_tokens": 1}').status_code == 200


def test_pop_status_exposes_engine_metrics(server):
    ask(server, '{"prompt": "def f():", "max_tokens": 4}', "Seoul")
    r = httpx.get(server.url + "/cdn-cgi/edge/pops", headers=admin(REPO), timeout=30)
    pops = {p["code"]: p for p in r.json()["pops"]}
    assert set(pops) == {"ICN", "FRA", "IAD"}
    kimi = pops["ICN"]["models"]["@edge/moonshotai/kimi-k2-mini"]
    assert kimi["kv_blocks_total"] > 0 and kimi["kv_blocks_used"] == 0  # finished requests gave blocks back
    assert kimi["generated_tokens"] > 0 and kimi["recent_steps"]
    assert all(len(layer) == 8 for layer in kimi["expert_load"]) and sum(kimi["expert_load"][0]) > 0


def test_edge_pop_down_and_up_against_a_running_edge_dev(server):
    import subprocess
    import sys

    def pop(*args):
        return subprocess.run(
            [sys.executable, "-m", "runtime.cli", "pop", *args, "--url", server.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=REPO,
        )

    assert "ICN is down" in pop("down", "ICN").stdout
    try:
        r = ask(server, '{"prompt": "x", "max_tokens": 2}', "Seoul")
        assert r.status_code == 200 and r.json()["timing"]["pop"] in ("FRA", "IAD")  # served elsewhere
        assert "ICN DOWN" in pop("list").stdout
    finally:
        assert "ICN is up" in pop("up", "ICN").stdout
    assert ask(server, '{"prompt": "x", "max_tokens": 2}', "Seoul").json()["timing"]["pop"] == "ICN"
    bad = pop("down", "XXX")
    assert bad.returncode == 2 and "ICN, FRA, IAD" in bad.stderr


def test_a_remote_pop_node_serves_like_a_local_one(tmp_path, monkeypatch):
    """`edge pop serve` runs FRA as its own server; edge dev routes Paris there over HTTP, and
    routes around it once it stops answering its health checks."""
    import subprocess
    import sys
    import time

    from tests.integration.dev_server import free_port

    port = free_port()
    monkeypatch.setenv("EDGE_NODE_TOKEN", "node-token-for-this-test")  # the node's and edge dev's
    (tmp_path / "worker.py").write_text(
        textwrap.dedent("""
        from workers import WorkerEntrypoint, Response

        class Default(WorkerEntrypoint):
            async def fetch(self, request):
                out = await self.env.AI.run(
                    "@edge/moonshotai/kimi-k2-mini", {"prompt": "def f():", "max_tokens": 3}
                )
                return Response.json(out)
    """)
    )
    (tmp_path / "topology.toml").write_text(
        textwrap.dedent(f"""
        [[pop]]
        code = "FRA"
        city = "Frankfurt"
        country = "DE"
        continent = "EU"
        lat = 50.11
        lon = 8.68
        timezone = "Europe/Berlin"
        gpus = {{ H200 = 8 }}
        url = "http://127.0.0.1:{port}"
    """)
    )
    (tmp_path / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "remote"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [ai]
        binding = "AI"
        [edge]
        pops = ["ICN", "FRA"]
        topology = "topology.toml"
        models_dir = "{REPO / "models"}"
    """)
    )
    node = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runtime.cli",
            "pop",
            "serve",
            "--name",
            "FRA",
            "--port",
            str(port),
            "--config",
            str(tmp_path / "wrangler-like.toml"),
            "--log-level",
            "warning",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    try:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        with DevServer(tmp_path / "wrangler-like.toml", cwd=tmp_path) as srv:
            r = httpx.get(srv.url + "/", headers={"x-edge-client-location": "Paris"}, timeout=60)
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["timing"]["pop"] == "FRA" and out["usage"]["completion_tokens"] == 3
            assert out["quantization"]["kv_cache"] == "auto"
            status = httpx.get(srv.url + "/cdn-cgi/edge/pops", headers=admin(tmp_path), timeout=10)
            pops = {p["code"]: p for p in status.json()["pops"]}
            assert pops["FRA"]["remote"].endswith(str(port)) and pops["FRA"]["reachable"]
            node.terminate()
            node.wait(timeout=20)
            # a health check (every 2 s) notices: wait for it rather than for a fixed 3 s
            deadline = time.monotonic() + 30
            while pops["FRA"]["reachable"] and time.monotonic() < deadline:
                time.sleep(0.2)
                status = httpx.get(srv.url + "/cdn-cgi/edge/pops", headers=admin(tmp_path), timeout=10)
                pops = {p["code"]: p for p in status.json()["pops"]}
            assert not pops["FRA"]["reachable"], "health checks never marked FRA down"
            r = httpx.get(srv.url + "/", headers={"x-edge-client-location": "Paris"}, timeout=60)
            assert r.status_code == 200 and r.json()["timing"]["pop"] == "ICN"
    finally:
        node.kill()
