"""KV, D1, R2 and a rate limiter through a real `edge dev`: a worker using them with Cloudflare's API
shapes, a schema applied with `edge d1 execute --file` before start, and data that survives a
restart."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

WORKER = """
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = request.url.split("/", 3)[3].split("?")[0]
        env = self.env
        if path == "write":
            await env.KV.put("greeting", "hello", metadata={"lang": "en"})
            await env.KV.put("cfg", '{"n": 1}', {"expirationTtl": 3600})
            await env.DB.prepare("INSERT INTO notes (body) VALUES (?)").bind("from the worker").run()
            put = await env.BUCKET.put(
                "docs/readme.txt", "R2 body", httpMetadata={"contentType": "text/plain"},
                customMetadata={"by": "worker"},
            )
            return Response.json({"etag": put.etag, "size": put.size})
        if path == "read":
            notes = await env.DB.prepare("SELECT id, body FROM notes ORDER BY id").all()
            count = await env.DB.prepare("SELECT count(*) AS n FROM notes").first("n")
            obj = await env.BUCKET.get("docs/readme.txt")
            listed = await env.BUCKET.list(prefix="docs/")
            with_meta = await env.KV.getWithMetadata("greeting")
            keys = await env.KV.list()
            return Response.json({
                "greeting": await env.KV.get("greeting"),
                "metadata": with_meta.metadata,
                "cfg": await env.KV.get("cfg", type="json"),
                "keys": [k["name"] for k in keys.keys],
                "notes": [dict(r) for r in notes.results],
                "rows_read": notes.meta.rows_read,
                "count": count,
                "object": await obj.text() if obj else None,
                "content_type": obj.httpMetadata.contentType if obj else None,
                "custom": dict(obj.customMetadata) if obj else None,
                "listed": [o.key for o in listed.objects],
            })
        if path == "secret":  # .dev.vars beside the config: local secrets, over vars
            return Response.json({"key": env.API_KEY, "multi": env.MULTI, "plain": env.PLAIN})
        if path == "limit":  # limit 2 per 60 s: as Cloudflare's rate limiting example calls it
            seen = []
            for _ in range(5):
                outcome = await env.LIMITER.limit({"key": "/write"})
                seen.append(outcome.success)
            other = await env.LIMITER.limit(key="another-key")
            try:
                await env.LIMITER.limit({"key": "k" * 2000})
                long_key = "accepted"
            except Exception as exc:
                long_key = str(exc)
            return Response.json({"seen": seen, "other": other["success"], "long_key": long_key})
        if path == "hostile":
            errors = {}
            for name, sql in {
                "attach": "ATTACH DATABASE '/tmp/x.db' AS x",
                "pragma": "PRAGMA writable_schema = ON",
                "missing": "SELECT * FROM nowhere",
            }.items():
                try:
                    await env.DB.prepare(sql).run()
                except Exception as exc:
                    errors[name] = str(exc)
            try:
                await env.KV.put("k" * 600, "v")
            except Exception as exc:
                errors["kv_key"] = str(exc)
            return Response.json(errors)
        return Response("not found", status=404)
"""


def cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_kv_d1_r2_from_a_worker_survive_a_restart(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "wrangler.jsonc").write_text(
        textwrap.dedent("""
        // only a worker and its wrangler.jsonc, as Cloudflare's examples are laid out
        {
          "name": "storage",
          "main": "worker.py",
          "compatibility_date": "2026-11-01",
          "kv_namespaces": [{"binding": "KV", "id": "kv-namespace-1"}],
          "d1_databases": [{"binding": "DB", "database_name": "notes-db", "database_id": "d1-database-1"}],
          "r2_buckets": [{"binding": "BUCKET", "bucket_name": "files"}],
          "ratelimits": [{"name": "LIMITER", "namespace_id": "1001", "simple": {"limit": 2, "period": 60}}],
        }
    """)
    )
    (tmp_path / "schema.sql").write_text(
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n"
        "INSERT INTO notes (body) VALUES ('seeded; by the schema');\n"
    )
    done = cli("d1", "execute", "notes-db", "--file", "schema.sql", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "2 statement(s) executed" in done.stdout

    (tmp_path / ".dev.vars").write_text(
        '# local secrets\nAPI_KEY="s3cr3t-value"\nexport MULTI="line one\nline two"\nPLAIN=bare # a comment\n'
    )
    config = tmp_path / "wrangler.jsonc"
    with DevServer(config, cwd=tmp_path) as srv:
        secret = httpx.get(srv.url + "/secret", timeout=30).json()
        assert secret == {"key": "s3cr3t-value", "multi": "line one\nline two", "plain": "bare"}
        wrote = httpx.get(srv.url + "/write", timeout=30)
        assert wrote.status_code == 200, wrote.text
        assert wrote.json()["size"] == 7
        hostile = httpx.get(srv.url + "/hostile", timeout=30).json()
        assert "not authorized" in hostile["attach"] and "not authorized" in hostile["pragma"]
        assert "no such table: nowhere" in hostile["missing"]
        assert "512" in hostile["kv_key"]
        limited = httpx.get(srv.url + "/limit", timeout=30).json()
        seen = limited["seen"]  # 5 calls span at most one window's end: never more than 2 per window
        assert seen[:2] == [True, True] and False in seen and seen.count(True) <= 4, seen
        assert limited["other"] is True  # each key counts alone
        assert "1024" in limited["long_key"]

    with DevServer(config, cwd=tmp_path) as srv:  # a fresh edge dev on the same .edge/
        read = httpx.get(srv.url + "/read", timeout=30)
        assert read.status_code == 200, read.text
        body = read.json()
    assert body == {
        "greeting": "hello",
        "metadata": {"lang": "en"},
        "cfg": {"n": 1},
        "keys": ["cfg", "greeting"],
        "notes": [{"id": 1, "body": "seeded; by the schema"}, {"id": 2, "body": "from the worker"}],
        "rows_read": 2,
        "count": 2,
        "object": "R2 body",
        "content_type": "text/plain",
        "custom": {"by": "worker"},
        "listed": ["docs/readme.txt"],
    }
    shown = cli(
        "d1", "execute", "DB", "--command", "SELECT body FROM notes ORDER BY id", "--json", cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    assert [r["body"] for r in json.loads(shown.stdout)[0]["results"]] == [
        "seeded; by the schema",
        "from the worker",
    ]
    assert all("s3cr3t-value" not in p.read_text() for p in tmp_path.glob(".edge-dev-*.log"))  # never logged
    state = tmp_path / ".edge"
    assert (state / "d1" / "local" / "d1-database-1.sqlite").is_file()
    assert not any("readme" in p.name for p in (state / "r2").rglob("*"))  # stored by hash, not by key
