"""A RAG worker (the `rag` template's) against a real `edge dev`, from a folder holding only the
worker and its wrangler.jsonc: documents embedded and upserted into Vectorize, a question whose
answer lies in one planted passage finds it first and puts it in the chat model's prompt; hostile
Vectorize calls get clear errors and lose nothing; both AI doors embed; the index survives a restart."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from runtime.cli.templates import TEMPLATES
from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow
CHAT = "@edge/zai-org/glm-4.5-mini"  # the rag template's chat model (runtime.cli.templates.READER)
EMBED = "@cf/baai/bge-base-en-v1.5"

# the template's worker, and a route of hostile calls beside it
HOSTILE = """

class Default(Default):  # noqa: F811 - the template's worker, with /hostile beside it
    async def fetch(self, request):
        if not request.url.endswith("/hostile"):
            return await super().fetch(request)
        v, out = self.env.VECTORIZE, {}
        one = [0.1] * 768
        attempts = {
            "top_k": lambda: v.query(one, {"topK": 10_000}),
            "values_top_k": lambda: v.query(one, {"topK": 50, "returnValues": True}),
            "dimension": lambda: v.query([0.1] * 384),
            "batch": lambda: v.insert([{"id": f"x{i}", "values": one} for i in range(1001)]),
            "metadata": lambda: v.upsert([{"id": "big", "values": one, "metadata": {"t": "x" * 20_000}}]),
            "long_id": lambda: v.upsert([{"id": "i" * 65, "values": one}]),
        }
        for name, attempt in attempts.items():
            try:
                await attempt()
                out[name] = "accepted"
            except Exception as exc:
                out[name] = f"{type(exc).__name__}: {exc}"
        out["count"] = (await v.describe()).vectorCount
        return Response.json(out)
"""

PASSAGES = [
    "The Grand Canal of Venice is lined with palaces built between the 13th and 18th centuries.",
    "Photosynthesis turns sunlight, water and carbon dioxide into glucose and oxygen in green leaves.",
    "The lighthouse keeper on Skerry Island feeds the resident otter, named Pemberton, each dawn.",
    "Rust's borrow checker enforces that a value has one mutable reference or many shared ones.",
    "Sourdough bread rises thanks to wild yeast and lactic acid bacteria in the starter.",
]


def cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def write_project(folder):
    (folder / "worker.py").write_text(TEMPLATES["rag"].worker + HOSTILE)
    config = {
        "name": "rag",
        "main": "worker.py",
        "compatibility_date": "2026-11-01",
        "ai": {"binding": "AI"},
        "vectorize": [{"binding": "VECTORIZE", "index_name": "docs"}],
        "edge": {"pops": ["ICN"], "models": [CHAT], "models_dir": str(REPO / "models")},
    }
    (folder / "wrangler.jsonc").write_text("// only a worker and this file\n" + json.dumps(config, indent=2))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rag")
    write_project(folder)
    made = cli("vectorize", "create", "docs", "--preset", EMBED, cwd=folder)
    assert made.returncode == 0, made.stderr
    assert "768 dimensions, cosine" in made.stdout
    return folder


@pytest.fixture(scope="module")
def server(project):
    with DevServer(project / "wrangler.jsonc", cwd=project) as srv:
        srv.token = (project / ".edge" / "api-token").read_text().strip()
        yield srv


def test_the_planted_passage_is_found_first_and_reaches_the_prompt(server):
    added = httpx.post(
        server.url + "/documents",
        json={"documents": [{"text": t, "id": f"p{i}"} for i, t in enumerate(PASSAGES)]},
        timeout=60,
    )
    assert added.status_code == 201, added.text
    assert added.json()["upserted"] == ["p0", "p1", "p2", "p3", "p4"]
    asked = httpx.get(
        server.url + "/",
        params={"q": "What is the otter on Skerry Island named?", "max_tokens": 2},
        timeout=120,
    )
    assert asked.status_code == 200, asked.text
    body = asked.json()
    assert body["matches"][0]["id"] == "p2" and body["matches"][0]["text"] == PASSAGES[2]
    assert body["matches"][0]["score"] > body["matches"][1]["score"]
    system = body["prompt"][0]["content"]
    assert PASSAGES[2] in system and system.index(PASSAGES[2]) < min(
        system.index(m["text"]) for m in body["matches"][1:]
    )
    assert isinstance(body["answer"], str)


def test_hostile_vectorize_calls_get_clear_errors_and_lose_nothing(server):
    before = httpx.get(server.url + "/hostile", timeout=60).json()
    assert "at most 100" in before["top_k"] and "at most 20 with returnValues" in before["values_top_k"]
    assert "384 dimensions; this index takes 768" in before["dimension"]
    assert "at most 1000" in before["batch"] and "10240" in before["metadata"] and "64" in before["long_id"]
    assert before["count"] == 5  # nothing half-written
    asked = httpx.get(server.url + "/", params={"q": "otter Skerry Island", "max_tokens": 1}, timeout=120)
    assert asked.json()["matches"][0]["id"] == "p2"


def test_both_ai_doors_embed_and_the_openai_one_names_the_embedding_models(server):
    auth = {"authorization": f"Bearer {server.token}"}
    base = f"{server.url}/client/v4/accounts/local/ai"
    run = httpx.post(f"{base}/run/{EMBED}", json={"text": ["a", "b c"]}, headers=auth, timeout=30)
    assert run.status_code == 200, run.text
    result = run.json()["result"]
    assert result["shape"] == [2, 768] and len(result["data"][1]) == 768
    assert (
        result["served_by"]["stand_in"] is True and "not on a GPU PoP" in result["served_by"]["computed_in"]
    )
    bad = httpx.post(f"{base}/run/{EMBED}", json={"text": ["x"] * 101}, headers=auth, timeout=30)
    assert bad.status_code == 400 and bad.json()["errors"][0]["code"] == 5006
    emb = httpx.post(
        f"{base}/v1/embeddings", json={"model": EMBED, "input": "hello"}, headers=auth, timeout=30
    )
    assert emb.status_code == 200, emb.text
    data = emb.json()
    assert data["object"] == "list" and data["data"][0]["object"] == "embedding" and data["model"] == EMBED
    assert len(data["data"][0]["embedding"]) == 768 and data["usage"]["prompt_tokens"] == 1
    wrong = httpx.post(f"{base}/v1/embeddings", json={"model": CHAT, "input": "x"}, headers=auth, timeout=30)
    assert wrong.status_code == 404 and EMBED in wrong.json()["error"]["message"]
    listed = httpx.get(f"{base}/models/search", params={"task": "Text Embeddings"}, headers=auth, timeout=30)
    assert {m["name"] for m in listed.json()["result"]} >= {EMBED, "@cf/baai/bge-m3"}


def test_the_index_survives_a_restart_and_the_cli_sees_it(server, project):
    server.stop()
    info = cli("vectorize", "info", "docs", "--json", cwd=project)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["vectorCount"] == 5
    with DevServer(project / "wrangler.jsonc", cwd=project) as again:
        asked = httpx.get(again.url + "/", params={"q": "Skerry Island otter", "max_tokens": 1}, timeout=120)
        assert asked.status_code == 200, asked.text
        assert asked.json()["matches"][0]["id"] == "p2"
