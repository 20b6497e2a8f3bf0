"""A throwaway `edge dev` project for the benchmarks that measure through the real runtime: a
hello-world worker, one GPU PoP (ICN) serving the shipped kimi-k2-mini (or a given models folder's
catalog), and the server started on a free loopback port, waited for until it answers its health
check. `edge bench serve --compare` starts its own from here; bench/dev_project.py re-exports it.
`wait_compiled` holds a measurement back until the PoPs' engines have compiled their decode steps
(they serve eagerly while compiling in the background, and a run timed then measures the compiles)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

from runtime.control.config_schema import INSTALLED_MODELS_DIR

REPO = Path(__file__).resolve().parents[2]
MODEL = "@edge/moonshotai/kimi-k2-mini"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HELLO_WORKER = (
    "from workers import WorkerEntrypoint, Response\n\n"
    "class Default(WorkerEntrypoint):\n"
    "    async def fetch(self, request):\n"
    '        return Response("ok")\n'
)


def write_project(
    folder: Path,
    name: str,
    extra_toml: str = "",
    model: str = MODEL,
    models_dir: Path | None = None,
    worker: str = HELLO_WORKER,
) -> None:
    """`worker` as worker.py and a wrangler-like.toml in `folder`, serving `model` from `models_dir`
    (default the shipped models); `extra_toml` is appended (more tables)."""
    (folder / "worker.py").write_text(worker)
    config = textwrap.dedent(f"""
        name = "{name}"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [ai]
        binding = "AI"
        [edge]
        pops = ["ICN"]
        models = ["{model}"]
        models_dir = "{models_dir or INSTALLED_MODELS_DIR}"
        max_in_flight = 100000
        """)
    (folder / "wrangler-like.toml").write_text(config + textwrap.dedent(extra_toml))


def wait_compiled(url: str, folder: Path, timeout: float = 900.0) -> str:
    """Wait until every GPU PoP's engine of the `edge dev` at `url` (its project in `folder`) has
    compiled the decode buckets it serves compiled (engine.step.compiled_step: 1..16 rows), or has
    stopped compiling (a failed compile leaves the rest eager); what it waited for, in a line.
    Returns at once where compiling is off (EDGE_COMPILE=0: no bucket is ever ready)."""
    from engine.step.compiled_step import DEFAULT_MAX_ROWS, ROW_BUCKETS
    from runtime.control.admin import find_admin_token

    want = [b for b in ROW_BUCKETS if b <= DEFAULT_MAX_ROWS]
    headers = {"authorization": f"Bearer {find_admin_token(folder / '.edge')}"}  # edge dev wrote it
    started = time.perf_counter()
    last, changed = None, started
    while True:
        pops = httpx.get(url + "/cdn-cgi/edge/pops", headers=headers, timeout=30).json()["pops"]
        ready = {
            f"{p['code']} {name}": m.get("compiled_buckets", [])
            for p in pops
            for name, m in p.get("models", {}).items()
            if not p.get("backend")
        }
        waited = time.perf_counter() - started
        if all(b == want for b in ready.values()):
            return f"decode buckets {want} compiled at every engine ({waited:.0f} s)"
        if os.environ.get("EDGE_COMPILE") == "0" and not any(ready.values()):
            return "compiling is off (EDGE_COMPILE=0): eager steps"
        if ready != last:
            last, changed = ready, time.perf_counter()
        elif time.perf_counter() - changed > 180 or waited > timeout:
            return f"stopped waiting after {waited:.0f} s with buckets {ready} (the rest eager)"
        time.sleep(1.0)


def start_dev(folder: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """`edge dev` in `folder` with `env` added to this process's (EDGE_API_TOKEN and EDGE_STEP_LOG
    are dropped unless given); the process and its URL once it is healthy."""
    full = {**os.environ, "PYTHONPATH": str(REPO)}
    full.pop("EDGE_API_TOKEN", None)  # the token edge dev saves under .edge/ is the one used
    full.pop("EDGE_STEP_LOG", None)
    full.update(env)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "dev", "--port", str(port), "--log-level", "warning"]
        + ["--no-reload"],
        cwd=folder,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(url + "/cdn-cgi/edge/health", timeout=2).raise_for_status()
            return proc, url
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RuntimeError("edge dev exited during start-up") from None
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError("edge dev did not start")
