"""A project's own Python dependencies, for the isolate.

A project lists them as Cloudflare's Python Workers do, in `pyproject.toml` (`[project]
dependencies`), or in a `requirements.txt`, beside its config. `edge dev` installs them with pip,
using the runtime's own interpreter (so compiled wheels match it), into
`.edge/python/<hash>/` (the hash of the requirement list and the interpreter's version and
platform): once per list, never into the runtime's environment. The jail binds that folder
read-only at /edge/deps, after the SDK on the isolate's sys.path.

Refresh: a changed list gets a new hash, hence a fresh install at the next `edge dev`; to
reinstall the same list (a new release of an unpinned package), delete `.edge/python/`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

_RUNTIME_PROJECT = (Path(__file__).resolve().parents[2] / "pyproject.toml").resolve()
PIP_TIMEOUT_S = 900


class DependencyError(Exception):
    """The project's dependencies cannot be read or installed; the message says which and why."""


def requirements(project: Path) -> tuple[list[str], Path | None]:
    """The project's requirement lines and the file they came from: requirements.txt, else
    pyproject.toml's [project] dependencies (this runtime's own pyproject.toml is not a project's)."""
    req = project / "requirements.txt"
    if req.is_file():
        lines = []
        for raw in req.read_text(encoding="utf-8").splitlines():
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("-"):
                raise DependencyError(
                    f"{req}: {line!r}: only requirement lines are supported (no pip options or -r files)"
                )
            lines.append(line)
        return lines, req
    py = project / "pyproject.toml"
    if py.is_file() and py.resolve() != _RUNTIME_PROJECT:
        try:
            data = tomllib.loads(py.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise DependencyError(f"{py}: {exc}") from None
        deps = data.get("project", {}).get("dependencies", [])
        if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
            raise DependencyError(f"{py}: project.dependencies must be a list of strings")
        return [d.strip() for d in deps if d.strip()], py
    return [], None


def digest(lines: list[str]) -> str:
    """The folder name for this list on this interpreter: same list, same folder."""
    key = "\n".join(
        [f"{sys.implementation.name}{sys.version_info[0]}.{sys.version_info[1]}", platform.machine()]
        + sorted(lines)
    )
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _what_failed(output: str, lines: list[str]) -> str:
    for pattern in (
        r"No matching distribution found for (\S+)",
        r"Could not find a version that satisfies the requirement (\S+)",
        r"Failed to build (\S+)",
        r"Invalid requirement: '?([^'\n]+)'?",
    ):
        if found := re.search(pattern, output):
            return found.group(1)
    return lines[0] if len(lines) == 1 else ", ".join(lines)


def install(project: Path, state_dir: Path, log=print) -> Path | None:
    """The folder holding the project's dependencies, installed if this list is new; None when
    the project lists none. Raises DependencyError naming the package pip could not install."""
    lines, source = requirements(project)
    if not lines:
        return None
    root = state_dir / "python"
    target = root / digest(lines)
    if (target / ".complete").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)  # .edge stays the runtime's
    work = root / f".{target.name}.{os.getpid()}.partial"
    shutil.rmtree(work, ignore_errors=True)
    log(f"edge: installing {len(lines)} dependencies from {source.name} into {target} ...")
    cmd = [sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check"]
    cmd += ["--target", str(work), "--", *lines]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # not the runtime's paths
    env["PIP_NO_WARN_SCRIPT_LOCATION"] = "1"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        shutil.rmtree(work, ignore_errors=True)
        what = ", ".join(lines)
        raise DependencyError(f"pip did not finish installing {what} in {PIP_TIMEOUT_S} s") from None
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        output = done.stderr + done.stdout
        tail = "\n".join(line for line in output.strip().splitlines()[-6:] if line.strip())
        raise DependencyError(
            f"pip could not install {_what_failed(output, lines)} (listed in {source}):\n{tail}"
        )
    for leftover in ("bin",):  # console scripts are no use inside an isolate
        shutil.rmtree(work / leftover, ignore_errors=True)
    (work / ".complete").write_text("\n".join(lines) + "\n")
    try:
        work.rename(target)
    except OSError:  # another edge dev installed the same list meanwhile: keep theirs
        shutil.rmtree(work, ignore_errors=True)
    return target
