"""`edge init docs-bot --template ai-search`: the project's own tests pass with edge-workers' pytest
plugin, and under `edge dev` each question its README asks is answered from the file that says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from runtime.cli.templates import TEMPLATES
from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

# each README question, and the file of docs/ that answers it
ANSWERED_BY = {
    "Which port does Skylark listen on by default?": ("getting-started.md", "4040"),
    "How many backups does Skylark keep?": ("backups.md", "14"),
    "How do I reset a password?": ("accounts.md", "reset-password"),
}


def _init(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "runtime.cli", "init", "docs-bot", "--template", "ai-search"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    return tmp_path / "docs-bot"


def test_the_template_writes_its_docs_and_a_readme_asking_what_they_answer(tmp_path):
    project = _init(tmp_path)
    assert sorted(p.name for p in (project / "docs").iterdir()) == sorted(
        {f for f, _ in ANSWERED_BY.values()}
    )
    readme = (project / "README.md").read_text()
    asked = [
        parse_qs(urlsplit(u).query)["q"][0]
        for u in re.findall(r"'(http://127\.0\.0\.1:8787/\?q=[^']+)'", readme)
    ]
    asked += re.findall(r'"question": "([^"]+)"', readme)
    assert sorted(asked) == sorted(ANSWERED_BY)
    for question, (page, fact) in ANSWERED_BY.items():
        assert fact in (project / "docs" / page).read_text(), question
    assert '"source_dir": "docs/"' in (project / "wrangler.jsonc").read_text()
    assert TEMPLATES["ai-search"].test  # tests/test_worker.py


def test_the_projects_own_tests_pass_with_the_pytest_plugin(tmp_path):
    project = _init(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # a user's own session
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    out = done.stdout + done.stderr
    print(f"\npytest in the docs-bot project: {time.perf_counter() - started:.1f} s")
    assert done.returncode == 0, out[-4000:]
    assert re.search(r"\b4 passed\b", out), out[-4000:]
    assert not (project / ".edge").exists()  # the tests' state lives in pytest's tmp folders


def test_edge_dev_answers_the_readmes_questions_from_the_file_that_says(tmp_path):
    project = _init(tmp_path)
    with DevServer(project / "wrangler.jsonc", cwd=project) as srv:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # edge dev reads docs/ as it starts, then indexes it
            stats = httpx.get(srv.url + "/stats", timeout=30)
            if stats.status_code == 200 and stats.json()["completed"] == len(ANSWERED_BY):
                break
            time.sleep(0.2)
        assert stats.status_code == 200 and stats.json()["completed"] == len(ANSWERED_BY), stats.text
        for question, (page, fact) in ANSWERED_BY.items():
            found = httpx.get(srv.url + "/search", params={"q": question}, timeout=60).json()
            assert found["results"][0]["file"] == page and fact in found["results"][0]["text"], found
            answer = httpx.post(srv.url + "/", json={"question": question}, timeout=300)
            assert answer.status_code == 200, answer.text
            assert answer.json()["sources"][0] == page and answer.json()["answer"].strip(), answer.json()
        # a page added to docs/ is indexed while edge dev runs
        (project / "docs" / "plugins.md").write_text("# Plugins\n\nSkylark loads plugins from `plugins/`.")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if httpx.get(srv.url + "/stats", timeout=30).json()["completed"] == len(ANSWERED_BY) + 1:
                break
            time.sleep(0.2)
        found = httpx.get(
            srv.url + "/search", params={"q": "Where does Skylark load plugins from?"}, timeout=60
        )
        assert found.json()["results"][0]["file"] == "plugins.md"
