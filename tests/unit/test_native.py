"""The compiled hot paths (engine.native): loaded only when current, and the same answers as the
interpreted sources they are built from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import msgspec

from engine import native
from tests.conftest import REPO

# a short run of each kind of scheduling the simulator does: batches, preemptions, fair shares
_RUN = """
import json, sys
import msgspec
from capacity.costmodel import RooflineCostModel
from capacity.simulator import simulate
from capacity.workload import PROFILES
from engine import native
from engine.sched.fair_queue import TenantShare
cost = RooflineCostModel("kimi-k2", "fp8")
out = {"status": native.status()}
for name, kv, load in (("chat", "auto", 4.0), ("rag", "int4", 1.0), ("agent", "auto", 2.0)):
    r = simulate(PROFILES[name], cost, kv, duration_s=20, seed=3, rate_multiplier=load)
    out[name] = msgspec.to_builtins(msgspec.structs.replace(r, wall_s=0.0))
print(json.dumps(out))
"""


def _simulate_in_subprocess(env_native: str) -> dict:
    env = {**os.environ, "EDGE_NATIVE": env_native, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _RUN], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_hot_paths_run_compiled():
    """`make test` builds them first (make native); interpreted they are correct but too slow for
    the simulator's goal, so a failed build must not go unnoticed."""
    if os.environ.get("EDGE_NATIVE") == "0":
        assert native.status() == "interpreted: EDGE_NATIVE=0"
        return
    assert native.status().startswith("compiled"), native.status()
    import capacity.event_loop
    import engine.sched.policy

    for module in (engine.sched.policy, capacity.event_loop):
        assert module.__file__.startswith(str(native.BUILD_DIR)), module.__file__


def test_compiled_and_interpreted_simulations_give_the_same_results():
    interpreted = _simulate_in_subprocess("0")
    compiled = _simulate_in_subprocess("1")
    assert interpreted.pop("status") == "interpreted: EDGE_NATIVE=0"
    assert compiled.pop("status") == native.status()
    for name in interpreted:
        assert interpreted[name]["status"].count(0) > 50, name  # a real run: many served
        # as JSON text: NaN (refused requests' latencies) compares equal to NaN there
        assert json.dumps(compiled[name]) == json.dumps(interpreted[name]), name


def _copy_build(tmp_path):
    build = tmp_path / "build"
    shutil.copytree(native.BUILD_DIR, build)
    return build, json.loads((build / native.MANIFEST).read_text())


def test_a_build_is_refused_when_a_source_changed(tmp_path):
    if not native.status().startswith("compiled"):
        return  # nothing to copy: test_the_hot_paths_run_compiled says why
    build, manifest = _copy_build(tmp_path)
    files, why = native._current_build(build)
    assert files is not None and set(native.MODULES) <= set(files), why
    manifest["sources"]["engine.sched.policy"] = "0" * 64  # as if policy.py was edited after the build
    (build / native.MANIFEST).write_text(json.dumps(manifest))
    files, why = native._current_build(build)
    assert files is None and "sources changed since the build: engine.sched.policy" in why


def test_a_build_is_refused_for_another_interpreter_or_when_incomplete(tmp_path):
    if not native.status().startswith("compiled"):
        return
    build, manifest = _copy_build(tmp_path)
    (build / native.MANIFEST).write_text(json.dumps({**manifest, "python": "cpython-399"}))
    files, why = native._current_build(build)
    assert files is None and "cpython-399" in why
    (build / native.MANIFEST).write_text(json.dumps(manifest))
    (build / manifest["files"]["capacity.replica"]).unlink()
    files, why = native._current_build(build)
    assert files is None and "incomplete" in why
    assert native._current_build(tmp_path / "none")[1].startswith("no build in")


def test_the_manifest_names_every_module_and_its_source_hash():
    manifest = msgspec.json.decode((native.BUILD_DIR / native.MANIFEST).read_bytes())
    assert set(manifest["sources"]) == set(native.MODULES)
    for module in native.MODULES:
        assert native.source_file(module).is_file()
        assert len(manifest["sources"][module]) == 64


def test_a_listed_module_without_its_source_stops_the_build(tmp_path, monkeypatch, capsys):
    """A module that moved without its new name here would run interpreted, 3x slower, with no
    error: the build refuses (exit 2, which `make native` does not swallow) and names it."""
    monkeypatch.setattr(native, "MODULES", (*native.MODULES, "engine.policy"))
    assert native.missing_sources() == ["engine.policy"]
    try:
        native.build(tmp_path / "build", quiet=True)
    except native.MissingSourceError as e:
        assert "engine.policy" in str(e) and "new name" in str(e)
    else:
        raise AssertionError("the build went on without engine.policy's source")
    assert not (tmp_path / "build").exists()
    monkeypatch.setattr(native, "BUILD_DIR", tmp_path / "build")
    assert native.main() == 2
    assert "engine.policy" in capsys.readouterr().err


def test_make_native_reports_every_listed_module_as_compiled():
    done = subprocess.run(
        [sys.executable, "-c", "import sys, engine.native as n; sys.exit(n.main())"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    if os.environ.get("EDGE_NATIVE") == "0":
        return
    for module in native.MODULES:
        assert f"  {module}: compiled" in done.stdout, done.stdout
