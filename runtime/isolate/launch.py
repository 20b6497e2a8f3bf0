"""How an isolate's process is started: the jail's command (runtime.isolate.jail, runtime.isolate.view),
or under `edge dev --insecure-isolation` a plain child with Landlock only; and whether this
machine can jail isolates at all."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from pathlib import Path

from runtime.control.limits import IsolateLimits
from runtime.isolate import view as isolate_view
from runtime.isolate.inside import walk as call_walk
from runtime.isolate.types import WorkerLoadError

log = logging.getLogger("edge.isolate")

_PROJECT_ROOT = Path(__file__).resolve().parents[2]

_insecure = False


def use_insecure_isolation(on: bool = True) -> None:
    """`edge dev --insecure-isolation`: no namespaces (for kernels that refuse user namespaces)."""
    global _insecure
    _insecure = on


def insecure_isolation() -> bool:
    return _insecure


def isolation_problem() -> str | None:
    """Why isolates cannot be jailed on this machine (the kernel refuses user namespaces, no
    libseccomp), or None when they can."""
    import subprocess

    cmd = [sys.executable, "-S", "-s", "-B", "-m", "runtime.isolate.jail", "--probe"]
    try:
        done = subprocess.run(
            cmd, env=isolate_view.launcher_env(), capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"edge: cannot start the isolate launcher: {exc}"
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit status {done.returncode}")


def _child_env() -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    # the Pyodide stand-ins first (top-level names here only), then our packages
    env["PYTHONPATH"] = os.pathsep.join((str(isolate_view.PYODIDE_MODULES), str(_PROJECT_ROOT)))
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if call_walk.enabled():  # bench/request_walk.py: the isolate records its side of each request
        env[call_walk.ENV] = "1"
    return env


def launch_command(
    name: str, script: Path, limits: IsolateLimits, deps: Path | None, fd: int, sync_fd: int
) -> tuple[list[str], dict[str, str], str, bool]:
    """(command, environment, working directory, jailed) for the isolate of worker `name`,
    which talks to the runtime on fd and sync_fd."""
    if not limits.sandbox or _insecure:
        if limits.sandbox:
            log.warning(
                "isolate for %s runs WITHOUT namespaces (--insecure-isolation): it shares the "
                "runtime's uid, PID space and network; only Landlock confines it",
                name,
            )
        cmd = [
            sys.executable,
            "-m",
            "runtime.isolate.inside.main",
            "--fd",
            str(fd),
            "--sync-fd",
            str(sync_fd),
        ]
        env = _child_env()
        if deps:
            env["PYTHONPATH"] += os.pathsep + str(deps)
        return cmd, env, str(script.parent), False
    rlimits = {
        "nproc": limits.processes,
        "fsize": limits.file_bytes,
        "core": 0,
        "nofile": 256,
    }
    spec = isolate_view.view_spec(
        script, fd, rlimits, limits.file_bytes, str(deps) if deps else None, sync_fd
    )
    return isolate_view.jail_command(spec), isolate_view.launcher_env(), "/", True


async def spawn_process(
    name: str, script: Path, limits: IsolateLimits, deps: Path | None
) -> tuple[asyncio.subprocess.Process, socket.socket, socket.socket, bool]:
    """Start the isolate's process tree: (its root, the runtime's end of the main channel, the
    runtime's end of the synchronous one, jailed)."""
    parent, child = socket.socketpair()
    # a second channel for the few calls Cloudflare's API makes synchronous (a Durable
    # Object's storage.sql.exec): the isolate blocks on it while the runtime answers
    sync_parent, sync_child = socket.socketpair()
    try:
        try:
            cmd, env, cwd, jailed = launch_command(
                name, script, limits, deps, child.fileno(), sync_child.fileno()
            )
        except OSError as exc:
            sync_parent.close()
            raise WorkerLoadError(f"{script.name}: cannot build its isolate: {exc}") from None
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            pass_fds=[child.fileno(), sync_child.fileno()],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,  # its own process group: a kill reaches everything it forked
        )
    finally:
        child.close()
        sync_child.close()
    return proc, parent, sync_parent, jailed
