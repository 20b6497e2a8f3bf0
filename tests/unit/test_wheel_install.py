"""`pip install .` adds only the design's packages at top level. A wheel built from this checkout
(offline, with this environment's setuptools), installed by pip into a fresh virtual environment
that already holds another project's `models` package: that `models` stays the one imported, no
`js`, `asgi` or `pyodide` appears, the installed runtime finds and verifies its shipped models,
`edge` runs, and an isolate (jailed where this machine allows it) still imports the Pyodide
stand-ins a Cloudflare script expects."""

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# DESIGN.md's rooms
TOP_LEVEL = {"workers", "runtime", "capacity", "quality", "edge_sim", "engine", "kernels"}
KIMI = "@edge/moonshotai/kimi-k2-mini"
# what a build does not read: version control, environments, caches, earlier builds, run state
SKIP_AT_ROOT = {".git", ".venv", "build", "dist", ".mypy_cache", ".hypothesis", "sim-out", "bench"}
SKIP_ANYWHERE = {"__pycache__", ".pytest_cache", ".ruff_cache", ".edge"}


def _skip(folder: str, names: list[str]) -> set[str]:
    at_root = Path(folder) == REPO
    return {
        n
        for n in names
        if n in SKIP_ANYWHERE
        or n.endswith(".egg-info")
        or (at_root and (n in SKIP_AT_ROOT or n.startswith(".native")))
    }


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH, no user site: the fresh environment sees only what it was given."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def _run(cmd: list[str], cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(
        cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (
        f"{cmd}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of this checkout (a build in place would leave build/ and egg-info here)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=_skip)
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-w", str(root / "dist"), str(source)],
        cwd=root,
    )
    (found,) = (root / "dist").glob("edge_workers-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh environment with a dummy `models` in it, then the wheel installed into it by this
    environment's pip, then this environment's third-party packages (torch, msgspec, ...) appended
    to its sys.path by a .pth line: a plain path, so the .pth files there (this checkout's editable
    finder) never run."""
    root = tmp_path_factory.mktemp("venv")
    prefix = root / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], cwd=root)
    (purelib,) = (prefix / "lib").glob("python3*/site-packages")
    dummy = purelib / "models"
    dummy.mkdir()
    (dummy / "__init__.py").write_text('DUMMY = "another project\'s models"\n')
    before = set(os.listdir(purelib))
    _run(
        [sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python")]
        + ["install", "--no-deps", "--no-index", str(wheel)],
        cwd=root,
    )
    added = {
        n for n in set(os.listdir(purelib)) - before if not n.endswith(".dist-info") and n != "__pycache__"
    }
    assert added == TOP_LEVEL, f"the install added {sorted(added)} at top level"
    assert (dummy / "__init__.py").read_text().startswith("DUMMY"), "the install wrote into the other models"
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "zz_edge_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    return prefix


def test_the_wheel_holds_the_design_packages_the_shims_inside_workers_and_the_models_as_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == TOP_LEVEL
    for shim in ("js/__init__.py", "asgi/__init__.py", "pyodide/__init__.py", "pyodide/ffi.py"):
        assert f"workers/_pyodide/{shim}" in names
    shipped = "runtime/shipped_models/"
    for data in (
        "catalog.toml",
        "keys/release.pub",
        "eval/heldout.txt",
        "quality/kimi-k2-mini.json",
        "kimi-k2-mini/model.safetensors",
        "kimi-k2-mini/manifest.json",
        "glm-4.5-mini/tokenizer.json",
    ):
        assert shipped + data in names
    assert not [n for n in names if n.startswith(shipped + "recipe/")], "the training recipe stays behind"
    for page in ("dashboard.html", "dashboard.css", "dashboard.js"):  # the live dashboard's, served from here
        assert f"runtime/routes/dashboard_static/{page}" in names
    # the rag template's worker, examples/rag/worker.py itself (runtime.cli.templates reads it)
    assert "runtime/cli/rag_example/worker.py" in names


INSTALLED = """
import importlib.util, json, sys
from pathlib import Path

site = Path(sys.argv[1])
import models
assert models.DUMMY and Path(models.__file__).parent == site / "models", models.__file__
found = {n: importlib.util.find_spec(n) for n in ("js", "asgi", "pyodide")}
assert not any(found.values()), found

import runtime
from runtime.ai.catalog import load_catalog, quality_view
from runtime.control.config import INSTALLED_MODELS_DIR
from engine.load.integrity import load_public_key, verify
from quality.perplexity import heldout_text_path
from engine.load.verified_load import default_trusted_keys
assert Path(runtime.__file__).parent == site / "runtime", runtime.__file__
assert not [m for m in sys.modules if m.startswith("__editable__")], "this checkout's editable finder ran"
assert INSTALLED_MODELS_DIR == site / "runtime" / "shipped_models", INSTALLED_MODELS_DIR
keys = default_trusted_keys()
assert keys == [INSTALLED_MODELS_DIR / "keys" / "release.pub"], keys
entry, folder = load_catalog(INSTALLED_MODELS_DIR)[sys.argv[2]]
for name in ("config.json", "model.safetensors", "tokenizer.json", "manifest.json"):
    assert (folder / name).is_file(), folder / name
result = verify(folder, [load_public_key(k) for k in keys])
assert result.ok, result.problems
assert heldout_text_path(folder).is_file() and quality_view(folder)
print(json.dumps({"folder": str(folder), "signed_by": result.signed_by}))
"""


def test_the_installed_runtime_finds_its_models_beside_another_models_package(venv, tmp_path):
    (purelib,) = (venv / "lib").glob("python3*/site-packages")
    done = _run([str(venv / "bin" / "python"), "-c", INSTALLED, str(purelib), KIMI], cwd=tmp_path)
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["folder"] == str(purelib / "runtime" / "shipped_models" / "kimi-k2-mini")


def test_the_installed_edge_command_runs_and_lists_the_shipped_models(venv, tmp_path):
    edge = str(venv / "bin" / "edge")
    assert "usage: edge" in _run([edge, "--help"], cwd=tmp_path).stdout
    (tmp_path / "worker.py").write_text("from workers import Response, WorkerEntrypoint\n")
    (tmp_path / "wrangler-like.toml").write_text(
        'name = "w"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n[ai]\nbinding = "AI"\n'
    )
    listed = _run([edge, "models", "list"], cwd=tmp_path).stdout
    shipped = next((venv / "lib").glob("python3*/site-packages")) / "runtime" / "shipped_models"
    assert f"{KIMI}\n" in listed and str(shipped / "kimi-k2-mini") in listed, listed
    assert listed.count("integrity: verified, signed by") == 2, listed
    # `edge init` outside the checkout still finds the rag template's worker: the example's own file
    _run([edge, "init", "asker", "--template", "rag"], cwd=tmp_path)
    example = (REPO / "examples" / "rag" / "worker.py").read_text()
    assert (tmp_path / "asker" / "worker.py").read_text() == example


ISOLATE = """
import asyncio, json, sys
from pathlib import Path
from runtime.isolate import ipc
from runtime.isolate.process import Isolate, IsolateLimits, use_insecure_isolation
from runtime.isolate.host import QuietHost
from runtime.isolate.launch import isolation_problem

script = Path(sys.argv[1])

async def no_ai(call):
    return ipc.AIReply(call.call, error_code=5007, error_message="no AI here")

async def serve():
    iso = Isolate("cf", script, {}, None, QuietHost(ai=no_ai), limits=IsolateLimits())
    await iso.start()
    try:
        answer = await iso.invoke("GET", "http://x/", [], b"", {})
        return iso.jailed, answer.status, json.loads(answer.body)
    finally:
        await iso.stop()

out = {}
if isolation_problem() is None:
    out["jailed"] = asyncio.run(serve())
use_insecure_isolation(True)
out["insecure"] = asyncio.run(serve())
print(json.dumps(out))
"""

WORKER = """
import asgi
from js import JSON, Response
from pyodide.ffi import to_js
from workers import WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        import js, pyodide
        files = [m.__file__ for m in (asgi, js, pyodide)]
        return Response.new(JSON.stringify(to_js({"files": files})), to_js({"status": 203}))
"""


def test_an_isolate_of_the_installed_runtime_imports_the_pyodide_stand_ins(venv, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "worker.py").write_text(textwrap.dedent(WORKER))
    done = _run([str(venv / "bin" / "python"), "-c", ISOLATE, str(project / "worker.py")], cwd=tmp_path)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    (purelib,) = (venv / "lib").glob("python3*/site-packages")
    jailed, status, body = out["insecure"]
    assert not jailed and status == 203
    assert all(f.startswith(str(purelib / "workers" / "_pyodide") + "/") for f in body["files"]), body
    if "jailed" in out:  # inside the jail the three are bound at /edge/lib, beside workers
        jailed, status, body = out["jailed"]
        assert jailed and status == 203
        assert body["files"] == [f"/edge/lib/{m}/__init__.py" for m in ("asgi", "js", "pyodide")], body
