"""What the jail costs: a hello-world worker's throughput through `edge dev` with jailed isolates
(namespaces, seccomp, Landlock), through `edge dev --insecure-isolation` (the unsandboxed isolate
of before: a plain process with Landlock) and from a bare Starlette app, all in the same run with
the load from a separate process; and an isolate's cold start (process start to first response),
jailed and not.

    python bench/isolate_cost.py [--seconds 8] [--concurrency 16] [--starts 20]

Goals: jailed throughput at least 0.7x the bare app; jailed cold start p50 at most 250 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from runtime_overhead import BARE, free_port, load, wait  # noqa: E402

from runtime.isolate import ipc  # noqa: E402
from runtime.isolate.host import QuietHost  # noqa: E402
from runtime.isolate.process import Isolate, use_insecure_isolation  # noqa: E402

HELLO = """
from workers import WorkerEntrypoint, Response

class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return Response("hello")
"""


async def _no_ai(call):
    return ipc.AIReply(call.call)


def cold_starts(script: Path, n: int, insecure: bool) -> list[float]:
    """Milliseconds from starting an isolate to its first response, n times."""

    async def go() -> list[float]:
        logging.getLogger("edge.isolate").setLevel(logging.ERROR)  # not the warning per start
        use_insecure_isolation(insecure)
        out = []
        for _ in range(n):
            iso = Isolate("bench", script, {}, None, QuietHost(ai=_no_ai))
            start = time.perf_counter()
            await iso.start()
            await iso.invoke("GET", "http://x/", [], b"", {})
            out.append((time.perf_counter() - start) * 1000)
            await iso.stop()
        use_insecure_isolation(False)
        return sorted(out)

    return asyncio.run(go())


def pct(xs: list[float], q: float) -> float:
    return xs[min(int(len(xs) * q), len(xs) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--starts", type=int, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "bare.py").write_text(textwrap.dedent(BARE))
    (tmp / "worker.py").write_text(textwrap.dedent(HELLO))
    (tmp / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "hello"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge]
        pops = ["ICN"]
        models_dir = "{REPO / "models"}"
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    quiet = {"cwd": tmp, "env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    ports = {"bare": free_port(), "jailed": free_port(), "insecure": free_port()}
    dev = [sys.executable, "-m", "runtime.cli", "dev", "--log-level", "warning", "--no-reload"]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bare:app",
                "--port",
                str(ports["bare"]),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            **quiet,
        ),  # fmt: skip
        subprocess.Popen([*dev, "--port", str(ports["jailed"])], **quiet),
        subprocess.Popen([*dev, "--port", str(ports["insecure"]), "--insecure-isolation"], **quiet),
    ]
    results = {}
    try:
        wait(f"http://127.0.0.1:{ports['bare']}/")
        for name in ("jailed", "insecure"):
            wait(f"http://127.0.0.1:{ports[name]}/cdn-cgi/edge/health")
            load(f"http://127.0.0.1:{ports[name]}/", 1, 4)  # warm-up
        for name, port in ports.items():
            results[name] = load(f"http://127.0.0.1:{port}/", args.seconds, args.concurrency)
    finally:
        for p in procs:
            p.terminate()
    jailed = cold_starts(tmp / "worker.py", args.starts, insecure=False)
    insecure = cold_starts(tmp / "worker.py", args.starts, insecure=True)

    bare = results["bare"]["rps"]
    print(
        f"hello-world worker, {args.concurrency} connections for {args.seconds:.0f} s, "
        "load from a separate process\n"
    )
    print("| server | requests/s | p50 ms | p99 ms | vs bare |")
    print("|---|---:|---:|---:|---:|")
    names = {
        "bare": "bare Starlette on uvicorn (baseline)",
        "insecure": "edge dev, unsandboxed isolate (--insecure-isolation)",
        "jailed": "edge dev, jailed isolate",
    }
    for key in ("bare", "insecure", "jailed"):
        r = results[key]
        print(f"| {names[key]} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['rps'] / bare:.2f}x |")
    print(f"\ncold start, process start to first response ({args.starts} starts each)\n")
    print("| isolate | p50 ms | p90 ms | vs unsandboxed (p50) |")
    print("|---|---:|---:|---:|")
    print(f"| unsandboxed (baseline) | {pct(insecure, 0.5):.1f} | {pct(insecure, 0.9):.1f} | 1.00x |")
    print(
        f"| jailed | {pct(jailed, 0.5):.1f} | {pct(jailed, 0.9):.1f} | "
        f"{pct(jailed, 0.5) / pct(insecure, 0.5):.2f}x |"
    )


if __name__ == "__main__":
    main()
