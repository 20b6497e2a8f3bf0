"""The README's quick start runs as printed (issue 57, items 1 and "README blocks"): each shell block
marked `<!-- quickstart-test -->` is run, in order, by bash in a fresh folder laid out as a clone
(the repository's files linked in, its installed .venv among them, no .edge/ state) with a PATH
that does not hold .venv/bin, as a newcomer's shell has none. The first block sets up and serves
(`edge dev` runs in the background, as the user leaves it running); each later block is "another
shell" and is run against it.

Two substitutions, both forced by a shared machine: `edge dev` is given `--port N` and every
`8787` becomes N (a free port), since 8787 may be anyone's."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.dev_server import REPO, free_port

pytestmark = pytest.mark.slow

MARKER = "<!-- quickstart-test"  # then, optionally, a word on what it is, and " -->"
# what a clone of the repository holds that an install or a run adds, never linked in
LEFT_OUT = {".git", ".edge", ".pytest_cache", ".ruff_cache", "__pycache__"}


def quickstart_blocks(readme: str) -> list[str]:
    """The ```sh blocks that follow the marker (a blank line between them allowed), in order."""
    return re.findall(re.escape(MARKER) + r"[^>]*-->\s*\n```sh\n(.*?)\n```", readme, re.S)


def test_the_readme_marks_its_quick_start_and_first_request_blocks():
    blocks = quickstart_blocks((REPO / "README.md").read_text())
    assert len(blocks) >= 2, f"mark the quick start's and the first request's ```sh blocks with {MARKER} -->"
    setup = blocks[0]
    # issue 57, item 1: `edge` is in .venv/bin, which no shell has on its PATH until it is activated
    assert "source .venv/bin/activate" in setup, setup
    assert setup.index("source .venv/bin/activate") < setup.index("edge dev"), setup


def _fresh_clone(at: Path) -> Path:
    """A folder with the repository's files linked in, the config copied (so that its state goes
    under this folder), nothing of a previous run."""
    at.mkdir()
    for entry in REPO.iterdir():
        if entry.name in LEFT_OUT or entry.name.startswith((".native", ".edge-")):
            continue
        (at / entry.name).symlink_to(entry)
    (at / "wrangler-like.toml").unlink()
    shutil.copy(REPO / "wrangler-like.toml", at / "wrangler-like.toml")
    return at


def _shell_env() -> dict[str, str]:
    """The environment of a newcomer's shell: no virtual environment active, .venv/bin not on PATH."""
    venv_bin = str(REPO / ".venv" / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VIRTUAL_ENV", "PYTHON"))}
    return {**env, "PATH": os.pathsep.join(path or ["/usr/local/bin", "/usr/bin", "/bin"])}


def _installed() -> str | None:
    """Why `make install` would build here rather than find it done (then the test is skipped: a
    reinstall or a native build takes minutes and is the set-up's, not this test's), or None."""
    stamp, venv_python = REPO / ".venv" / ".installed", REPO / ".venv" / "bin" / "python"
    if not venv_python.exists() or not stamp.exists():
        return "no .venv here: run `make install` first"
    if stamp.stat().st_mtime < (REPO / "pyproject.toml").stat().st_mtime:
        return "pyproject.toml changed since the install: run `make install` first"
    done = subprocess.run(
        [str(venv_python), "-c", "import engine.native as n; print(n._current_build()[0] is not None)"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if done.stdout.strip() != "True":
        return "the native build is stale: run `make install` first"
    if shutil.which("make") is None:
        return "no `make` on this machine"
    return None


def test_the_quick_start_runs_as_printed_in_a_fresh_shell(tmp_path):
    if why := _installed():
        pytest.skip(why)
    blocks = quickstart_blocks((REPO / "README.md").read_text())
    assert len(blocks) >= 2, f"the README has no quick start blocks marked {MARKER} -->"
    port = free_port()
    setup, *requests = [block.replace("8787", str(port)) for block in blocks]
    setup = re.sub(r"\bedge dev\b(?! --port)", f"edge dev --port {port}", setup)
    clone = _fresh_clone(tmp_path / "edge-workers")
    env = _shell_env()
    assert shutil.which("edge", path=env["PATH"]) is None  # as in a new shell: edge is not found yet
    log = tmp_path / "setup.log"
    with open(log, "w") as out:
        shell = subprocess.Popen(
            ["bash", "-e", "-c", setup],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its process group: edge dev and what it starts stop with it
        )
    try:
        deadline = time.monotonic() + 240
        while True:
            if shell.poll() is not None:
                raise AssertionError(
                    f"the quick start's first block ended ({shell.returncode}):\n{log.read_text()}"
                )
            try:
                if httpx.get(f"http://127.0.0.1:{port}/cdn-cgi/edge/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"edge dev never answered:\n{log.read_text()}"
            time.sleep(0.5)
        for block in requests:  # "from another shell": a new bash, not activated
            done = subprocess.run(
                ["bash", "-e", "-c", block],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            answer = json.loads(done.stdout)
            assert answer["response"] and answer["timing"]["pop"] == "ICN", answer  # Seoul's
    finally:
        os.killpg(shell.pid, signal.SIGTERM)
        try:
            shell.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
    said = log.read_text()
    # the Makefile says how to reach edge, for the newcomer who did not read this far
    assert "source .venv/bin/activate" in said, said
    assert (clone / ".edge").is_dir()  # its state went under the fresh folder, as a clone's would
