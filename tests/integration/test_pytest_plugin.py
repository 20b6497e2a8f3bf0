"""The pytest plugin as a user meets it: `edge init` a project, then `python -m pytest` in its folder
with this environment's interpreter (the plugin is the installed `pytest11` entry point, nothing is
configured). The d1 template's tests fetch, seed its D1 database, fire its cron and ask the real
model twice for the same answer; the rag template's make a Vectorize index, embed documents and
find the answer in the model's reply; the agent template's see the model call the worker's tool and
answer from its result. A failing test added beside them must fail, so the run proves the async
tests ran rather than being skipped."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FAILING = """
async def test_a_wrong_expectation_fails(worker):
    assert (await worker.fetch("/")).status == 418
"""


@pytest.mark.parametrize(
    ("template", "passing", "root_status"), [("d1", 6, 200), ("rag", 2, 400), ("agent", 2, 400)]
)
def test_an_edge_init_project_passes_its_own_tests_with_the_plugin(tmp_path, template, passing, root_status):
    subprocess.run(
        [sys.executable, "-m", "runtime.cli", "init", "docs-bot", "--template", template],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    project = tmp_path / "docs-bot"
    assert (project / "tests" / "test_worker.py").is_file()
    (project / "tests" / "test_failing.py").write_text(FAILING)
    # the child is a user's own session: none of this suite's pytest settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    took = time.perf_counter() - started
    print(f"\npytest in an edge init project ({template}: one model load, {passing + 1} tests): {took:.1f} s")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]  # the one failing test, and only it
    assert re.search(rf"\b1 failed, {passing} passed\b", out), out[-4000:]
    assert "test_a_wrong_expectation_fails" in out and f"assert {root_status} == 418" in out, out[-4000:]
    assert not (project / ".edge").exists()  # the tests' state lives in pytest's tmp folders


def _project(tmp_path: Path, tests: dict[str, str], ini: str = "") -> Path:
    """A hello project from `edge init` (no AI binding: no model to load) with `tests` beside its own."""
    subprocess.run(
        [sys.executable, "-m", "runtime.cli", "init", "hello"], cwd=tmp_path, check=True, capture_output=True
    )
    project = tmp_path / "hello"
    (project / "tests" / "test_worker.py").unlink(missing_ok=True)
    for name, text in tests.items():
        (project / "tests" / name).write_text(text)
    if ini:
        (project / "pytest.ini").write_text("[pytest]\n" + ini)
    return project


def _pytest(project, *args, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    return done, done.stdout + done.stderr


def test_a_worker_projects_pytest_run_prints_no_torch_deprecation_warnings(tmp_path):
    # issue 57, item 8: every run printed 14 `torch.jit.script_method` DeprecationWarnings, raised
    # where the runtime imports torch's compiler (llguidance.torch), none of them the user's
    project = _project(tmp_path, {"test_ok.py": OK})
    done, out = _pytest(project)
    assert done.returncode == 0 and "1 passed" in out, out[-4000:]
    assert "DeprecationWarning" not in out and "warning" not in out, out[-4000:]


OK = """
async def test_ok(worker):
    assert (await worker.fetch("/")).text == "Hello World!"
"""

STYLES = """
import asyncio

import pytest


@pytest.mark.anyio
async def test_marked_for_anyio(worker):
    assert (await worker.fetch("/")).text == "Hello World!"


def test_sync_through_worker_run(worker):
    assert worker.run(worker.fetch("/")).status == 200


def test_sync_through_asyncio_run(worker):
    asyncio.run(worker.fetch("/"))


async def test_that_never_ends(worker):
    await asyncio.Event().wait()


def test_sync_that_never_ends(worker):
    worker.run(asyncio.Event().wait())
"""


def test_no_style_of_async_test_hangs_each_is_served_or_fails_at_once_saying_why(tmp_path):
    # issue 57, item 12: `@pytest.mark.anyio` (anyio's pytest plugin is installed beside this one)
    # and `asyncio.run(worker.fetch(...))` in a def test both waited forever, without a word
    project = _project(tmp_path, {"test_styles.py": STYLES}, ini="edge_test_timeout = 3\n")
    started = time.perf_counter()
    done, out = _pytest(project, "-rA", "-vvv")  # with -q, verbosity 2: the summary lines whole
    took = time.perf_counter() - started
    assert re.search(r"\b3 failed, 2 passed\b", out), out[-6000:]
    passed = re.findall(r"^PASSED tests/test_styles.py::(\w+)", out, re.M)
    assert sorted(passed) == ["test_marked_for_anyio", "test_sync_through_worker_run"], out[-6000:]
    said = dict(re.findall(r"^FAILED tests/test_styles.py::(\w+) - (.*)$", out, re.M))
    assert "worker.run(worker.fetch(...))" in said["test_sync_through_asyncio_run"], said
    for name in ("test_that_never_ends", "test_sync_that_never_ends"):
        assert "ran past 3 s (edge_test_timeout" in said[name], said
    assert took < 90, took
