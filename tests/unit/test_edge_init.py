"""`edge init`: each template's files, its config in wrangler's keys, what it refuses, and the
projects it writes answering (hello served by a real edge dev)."""

import asyncio
import json
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

import httpx
import pytest

from runtime.cli.templates import RAG_WORKER, READER, TEMPLATES, InitError, worker_name, write_project
from runtime.control.config import parse_config
from runtime.isolate import ipc
from runtime.isolate.host import QuietHost
from runtime.isolate.process import Isolate
from tests.integration.dev_server import REPO, DevServer


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_each_template_writes_a_worker_a_wrangler_config_and_a_readme(tmp_path, template):
    folder = tmp_path / "My Project"
    files = write_project(folder, template, today=date(2026, 11, 1))
    expected = [
        ".gitignore",
        "README.md",
        "worker.py",
        "wrangler.jsonc",
        *(Path(p).name for p in TEMPLATES[template].extra_files),
    ]
    expected.append("test_worker.py")  # tests/test_worker.py: pytest with the plugin (runtime.testing)
    assert sorted(f.name for f in files) == sorted(expected)
    compile((folder / "worker.py").read_text(), "worker.py", "exec")
    config = parse_config((folder / "wrangler.jsonc").read_text(), source="wrangler.jsonc", base_dir=folder)
    assert config.name == "my-project" and config.main == "worker.py"
    assert config.compatibility_date == "2026-11-01" and config.compatibility_flags == ["python_workers"]
    assert config.main_path == (folder / "worker.py").resolve()
    assert (config.ai is not None) == (template in ("ai-chat", "d1", "rag", "agent"))
    if template == "rag":
        assert config.bindings["vectorize"][0].index_name == "docs"
    if template == "d1":
        assert config.bindings["d1_databases"][0].binding == "DB"
        assert config.bindings["d1_databases"][0].database_name == "my-project-db"
    readme = (folder / "README.md").read_text()
    assert readme.startswith("# my-project") and "edge dev" in readme
    assert ".edge/" in (folder / ".gitignore").read_text()


