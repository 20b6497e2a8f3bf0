"""A project's own dependencies (requirements.txt or pyproject.toml) are installed by `edge dev`
into .edge/python/<hash>/ and imported by its worker inside the jail; a package pip cannot
install stops edge dev naming it. Needs the package index (slow)."""

import subprocess
import sys
import textwrap

import httpx
import pytest

from runtime.host.deps import digest
from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

WORKER = """
import six
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return Response.json({"six": six.__version__, "from": six.__file__, "ok": six.PY3})
"""

CONFIG = """
name = "deps"
main = "worker.py"
compatibility_date = "2026-11-01"
"""


def test_a_requirements_txt_dependency_is_installed_once_and_imported_in_the_jail(tmp_path):
    project = tmp_path / "project"  # outside the repository: nothing of its venv leaks in
    project.mkdir()
    (project / "worker.py").write_text(textwrap.dedent(WORKER))
    (project / "wrangler-like.toml").write_text(textwrap.dedent(CONFIG))
    (project / "requirements.txt").write_text("six\n")
    target = project / ".edge" / "python" / digest(["six"])
    with DevServer(project / "wrangler-like.toml", cwd=project) as srv:
        r = httpx.get(srv.url + "/", timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["ok"] is True and r.json()["from"].startswith("/edge/deps/six")
    assert (target / "six.py").is_file() and (target / ".complete").is_file()
    stamp = (target / ".complete").stat().st_mtime_ns
    with DevServer(project / "wrangler-like.toml", cwd=project) as srv:  # the same list: no pip again
        assert httpx.get(srv.url + "/", timeout=30).json()["ok"] is True
    assert (target / ".complete").stat().st_mtime_ns == stamp


def test_a_package_pip_cannot_install_stops_edge_dev_naming_it(tmp_path):
    (tmp_path / "worker.py").write_text(textwrap.dedent(WORKER))
    (tmp_path / "wrangler-like.toml").write_text(textwrap.dedent(CONFIG))
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "deps"\nversion = "0"\ndependencies = ["edge-no-such-package-9f3a"]\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "dev", "--port", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2, done.stderr
    assert "pip could not install edge-no-such-package-9f3a (listed in" in done.stderr
    assert "Traceback" not in done.stderr
    assert not any((tmp_path / ".edge" / "python").iterdir())  # no half-installed folder left


def test_the_fastapi_template_serves_fastapi(tmp_path):
    init = [sys.executable, "-m", "runtime.cli", "init", "api", "--template", "fastapi"]
    subprocess.run(init, cwd=tmp_path, check=True)
    folder = tmp_path / "api"
    with DevServer(folder / "wrangler.jsonc", cwd=folder) as srv:
        assert httpx.get(srv.url + "/", timeout=30).json() == {"message": "Hello, World!"}
        assert httpx.get(srv.url + "/items/7", timeout=30).json() == {"item_id": 7}
        assert httpx.get(srv.url + "/items/x", timeout=30).status_code == 422  # FastAPI's validation
        assert httpx.get(srv.url + "/env", timeout=30).json() == {"greeting": "hello from FastAPI"}
