"""The pytest plugin (runtime.testing) driving workers that use AI Search, as a user's own suite
does: `python -m pytest` in the project's folder with this environment's interpreter. One project
makes its instance at run time and searches what it uploaded; the other is examples/ai-search,
whose [[ai_search]] `source_dir` folder is indexed before its tests run, and whose questions are
answered from those documents. A failing test beside them must fail, so a run proves the tests
ran rather than being skipped."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.dev_server import REPO

pytestmark = pytest.mark.slow

FAILING = """
async def test_a_wrong_expectation_fails(worker):
    assert (await worker.fetch("/nowhere")).status == 418
"""

CONFIG = """
name = "notes"
main = "src/entry.py"
compatibility_date = "2026-12-02"

[ai]
binding = "AI"

[[ai_search_namespaces]]
binding = "NOTES"
namespace = "notes"

[edge]
pops = ["ICN"]
models = ["@edge/zai-org/glm-4.5-mini"]
"""

WORKER = """
from urllib.parse import parse_qs, urlsplit

from workers import Response, WorkerEntrypoint
from workers.ai_search import AiSearchNotFoundError


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlsplit(request.url)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        notes = self.env.NOTES.get("team")
        if url.path == "/notes" and request.method == "POST":
            try:
                await notes.info()
            except AiSearchNotFoundError:
                await self.env.NOTES.create({"id": "team"})
            item = await notes.items.uploadAndPoll(query["name"], await request.text())
            return Response.json({"status": item.status, "key": item.key})
        if url.path == "/search":
            found = await notes.search({"query": query["q"]})
            return Response.json({"keys": [c.item.key for c in found.chunks]})
        if url.path == "/ask":
            answer = await notes.chatCompletions(
                {"messages": [{"role": "user", "content": query["q"]}], "max_tokens": 8}
            )
            return Response.json({"answer": answer.choices[0].message.content,
                                  "sources": [c.item.key for c in answer.chunks]})
        return Response("not found", status=404)
"""

TESTS = """
CAT = "# Cat\\n\\nThe office cat is called Miso."


async def test_an_uploaded_note_is_found(worker):
    r = await worker.fetch("/notes?name=cat.md", method="POST", body=CAT)
    assert r.status == 200 and r.json() == {"status": "completed", "key": "cat.md"}, r
    await worker.fetch("/notes?name=plants.md", method="POST", body="# Plants\\n\\nWater the fern weekly.")
    assert (await worker.fetch("/search?q=What is the office cat called")).json()["keys"][0] == "cat.md"
    assert (await worker.fetch("/search?q=how often to water the fern")).json()["keys"][0] == "plants.md"


async def test_each_test_starts_from_an_empty_namespace(worker):
    r = await worker.fetch("/search?q=office cat")
    assert r.status == 500 and "AiSearchNotFoundError" in r.text  # no instance "team" in this test's state


async def test_the_test_seeds_and_reads_the_instance_itself(worker):
    notes = worker.ai_search("NOTES")  # env.NOTES as the worker sees it, driven from the test
    await notes.create({"id": "team"})
    item = await notes.get("team").items.uploadAndPoll("seeded.md", "The spare key hangs by the door.")
    assert item.status == "completed"
    assert (await worker.fetch("/search?q=where is the spare key")).json()["keys"][0] == "seeded.md"
    found = await notes.get("team").search({"query": "spare key"})
    assert found.chunks[0].item.key == "seeded.md"
    ask = {"messages": [{"role": "user", "content": "key?"}], "max_tokens": 4}
    answer = await notes.get("team").chatCompletions(ask)
    assert answer.chunks[0].item.key == "seeded.md" and isinstance(answer.choices[0].message.content, str)


async def test_an_answer_names_its_sources(worker):
    await worker.fetch("/notes?name=cat.md", method="POST", body=CAT)
    out = (await worker.fetch("/ask?q=What is the office cat called")).json()
    assert isinstance(out["answer"], str) and out["sources"][0] == "cat.md"
"""

EXAMPLE_TESTS = """
async def test_the_docs_folder_answers_the_readmes_questions(worker):
    found = (await worker.fetch("/search?q=How do I purge the cache")).json()
    assert found["chunks"][0]["item"]["key"] == "caching.md", found
    out = (await worker.fetch("/ask?q=How long are responses cached")).json()
    assert isinstance(out["answer"], str) and out["sources"][0] == "caching.md", out
    legacy = (await worker.fetch("/legacy?q=How fast does support reply")).json()
    assert legacy["data"][0]["filename"] == "support.md" and "response" in legacy, legacy
    streamed = await worker.fetch("/ask?q=How do I roll back&stream=1")
    assert streamed.text.startswith("event: chunks"), streamed.text[:200]
    items = (await worker.fetch("/items")).json()
    assert sorted(items["items"]) == ["caching.md", "deploying.md", "limits.md", "support.md"], items
"""


def _pytest(project: Path) -> tuple[subprocess.CompletedProcess, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # a user's own session
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return done, done.stdout + done.stderr


def test_the_plugin_drives_a_worker_that_makes_uploads_to_and_searches_its_instance(tmp_path):
    project = tmp_path / "notes"
    (project / "src").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "wrangler.toml").write_text(textwrap.dedent(CONFIG))
    (project / "src" / "entry.py").write_text(textwrap.dedent(WORKER))
    (project / "tests" / "test_notes.py").write_text(textwrap.dedent(TESTS))
    (project / "tests" / "test_failing.py").write_text(FAILING)
    done, out = _pytest(project)
    assert done.returncode == 1, out[-6000:]  # the one failing test, and only it
    assert re.search(r"\b1 failed, 4 passed\b", out), out[-6000:]
    assert "test_a_wrong_expectation_fails" in out, out[-6000:]
    assert not (project / ".edge").exists()  # the tests' state lives in pytest's tmp folders


def test_the_plugin_runs_the_example_whose_source_dir_is_indexed_before_its_tests(tmp_path):
    project = tmp_path / "ai-search"
    shutil.copytree(REPO / "examples" / "ai-search", project)
    (project / "tests").mkdir()
    (project / "tests" / "test_docs.py").write_text(textwrap.dedent(EXAMPLE_TESTS))
    done, out = _pytest(project)
    assert done.returncode == 0 and re.search(r"\b1 passed\b", out), out[-6000:]