def test_the_generated_workers_are_lint_clean(tmp_path):
    for template in TEMPLATES:
        write_project(tmp_path / template, template)
    ruff = REPO / ".venv" / "bin" / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed in .venv")
    done = subprocess.run(
        [str(ruff), "check", "--no-cache", *(str(tmp_path / t / "worker.py") for t in TEMPLATES)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_refuses_a_non_empty_folder_and_an_unknown_template(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(InitError, match="already exists and is not an empty folder"):
        write_project(tmp_path / "taken")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(InitError, match="not an empty folder"):
        write_project(tmp_path / "file")
    with pytest.raises(InitError, match="no template 'vue'; choose one of hello, ai-chat"):
        write_project(tmp_path / "new", "vue")
    (tmp_path / "empty").mkdir()
    assert write_project(tmp_path / "empty")  # an empty folder is fine


def test_worker_names_are_what_workers_accept(tmp_path):
    assert worker_name(tmp_path / "Hello_World 2") == "hello-world-2"
    assert worker_name(tmp_path / "___") == "worker"


def test_the_cli_writes_the_project_and_says_what_next(tmp_path):
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "runtime.cli", "init", *a], cwd=tmp_path, capture_output=True, text=True
    )
    done = run("site", "--template", "d1")
    assert done.returncode == 0, done.stderr
    assert "cd site && edge dev" in done.stdout and (tmp_path / "site" / "worker.py").is_file()
    again = run("site")
    assert again.returncode != 0 and "already exists" in again.stderr


def test_the_cli_prints_the_paths_it_wrote(tmp_path):
    # issue 57, item 8: it printed `test_worker.py` for the file it wrote as tests/test_worker.py
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "init", "site", "--template", "d1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert "tests/test_worker.py" in first and "worker.py" in first and "wrangler.jsonc" in first, first
    assert (tmp_path / "site" / "tests" / "test_worker.py").is_file()


def _answer(folder, env=None):
    async def go():
        async def no_ai(call):
            return ipc.AIReply(call.call, error_code=5007, error_message="no AI here")

        iso = Isolate("init", folder / "worker.py", env or {}, None, QuietHost(ai=no_ai))
        await iso.start()
        try:
            return await iso.invoke("GET", "http://x/", [], b"", {})
        finally:
            await iso.stop()

    return asyncio.run(go())


@pytest.mark.parametrize(
    "template, says",
    [
        (
            "fastapi",
            "needs the 'fastapi' module: list it in pyproject.toml's dependencies",
        ),
        ("d1", "needs the D1 binding env.DB"),
    ],
)
def test_a_template_without_what_it_needs_answers_501_saying_so(tmp_path, template, says):
    write_project(tmp_path / template, template)
    answer = _answer(tmp_path / template)  # an isolate with no bindings at all
    assert isinstance(answer, ipc.InvokeResult) and answer.status == 501, answer
    assert says in answer.body.decode()


class _D1Host(QuietHost):
    """A host that answers env.DB with a real D1 store under `folder` (and refuses the rest)."""

    def __init__(self, folder):
        super().__init__()
        from runtime.bindings import BindingRef, BindingStores

        self.stores, self.ref = BindingStores(folder), BindingRef("d1", "quotes-db")

    async def binding(self, call: ipc.BindingCall) -> ipc.BindingReply:
        result = await self.stores.call("acct", self.ref, call.method, call.args, call.kwargs)
        return ipc.BindingReply(call.call, result=result)


def test_the_d1_template_answers_a_post_without_a_quote_with_a_400_naming_the_field(tmp_path):
    # issue 57, item 8: a POST without "quote" was a 500 KeyError
    write_project(tmp_path / "d1", "d1")
    host = _D1Host(tmp_path / "state")

    async def go():
        script = tmp_path / "d1" / "worker.py"
        iso = Isolate("d1", script, {}, "AI", host, bindings={"DB": "workers.d1:D1Database"})
        await iso.start()
        try:
            bodies = (b'{"author": "Tim"}', b'{"quote": 3}', b"not json", b"[]", b'{"quote": "Flat."}')
            return [await iso.invoke("POST", "http://x/", [], body, {}) for body in bodies]
        finally:
            await iso.stop()
            host.stores.close()

    *refused, added = asyncio.run(go())
    for answer in refused:
        assert isinstance(answer, ipc.InvokeResult) and answer.status == 400, answer
        assert 'the field "quote"' in json.loads(answer.body)["error"]
    assert added.status == 201 and json.loads(added.body) == {"added": "Flat."}


@pytest.mark.slow
def test_a_hello_project_is_served_by_edge_dev_at_once(tmp_path):
    folder = tmp_path / "hello"
    subprocess.run([sys.executable, "-m", "runtime.cli", "init", "hello"], cwd=tmp_path, check=True)
    with DevServer(folder / "wrangler.jsonc", cwd=folder) as srv:
        r = httpx.get(srv.url + "/", timeout=30)
        assert (r.status_code, r.text) == (200, "Hello World!")


@pytest.mark.slow
def test_a_d1_project_keeps_its_quotes(tmp_path):
    folder = tmp_path / "quotes"
    subprocess.run(
        [sys.executable, "-m", "runtime.cli", "init", "quotes", "--template", "d1"], cwd=tmp_path, check=True
    )
    with DevServer(folder / "wrangler.jsonc", cwd=folder) as srv:
        assert httpx.get(srv.url + "/", timeout=30).json()["quote"] is None
        added = httpx.post(
            srv.url + "/", json={"quote": "Flat is better than nested.", "author": "Tim"}, timeout=30
        )
        assert added.status_code == 201
        assert httpx.get(srv.url + "/", timeout=30).json() == {
            "quote": "Flat is better than nested.",
            "author": "Tim",
        }


def _streamed_text(body: str) -> str:
    events = [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]
    assert len(events) > 1 and events[-1] == "[DONE]"
    return "".join(json.loads(e).get("response", "") for e in events[:-1])


def _prose(text: str) -> bool:
    """English sentences rather than code: letters and spaces, no line that reads as Python."""
    code = re.compile(r"^\s*(def |class |import |from \w+ import|return\b|self\.|[\w.]+\(.*\):?$)|[{};]\s*$")
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return (
        bool(text.strip())
        and letters >= 0.8 * len(text)
        and not any(code.search(x) for x in text.splitlines())
    )


@pytest.mark.slow
def test_an_ai_chat_project_answers_its_readmes_questions_in_english(tmp_path):
    folder = tmp_path / "chat"
    subprocess.run(
        [sys.executable, "-m", "runtime.cli", "init", "chat", "--template", "ai-chat"],
        cwd=tmp_path,
        check=True,
    )
    readme = (folder / "README.md").read_text()
    assert "?q=What+is+the+capital+of+France%3F" in readme and "Hello! Who are you?" in readme
    with DevServer(folder / "wrangler.jsonc", cwd=folder) as srv:
        r = httpx.get(srv.url + "/?q=What+is+the+capital+of+France%3F", timeout=120)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert _prose(_streamed_text(r.text)), r.text
        hello = {"messages": [{"role": "user", "content": "Hello! Who are you?"}]}
        r = httpx.post(srv.url + "/", json=hello, timeout=120)
        assert r.status_code == 200 and _prose(_streamed_text(r.text)), r.text


def test_the_rag_example_is_the_rag_template():
    example = REPO / "examples" / "rag"
    # one file: the template reads the example's worker (a wheel installs it beside the CLI)
    assert RAG_WORKER == example / "worker.py" and TEMPLATES["rag"].worker == RAG_WORKER.read_text()
    assert f'CHAT_MODEL = "{READER}"' in TEMPLATES["rag"].worker  # the rag and agent templates' reader
    config = parse_config((example / "wrangler.jsonc").read_text(), source="wrangler.jsonc", base_dir=example)
    assert config.bindings["vectorize"][0].binding == "VECTORIZE" and config.ai is not None
