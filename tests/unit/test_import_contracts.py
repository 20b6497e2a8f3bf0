"""The import rules between rooms, as import-linter contracts in pyproject.toml ([tool.importlinter]):
the top-level order runtime -> capacity -> edge_sim -> engine -> kernels, the SDK on its own, the rooms
inside runtime/ in their layers and each importing only what DESIGN.md lets it, and what runs in the jail
importing only the wire types and the SDK."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_every_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_every_room_of_runtime_is_in_the_layers():
    """A new sub-package of runtime/ must take its place in the layers, or nothing checks it."""
    inside = next(c for c in _contracts() if c.get("containers") == ["runtime"])
    named = {room.strip() for layer in inside["layers"] for room in layer.split("|")}
    rooms = {p.parent.name for p in (ROOT / "runtime").glob("*/__init__.py")} - {"shipped_models"}
    rooms |= {p.stem for p in (ROOT / "runtime").glob("*.py") if p.stem != "__init__"}
    assert rooms == named, f"rooms not in the layers: {sorted(rooms - named)}; gone: {sorted(named - rooms)}"


def test_every_room_under_the_app_says_what_it_may_import():
    """The layers alone let a room import any lower one; each has a forbidden contract of its own."""
    inside = next(c for c in _contracts() if c.get("containers") == ["runtime"])
    named = {room.strip() for layer in inside["layers"] for room in layer.split("|")}
    own = {
        c["source_modules"][0]: set(c["forbidden_modules"])
        for c in _contracts()
        if c["type"] == "forbidden" and len(c["source_modules"]) == 1
    }
    # above the app: the rooms that assemble it (the edge command, its load tools, pytest's plugin)
    for room in sorted(named - {"testing", "cli", "bench", "app"}):
        forbidden = own.get(f"runtime.{room}")
        assert forbidden is not None, f"runtime.{room} has no forbidden contract"
        assert {"runtime.app", "runtime.cli", "runtime.bench"} <= forbidden, room


def test_the_jail_contract_forbids_every_isolate_module_but_the_wire_types():
    jail = next(c for c in _contracts() if c.get("source_modules") == ["runtime.isolate.inside"])
    forbidden = set(jail["forbidden_modules"])
    siblings = {f"runtime.isolate.{p.stem}" for p in (ROOT / "runtime" / "isolate").glob("*.py")}
    siblings -= {"runtime.isolate.__init__", "runtime.isolate.ipc"}
    assert siblings <= forbidden, sorted(siblings - forbidden)


def test_every_room_of_engine_is_in_the_layers():
    """A new sub-package or top-level module of engine/ must take its place in the layers."""
    inside = next(c for c in _contracts() if c.get("containers") == ["engine"])
    named = {room.strip() for layer in inside["layers"] for room in layer.split("|")}
    rooms = {p.parent.name for p in (ROOT / "engine").glob("*/__init__.py")}
    rooms |= {p.stem for p in (ROOT / "engine").glob("*.py") if p.stem != "__init__"}
    assert rooms == named, f"rooms not in the layers: {sorted(rooms - named)}; gone: {sorted(named - rooms)}"


def test_no_engine_folder_holds_more_than_twelve_modules():
    """A folder past a dozen modules is a room that wants splitting (its __init__ counted)."""
    for folder in [ROOT / "engine", *(p.parent for p in (ROOT / "engine").glob("*/__init__.py"))]:
        modules = sorted(p.name for p in folder.glob("*.py"))
        assert len(modules) <= 12, f"{folder.relative_to(ROOT)}: {len(modules)} modules: {modules}"
