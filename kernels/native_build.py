"""The build of the CPU ops' one library (kernels/csrc): the `edge_cpu::` torch ops (ops.cpp, the one
file with torch's headers) over the plain C kernels (qlinear.c, qlinear_a8.c, moe.c), in one shared
object that kernels.native_ops loads both with torch.ops.load_library (the ops) and with ctypes (the C
kernels' own entry points: the compressed-weight matmul of kernels.linear and the ISA caps).

It is compiled once per hash of its sources and of torch's version with the system's C and C++
compilers against this torch's headers (about 5 s; `make native` does it ahead of time) into a
checkout's .native/ (beside engine.native's build) or, where that is not writable or for an installed
wheel, the user's cache folder: nothing is written into site-packages.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
C_SOURCES = ("qlinear.c", "qlinear_a8.c", "moe.c")
SOURCES = (*C_SOURCES, "ops.cpp", "edge_kernels.h", "qlinear_a8_256.h")
NAME = "edge_ops"  # the library's file: edge_ops-<hash>.so


def build_dirs() -> list[Path]:
    """A checkout's .native/ (beside engine.native's build), else the user's cache folder (an
    installed wheel: nothing is written into site-packages)."""
    repo = Path(__file__).resolve().parents[1]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edge-workers"
    return [repo / ".native", cache] if (repo / "pyproject.toml").exists() else [cache]


def cached_build(name: str, compile_to: Callable[[Path], None]) -> Path:
    """The library file `name` (its sources' hash in it) in the first build folder that has it or
    can make it with `compile_to(target)`, one compiler at a time per folder (pytest-xdist's
    workers load at once); RuntimeError saying why in every folder."""
    problems = []
    for folder in build_dirs():
        target = folder / name
        if target.exists():
            return target
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"{name.split('-')[0]}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not target.exists():
                    compile_to(target)
            return target
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{folder}: {exc}")
    raise RuntimeError("; ".join(problems))


def digest() -> str:
    h = hashlib.sha256(torch.__version__.encode())
    for name in SOURCES:
        h.update((CSRC / name).read_bytes())
    return h.hexdigest()[:16]


def _compile(target: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cc is None or cxx is None:
        raise RuntimeError("no C and C++ compilers (cc, c++) found")
    from torch.utils.cpp_extension import include_paths, library_paths

    includes = [f"-I{p}" for p in include_paths()]
    libs = library_paths()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = []
        for name in C_SOURCES:
            obj = Path(tmp) / f"{name}.o"
            _run([cc, "-O3", "-fPIC", "-fopenmp", "-c", str(CSRC / name), "-o", str(obj)])
            objects.append(str(obj))
        out = Path(tmp) / target.name
        _run(
            [cxx, "-O2", "-fPIC", "-std=c++17", "-shared", "-fopenmp", *includes, str(CSRC / "ops.cpp")]
            + [*objects, "-o", str(out), *(f"-L{p}" for p in libs), "-ltorch_cpu", "-lc10"]
            + [f"-Wl,-rpath,{p}" for p in libs]
        )
        os.replace(out, target)  # atomic: a concurrent loader sees the whole library or none


def _run(cmd: list[str]) -> None:
    made = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if made.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {made.stderr.strip()[-800:]}")


def build() -> Path:
    """The compiled library for the current sources and torch (built now if missing); RuntimeError
    why not."""
    return cached_build(f"{NAME}-{digest()}.so", _compile)
