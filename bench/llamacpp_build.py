"""llama.cpp built once from the llama-cpp-python sdist, CPU-only, cached under bench/out/llama.cpp/.

    python bench/llamacpp_build.py        # build (or find) the pinned version; prints its folder

The sdist vendors llama.cpp at a fixed commit, so pinning the PyPI version pins llama.cpp. The build
takes about 10 minutes on 2 cores; a finished one leaves build.json (version, commit, seconds) and is
reused by every later run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.3.36"
CACHE = REPO / "bench" / "out" / "llama.cpp"
# folders where a copy of the sdist may already lie on this machine ($EDGE_LLAMACPP_SDISTS, separated
# by ':'), tried before asking PyPI
SDISTS_ENV = "EDGE_LLAMACPP_SDISTS"
TOOLS = (
    "llama-bench",
    "llama-batched-bench",
    "llama-perplexity",
    "llama-simple",
    "llama-quantize",  # q8_0 / q4_0 GGUFs of the mid-size checkpoints
    "llama-lookup",  # llama.cpp's own n-gram speculation, beside ours
)


def _local_sdists() -> list[Path]:
    return [Path(p) for p in os.environ.get(SDISTS_ENV, "").split(":") if p]


@dataclass(frozen=True)
class LlamaCpp:
    """A finished build: its tools, its sources (for convert_hf_to_gguf.py and gguf-py)."""

    root: Path
    version: str
    commit: str
    build_seconds: float

    @property
    def src(self) -> Path:
        return self.root / "src" / f"llama_cpp_python-{self.version}" / "vendor" / "llama.cpp"

    def tool(self, name: str) -> Path:
        return self.root / "build" / "bin" / name

    @property
    def converter(self) -> Path:
        return self.src / "convert_hf_to_gguf.py"


def _sdist(root: Path, version: str) -> Path:
    name = f"llama_cpp_python-{version}.tar.gz"
    for folder in [root, *_local_sdists()]:
        if (folder / name).exists():
            return folder / name
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}"]
        + ["--no-deps", "--no-binary", ":all:", "-d", str(root)],
        check=True,
    )
    return root / name


def _commit(src: Path) -> str:
    """The vendored llama.cpp's build number/commit, as its own CMake would stamp it (no .git here)."""
    head = src.parent.parent / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
    return head.read_text().strip()[:12] if head.exists() else "unknown"


def find(version: str = VERSION, cache: Path = CACHE) -> LlamaCpp | None:
    """The cached build of `version`, if it holds every tool in TOOLS (the cache is keyed on them)."""
    stamp = cache / version / "build.json"
    if not stamp.exists():
        return None
    meta = json.loads(stamp.read_text())
    if not set(TOOLS) <= set(meta.get("tools", ())):
        return None
    return LlamaCpp(cache / version, meta["version"], meta["commit"], meta["seconds"])


def build(version: str = VERSION, cache: Path = CACHE, jobs: int | None = None) -> LlamaCpp:
    """The cached build of `version`, building it first if there is none (about 10 minutes)."""
    found = find(version, cache)
    if found is not None:
        return found
    root = cache / version
    src = root / "src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    started = time.perf_counter()
    if not (root / "build" / "CMakeCache.txt").exists():  # else: an older tool list, built on incrementally
        tarball = _sdist(cache, version)
        shutil.rmtree(root / "src", ignore_errors=True)
        with tarfile.open(tarball) as tar:
            tar.extractall(root / "src", filter="data")
    configure = ["cmake", "-S", str(src), "-B", str(root / "build"), "-DCMAKE_BUILD_TYPE=Release"]
    configure += ["-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
    configure += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DGGML_CUDA=OFF"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    subprocess.run(configure, check=True)
    jobs = jobs or os.cpu_count() or 2
    subprocess.run(["cmake", "--build", str(root / "build"), "-j", str(jobs), "--target", *TOOLS], check=True)
    seconds = time.perf_counter() - started
    meta = {"version": version, "commit": _commit(src), "seconds": round(seconds, 1), "tools": list(TOOLS)}
    (root / "build.json").write_text(json.dumps(meta))
    return LlamaCpp(root, version, meta["commit"], seconds)


if __name__ == "__main__":
    made = build()
    print(f"llama.cpp from llama-cpp-python {made.version} ({made.commit}): {made.build_seconds:.0f} s")
    print(made.root)
