"""A Cloudflare project run from a folder outside this repository: only worker.py and wrangler.jsonc,
no models_dir; the shipped models are found from the installation."""

import textwrap

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

MODEL = "@edge/moonshotai/kimi-k2-mini"

AI_WORKER = f"""
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        out = await self.env.AI.run("{MODEL}", {{"prompt": "def fib(n):", "max_tokens": 4}})
        return Response.json({{"out": out, "greeting": self.env.GREETING}})
"""

PLAIN_WORKER = """
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return Response("no AI here: " + str(hasattr(self.env, "AI")))
"""

# as `npm create cloudflare` would leave it (comments, trailing commas, $schema), nothing of ours
JSONC = """\
// a Python worker, unmodified
{{
  "$schema": "node_modules/wrangler/config-schema.json",
  "name": "{name}",
  "main": "worker.py",
  "compatibility_date": "2026-11-01",
  "compatibility_flags": ["python_workers"],
  /* bindings */
  {ai}
  "vars": {{"GREETING": "hi",}},
  "observability": {{"enabled": true}},
}}
"""


def project(folder, name, worker, ai):
    assert REPO not in folder.resolve().parents  # outside the repository
    (folder / "worker.py").write_text(textwrap.dedent(worker))
    (folder / "wrangler.jsonc").write_text(
        JSONC.format(name=name, ai='"ai": {"binding": "AI"},' if ai else "")
    )
    return folder / "wrangler.jsonc"


@pytest.fixture
def no_models_env(monkeypatch):
    monkeypatch.delenv("EDGE_MODELS_DIR", raising=False)
    monkeypatch.delenv("EDGE_TRUSTED_KEYS", raising=False)


def test_a_wrangler_jsonc_project_outside_the_repo_calls_the_shipped_model(tmp_path, no_models_env):
    config = project(tmp_path, "anywhere", AI_WORKER, ai=True)
    with DevServer(config, cwd=tmp_path) as srv:
        health = httpx.get(srv.url + "/cdn-cgi/edge/health", timeout=10).json()
        assert {p["code"] for p in health["pops"]} == {"ICN", "FRA", "IAD"}  # the default PoPs
        assert MODEL in health["models"]
        r = httpx.get(srv.url + "/", timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["greeting"] == "hi" and body["out"]["usage"]["completion_tokens"] > 0
        assert isinstance(body["out"]["response"], str)


def test_a_worker_without_an_ai_binding_starts_with_no_engine(tmp_path, no_models_env):
    config = project(tmp_path, "plain", PLAIN_WORKER, ai=False)
    with DevServer(config, cwd=tmp_path) as srv:
        health = httpx.get(srv.url + "/cdn-cgi/edge/health", timeout=10).json()
        assert health["pops"] == [] and health["models"] == [] and health["worker"] == "plain"
        r = httpx.get(srv.url + "/", timeout=60)
        assert r.status_code == 200 and r.text == "no AI here: False"
    assert "no GPU PoP, no engine loaded: the worker has no AI binding" in srv.log.read_text()
