"""One account cannot stall another through the pools every account shares (runtime.control.fair_pool),
tried as an attacker would, through a real `edge dev`: the dev worker's account ("local") floods the
binding pool with long D1 scripts on eight databases, or the embedding threads with the largest
calls it may make, while a second account's deployed worker reads KV, queries D1, checks its rate
limit and embeds one word. Then edge dev is stopped during a flood, and what was acknowledged
before is read back after a restart.

Timings are printed (`-s`), never asserted: what is asserted is order, which on the old shared
pool came out the other way (the other account's calls answered only after a flood call ended)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

DATABASES = 8
WORKER = """
    from urllib.parse import parse_qs, urlsplit

    from workers import Response, WorkerEntrypoint

    SLOW = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows}) "
        "SELECT count(*) FROM c;"
    )
    BGE = "@cf/baai/bge-base-en-v1.5"
    TEXT = " ".join(f"w{i}q{i * 7919 % 9973}z" for i in range(2600))[:32000]


    class Default(WorkerEntrypoint):
        async def fetch(self, request):
            url = urlsplit(request.url)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == "/flood":
                statement = SLOW.format(rows=int(q.get("rows", 1000000)))
                await getattr(self.env, "DB" + q["db"]).exec(statement * int(q["statements"]))
                return Response("flooded")
            if url.path == "/embed-flood":
                await self.env.AI.run(BGE, {"text": [TEXT + str(i) for i in range(60)]})  # 1.9 MB
                return Response("embedded")
            if url.path == "/kv":
                await self.env.KV.put("k", q["v"])
                return Response(await self.env.KV.get("k"))
            if url.path == "/kv-read":
                return Response(str(await self.env.KV.get("k")))
            if url.path == "/d1":
                await self.env.DB0.exec("CREATE TABLE IF NOT EXISTS t (v TEXT)")
                await self.env.DB0.prepare("INSERT INTO t VALUES (?)").bind(q["v"]).run()
                return Response(str(await self.env.DB0.prepare("SELECT count(*) AS n FROM t").first("n")))
            if url.path == "/rl":
                outcome = await self.env.LIMITER.limit({"key": "k"})
                return Response(str(outcome.success))
            if url.path == "/embed":
                out = await self.env.AI.run(BGE, {"text": "hello"})
                return Response(str(len(out["data"][0])))
            return Response("not found", status=404)
"""


def config(name: str) -> dict:
    return {
        "name": name,
        "main": "worker.py",
        "compatibility_date": "2026-11-01",
        "ai": {"binding": "AI"},
        "kv_namespaces": [{"binding": "KV", "id": "kv"}],
        "d1_databases": [
            {"binding": f"DB{i}", "database_name": f"db{i}", "database_id": f"db{i}"}
            for i in range(DATABASES)
        ],
        "ratelimits": [{"name": "LIMITER", "namespace_id": "1001", "simple": {"limit": 1000, "period": 60}}],
        "edge": {"pops": []},
    }


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    d = tmp_path_factory.mktemp("floods")
    (d / "worker.py").write_text(textwrap.dedent(WORKER))
    (d / "wrangler.json").write_text(json.dumps(config("flooder")))
    (d / "victim").mkdir()
    (d / "victim" / "worker.py").write_text(textwrap.dedent(WORKER))
    victim = config("victim")
    del victim["edge"]
    victim["account_id"] = "victim"
    (d / "victim" / "wrangler.json").write_text(json.dumps(victim))
    return d


def edge(cwd, *args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


@pytest.fixture(scope="module")
def server(project):
    admin = os.environ.pop("EDGE_ADMIN_TOKEN", None)  # the CLI must find edge dev's own
    try:
        with DevServer(project / "wrangler.json", cwd=project) as srv:
            made = edge(project, "accounts", "create", "victim", "--url", srv.url)
            assert made.returncode == 0, made.stderr
            token = made.stdout.strip()
            deployed = edge(project / "victim", "deploy", "--url", srv.url, env={"EDGE_API_TOKEN": token})
            assert deployed.returncode == 0, deployed.stderr
            yield srv
    finally:
        if admin is not None:
            os.environ["EDGE_ADMIN_TOKEN"] = admin


class Flood:
    """`paths` requested at once, each in a thread of its own; `ended` records when each answered."""

    def __init__(self, url: str, paths: list[str]):
        self.ended: list[float] = []
        self.statuses: list[int] = []
        self.threads = [threading.Thread(target=self._get, args=(url + p,), daemon=True) for p in paths]

    def _get(self, url: str) -> None:
        try:
            status = httpx.get(url, timeout=300).status_code
        except httpx.HTTPError:
            status = 0
        self.ended.append(time.monotonic())
        self.statuses.append(status)

    def start(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def join(self) -> None:
        for t in self.threads:
            t.join(300)


def victim_calls(url: str, paths: list[str], rounds: int) -> tuple[list[float], float]:
    """The other account's calls, one after another: their latencies and when the last answered."""
    latencies = []
    with httpx.Client(headers={"x-edge-worker": "victim/victim"}, timeout=300) as client:
        for i in range(rounds):
            for path in paths:
                started = time.monotonic()
                r = client.get(f"{url}{path}?v={i}")
                assert r.status_code == 200, r.text
                latencies.append(time.monotonic() - started)
    return latencies, time.monotonic()


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, math.ceil(len(values) * 0.99) - 1)]


