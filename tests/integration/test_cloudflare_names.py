"""Against a real `edge dev`: a script written for Cloudflare (its SDK names, pyodide.ffi, its
model names) runs unmodified, and the REST API serves and lists Cloudflare's model names."""

import textwrap

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow
ALIAS, STAND_IN = "@cf/moonshotai/kimi-k2.6", "@edge/moonshotai/kimi-k2-mini"

WORKER = """
from pyodide.ffi import to_js
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        inputs = to_js({"messages": [{"role": "user", "content": "def"}], "max_completion_tokens": 3})
        answer = await self.env.AI.run("@cf/moonshotai/kimi-k2.6", inputs)
        return Response.json({"answer": answer, "colo": request.cf.colo})
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("cf-names")
    (d / "worker.py").write_text(textwrap.dedent(WORKER))
    (d / "wrangler.jsonc").write_text(
        textwrap.dedent(f"""
        {{
          "name": "cf",
          "main": "worker.py",
          "compatibility_date": "2026-11-01",
          "ai": {{"binding": "AI"}},
          // ours: two PoPs and one model keep the test quick
          "edge": {{"pops": ["ICN", "GRU"], "models": ["{STAND_IN}"], "models_dir": "{REPO / "models"}"}},
        }}
    """)
    )
    with DevServer(d / "wrangler.jsonc", cwd=d) as srv:
        srv.token = (d / ".edge" / "api-token").read_text().strip()
        yield srv


def test_a_cloudflare_script_calls_a_cloudflare_model_name(server):
    res = httpx.get(server.url + "/", headers={"x-edge-client-location": "São Paulo".encode()}, timeout=120)
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["colo"] == "GRU"
    answer = body["answer"]
    assert answer["model"] == ALIAS and answer["object"] == "chat.completion"
    assert answer["served_by"]["model"] == STAND_IN and answer["served_by"]["stand_in"] is True
    assert answer["usage"]["completion_tokens"] <= 3


def test_the_rest_api_runs_and_lists_the_aliases(server):
    auth = {"authorization": f"Bearer {server.token}"}
    base = f"{server.url}/client/v4/accounts/local/ai"
    run = httpx.post(
        f"{base}/run/{ALIAS}", json={"prompt": "def", "max_tokens": 2}, headers=auth, timeout=120
    )
    assert run.status_code == 200, run.text
    assert run.json()["result"]["served_by"]["model"] == STAND_IN
    found = httpx.get(
        f"{base}/models/search", params={"search": "kimi-k2.6"}, headers=auth, timeout=30
    ).json()
    (entry,) = found["result"]
    assert entry["name"] == ALIAS and entry["served_by"]["model"] == STAND_IN and entry["served"] is True
    assert entry["source"].startswith("https://") and found["result_info"]["total_count"] == 1


def test_a_cloudflare_name_the_catalog_does_not_alias_is_served_by_the_stand_in(server):
    auth = {"authorization": f"Bearer {server.token}"}
    base = f"{server.url}/client/v4/accounts/local/ai"
    run = httpx.post(
        f"{base}/run/@cf/openai/gpt-oss-120b",
        json={"prompt": "def", "max_tokens": 2},
        headers=auth,
        timeout=120,
    )
    assert run.status_code == 200, run.text
    assert run.json()["result"]["served_by"]["model"] == STAND_IN  # the only model this edge serves
    typo = httpx.post(f"{base}/run/@cf/openai/gpt-oss-12b", json={"prompt": "def"}, headers=auth, timeout=30)
    assert typo.status_code == 400 and typo.json()["errors"][0]["code"] == 5007
    assert "nearest: @cf/openai/gpt-oss-120b" in typo.json()["errors"][0]["message"]
    assert "is not shipped here" in server.log.read_text()  # edge dev's log names the stand-in once
