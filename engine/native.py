"""Compiled hot paths: the scheduling policy, its block counts and the capacity simulator's event
loop, built by mypyc from these same Python sources and loaded only while they are current.

Why: the simulator runs the engine's own policy object step by step (one policy, not a copy), which
costs about 50 us of interpreted Python per simulated request; the planner needs 50,000 simulated
requests per second (bench/sim_speed.py). mypyc compiles the typed sources of MODULES to C
extensions, 2.5-3.5x faster there, without a second implementation: the .py files stay the one
source, and without a build everything runs interpreted, as before.

Safety of a build: it lives in `.native/` (never beside the sources, where Python would prefer a
stale .so to an edited .py) with a manifest of each source's SHA-256 and the interpreter it was built
for. `install()` (called by the engine, edge_sim and capacity packages before any of their modules
load) serves the compiled modules only when every hash matches: all or nothing, since a compiled
module calls its compiled neighbours natively. EDGE_NATIVE=0 turns it off.

    make native     build (or keep, when current); `make dev` and `make test` run it first
    python -c "import engine.native as n; print(n.status())"    what this interpreter loads, and why
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD_DIR = REPO / ".native"
MANIFEST = "manifest.json"
# the hot path, in import order: the simulator's loop, its replica, the policy and what it counts on
MODULES = (
    "engine.sched.block_counts",
    "engine.sched.fair_queue",
    "engine.sched.policy_runs",
    "engine.sched.policy",
    "edge_sim.load",
    "edge_sim.step_cost",
    "capacity.draws",
    "capacity.replica",
    "capacity.event_loop",
)
MYPY_FLAGS = ("--ignore-missing-imports", "--follow-imports=silent")

_state: dict[str, str] = {}  # "status": what install() decided


def source_file(module: str) -> Path:
    return REPO.joinpath(*module.split(".")).with_suffix(".py")


def missing_sources() -> list[str]:
    """Listed modules with no source file: a module that moved without its entry here would run
    interpreted (about 3x slower) with no error, so the build refuses to start instead."""
    return [m for m in MODULES if not source_file(m).is_file()]


def _fingerprint() -> dict[str, object]:
    """What a build must match: each source's hash and the interpreter's extension ABI."""
    return {
        "python": sys.implementation.cache_tag,
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "sources": {m: hashlib.sha256(source_file(m).read_bytes()).hexdigest() for m in MODULES},
    }


def _current_build(build_dir: Path = BUILD_DIR) -> tuple[dict[str, Path] | None, str]:
    """The compiled files by module name when the build in `build_dir` matches the sources; else
    None and the reason."""
    try:
        manifest = json.loads((build_dir / MANIFEST).read_text())
    except FileNotFoundError:
        return None, f"no build in {build_dir} (make native)"
    except (OSError, ValueError) as e:
        return None, f"unreadable manifest in {build_dir}: {e}"
    want = _fingerprint()
    for key in ("python", "ext_suffix"):
        if manifest.get(key) != want[key]:
            return None, f"built for {key} {manifest.get(key)}, this is {want[key]}"
    built = manifest.get("sources", {})
    stale = sorted(m for m in MODULES if built.get(m) != want["sources"][m])  # type: ignore[index]
    if stale:
        return None, f"sources changed since the build: {', '.join(stale)} (make native)"
    files = {name: build_dir / rel for name, rel in manifest.get("files", {}).items()}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing or not all(m in files for m in MODULES):
        return None, f"build incomplete: {', '.join(missing) or 'modules missing'}"
    return files, f"compiled ({len(MODULES)} modules, {build_dir})"


class _CompiledFinder(importlib.abc.MetaPathFinder):
    """Serves the compiled extension of each module in `files` (and mypyc's shared library)."""

    def __init__(self, files: dict[str, Path]):
        self.files = files

    def find_spec(self, fullname, path=None, target=None):
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def install() -> str:
    """Serve the compiled modules from now on if the build is current (idempotent); the status."""
    if "status" in _state:
        return _state["status"]
    _state["status"] = "interpreted: deciding"  # re-entry while the packages import each other
    files, why = None, "EDGE_NATIVE=0"
    if os.environ.get("EDGE_NATIVE", "1") != "0" and missing_sources():
        why = f"listed modules have no source: {', '.join(missing_sources())} (engine.native.MODULES)"
    elif os.environ.get("EDGE_NATIVE", "1") != "0":
        files, why = _current_build()
        loaded = [m for m in MODULES if m in sys.modules]
        if files is not None and loaded:  # too late for all of them: none (see the docstring)
            files, why = None, f"{', '.join(loaded)} imported before the build was found"
    if files is not None:
        sys.meta_path.insert(0, _CompiledFinder(files))
    _state["status"] = why if files is not None else f"interpreted: {why}"
    return _state["status"]


def status() -> str:
    """'compiled (...)' or 'interpreted: why', for this interpreter."""
    return install()


class MissingSourceError(RuntimeError):
    """A module listed for compiling has no source (it moved or was removed)."""


def build(build_dir: Path = BUILD_DIR, quiet: bool = False) -> Path:
    """Compile MODULES with mypyc into `build_dir` (kept when it is current); the build directory.
    Raises RuntimeError with the compiler's output when the build fails (a type error in a source,
    no C compiler); the previous build, if any, is left alone."""
    import shutil
    import subprocess
    import tempfile

    missing = missing_sources()
    if missing:
        raise MissingSourceError(
            f"engine.native.MODULES lists {', '.join(missing)}, which no source file holds: "
            "a module that moved must be listed by its new name"
        )
    if _current_build(build_dir)[0] is not None:
        return build_dir
    fingerprint = _fingerprint()  # of the sources as compiled (taken before: an edit mid-build is stale)
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".native-build-", dir=build_dir.parent))
    try:
        paths = [str(source_file(m).relative_to(REPO)) for m in MODULES]
        setup = (
            "import sys\nfrom setuptools import setup\nfrom mypyc.build import mypycify\n"
            f"setup(name='edge-native', py_modules=[], ext_modules=mypycify({list(MYPY_FLAGS) + paths!r}, "
            f"opt_level='3', debug_level='0', target_dir={str(work / 'c')!r}))\n"
        )
        cmd = [
            sys.executable, "-c", setup, "build_ext", "--build-lib", str(work / "lib"),
            "--build-temp", str(work / "obj"), "-j", str(os.cpu_count() or 1),
        ]  # fmt: skip
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"mypyc build failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        lib, suffix = work / "lib", str(sysconfig.get_config_var("EXT_SUFFIX"))
        files = {}
        for so in lib.rglob("*" + suffix):
            rel = so.relative_to(lib)
            files[".".join(rel.parts)[: -len(suffix)]] = str(Path("lib") / rel)
        missing = [m for m in MODULES if m not in files]
        if missing:
            raise RuntimeError(f"mypyc build made no extension for {', '.join(missing)}")
        (work / MANIFEST).write_text(json.dumps({**fingerprint, "files": files}, indent=1))
        shutil.rmtree(work / "c", ignore_errors=True)
        shutil.rmtree(work / "obj", ignore_errors=True)
        old = build_dir.with_name(build_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if build_dir.exists():
            build_dir.rename(old)
        work.rename(build_dir)
        shutil.rmtree(old, ignore_errors=True)
        if not quiet:
            print(f"compiled {len(MODULES)} modules into {build_dir}")
        return build_dir
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    """`make native`: build (or keep) and say what the next interpreter will load, module by module;
    1 when the build failed (the reason on stderr; the Makefile warns and goes on), 2 when a listed
    module has no source (the Makefile stops: that is a mistake in this list, not a missing compiler)."""
    from kernels import native_ops

    failed = False
    try:  # first: a new build replaces the whole folder, where the CPU ops' library lives too
        build()
    except MissingSourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"{e}\nthe hot paths stay interpreted (correct, about 3x slower)", file=sys.stderr)
        failed = True
    try:  # the CPU ops (edge_cpu:: over the C kernels): one library, once per source and torch version
        print(f"CPU ops: {native_ops.build()} ({native_ops.isa()})")
    except RuntimeError as e:
        why = "compressed weights are dequantized before each matmul, MoE layers run their per-expert loop"
        print(f"{e}\n{why} on this CPU", file=sys.stderr)
    if failed:
        return 1
    files, why = _current_build()
    print(why)
    for module in MODULES:  # every listed module, as the next interpreter will load it
        print(f"  {module}: {'compiled' if files and module in files else 'interpreted'}")
    return 0
