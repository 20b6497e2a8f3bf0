"""What an isolate's jail contains, and the command that builds it (runtime.isolate.jail runs it).

The view is read-only and minimal: the interpreter's own prefix (the standard library), the
system libraries it links against, msgspec and the SDK files the isolate process imports, and a
copy of the worker's own bundle at /bundle. Nothing of the runtime's state, no other worker, no
home directory, no network.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

import msgspec

import workers
from runtime.isolate.inside import walk as call_walk

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
BUNDLE = "/bundle"
LIB = "/edge/lib"  # the SDK, msgspec and the shims: the isolate's sys.path beside the standard library
DEPS = "/edge/deps"  # the project's own dependencies (runtime.host.deps), after LIB on sys.path
# the isolate process imports exactly these of the runtime (checked by a test)
ISOLATE_MODULES = (
    "__init__.py",
    "isolate/__init__.py",
    "isolate/ipc.py",
    "isolate/inside/__init__.py",
    "isolate/inside/main.py",
    "isolate/inside/channel.py",
    "isolate/inside/ai_gateway.py",
    "isolate/inside/entry.py",
    "isolate/inside/sandbox.py",
    "isolate/inside/walk.py",
)
# The stand-ins for what Cloudflare's Python runtime provides beside `workers` (pyodide.ffi, js, asgi):
# top-level names inside an isolate only, so they live in a folder no other sys.path holds
PYODIDE_MODULES = Path(workers.__file__).resolve().parent / "_pyodide"
SHIMS = ("pyodide", "js", "asgi")  # the packages in PYODIDE_MODULES
# unprivileged uids for isolates when the runtime is root: one per isolate, far from real users
UID_BASE, UID_SPAN = 1_100_000_000, 1 << 20


def interpreter() -> str:
    """The real interpreter behind a virtual environment's `python`."""
    return os.path.realpath(sys.executable)


def _readable_by_others(path: str) -> bool:
    st = os.stat(path)
    return bool(st.st_mode & 0o004) and (not os.path.isdir(path) or bool(st.st_mode & 0o001))


def view_spec(
    script: Path,
    fd: int,
    rlimits: dict[str, int],
    tmp_bytes: int,
    deps: str | None = None,
    sync_fd: int | None = None,
) -> dict:
    """The jail's spec for one isolate whose main module is `script`; `deps` is the folder of
    the project's installed dependencies (runtime.host.deps), bound read-only at DEPS."""
    prefix = os.path.realpath(sys.base_prefix)
    python = interpreter()
    if not python.startswith(prefix + os.sep) and not python.startswith("/usr/"):
        raise OSError(f"the interpreter {python} lies outside its prefix {prefix}; cannot jail it")
    binds = [(p, p) for p in ("/usr", "/lib", "/lib64", "/lib32", "/bin")]
    if not prefix.startswith("/usr"):
        binds.append((prefix, prefix))
    binds.append((os.path.dirname(msgspec.__file__), f"{LIB}/msgspec"))
    binds.append((os.path.dirname(workers.__file__), f"{LIB}/workers"))
    # the pyodide.ffi, js and asgi stand-ins that scripts written for Cloudflare import
    binds += [(str(PYODIDE_MODULES / m), f"{LIB}/{m}") for m in SHIMS]
    if deps:
        binds.append((deps, DEPS))
    copies = [(str(_PROJECT_ROOT / "runtime" / m), f"{LIB}/runtime/{m}") for m in ISOLATE_MODULES]
    copies += [("/etc/ld.so.cache", "/etc/ld.so.cache"), ("/etc/localtime", "/etc/localtime")]
    root = os.geteuid() == 0
    if root:  # the isolate's uid must be able to read what is bound (copies are made readable)
        for source, _ in binds:
            if os.path.isdir(source) and not os.path.islink(source) and not _readable_by_others(source):
                raise OSError(f"{source} is not readable by other users; an isolate could not use it")
    env = {
        "PYTHONPATH": f"{LIB}:{DEPS}" if deps else LIB,
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    if call_walk.enabled():  # bench/request_walk.py: the isolate records its side of each request
        env[call_walk.ENV] = "1"
    return {
        "outside_uid": UID_BASE + secrets.randbelow(UID_SPAN) if root else None,
        "binds": binds,
        "copies": copies,
        "bundle": {"source": str(script.parent), "target": BUNDLE, "max_files": 1000, "max_bytes": 32 << 20},
        "tmp_bytes": tmp_bytes,
        "rlimits": rlimits,
        "argv": [python, "-S", "-s", "-B", "-m", "runtime.isolate.inside.main", "--fd", str(fd)]
        + (["--sync-fd", str(sync_fd)] if sync_fd is not None else []),
        "env": env,
    }


def jail_command(spec: dict) -> list[str]:
    return [sys.executable, "-S", "-s", "-B", "-m", "runtime.isolate.jail", json.dumps(spec)]


def launcher_env() -> dict[str, str]:
    """The launcher's own environment: enough to import runtime.isolate.jail, nothing of the runtime's."""
    return {"PYTHONPATH": str(_PROJECT_ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