def test_another_accounts_storage_answers_during_a_storage_flood(server):
    flood = Flood(server.url, [f"/flood?db={i}&statements=12" for i in range(DATABASES)]).start()
    time.sleep(1.0)  # the flood's calls hold the pool
    latencies, done = victim_calls(server.url, ["/kv", "/d1", "/rl"], rounds=5)
    own_started = time.monotonic()
    own = httpx.get(f"{server.url}/kv?v=own", timeout=300)  # the flooding account's own KV
    own_done = time.monotonic()
    flood.join()
    print(
        f"\nstorage flood: the other account's {len(latencies)} calls p50 "
        f"{sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms, p99 {p99(latencies) * 1000:.0f} ms; "
        f"the flooder's own KV {1000 * (own_done - own_started):.0f} ms; "
        f"flood calls ended {min(flood.ended) - own_started:+.1f} .. {max(flood.ended) - own_started:+.1f} s"
    )
    assert flood.statuses == [200] * DATABASES  # the flood was served too, only not first
    assert own.status_code == 200 and own.text == "own"
    assert done < min(flood.ended)  # every call of the other account answered before any flood call
    assert own_done < max(flood.ended)  # and the flooder's own KV within its flood, not after it


def test_another_accounts_embedding_answers_during_an_embedding_flood(server):
    flood = Flood(server.url, ["/embed-flood"] * 4).start()
    time.sleep(1.0)
    latencies, done = victim_calls(server.url, ["/embed"], rounds=5)
    flood.join()
    print(
        f"\nembedding flood: the other account's one-word embeddings p99 {p99(latencies) * 1000:.0f} ms; "
        f"flood calls ended {min(flood.ended) - done:+.1f} .. {max(flood.ended) - done:+.1f} s after them"
    )
    assert flood.statuses == [200] * 4
    assert done < min(flood.ended)


def test_edge_dev_stops_during_a_flood_and_keeps_what_it_acknowledged(project, tmp_path):
    d = tmp_path / "stop"
    d.mkdir()
    (d / "worker.py").write_text((project / "worker.py").read_text())
    (d / "wrangler.json").write_text(json.dumps(config("stopper")))
    srv = DevServer(d / "wrangler.json", cwd=d)
    try:
        srv.wait_ready()
        for i in range(3):  # acknowledged before the flood
            assert httpx.get(f"{srv.url}/d1?v={i}", timeout=60).text == str(i + 1)
        assert httpx.get(f"{srv.url}/kv?v=kept", timeout=60).text == "kept"
        # many short statements, each far under the 5 s a statement may take: minutes of work a call
        floods = Flood(srv.url, [f"/flood?db={i}&statements=1500&rows=100000" for i in range(1, DATABASES)])
        floods.threads += Flood(srv.url, ["/embed-flood"] * 2).threads
        floods.start()
        time.sleep(2.0)
        assert not floods.ended  # the pools are busy with the flood when the signal comes
        stopped = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        try:  # a liveness bound, not a timing: the old shared pool kept edge dev up for minutes
            srv.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"edge dev still running 60 s after SIGTERM:\n{srv.log.read_text()[-3000:]}")
        print(
            f"\nedge dev exited {time.monotonic() - stopped:.1f} s after SIGTERM during a storage "
            "and embedding flood"
        )
    finally:
        srv.stop()
    with DevServer(d / "wrangler.json", cwd=d) as again:
        assert httpx.get(f"{again.url}/d1?v=after", timeout=60).text == "4"  # the three before, and this
        assert httpx.get(f"{again.url}/kv-read", timeout=60).text == "kept"
