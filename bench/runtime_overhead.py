"""What the runtime costs: a hello-world worker through `edge dev` against a bare Starlette app on
the same uvicorn settings, with the load generated from a separate process; and the latency
env.AI.run adds over the engine's own time.

    python bench/runtime_overhead.py [--seconds 8] [--concurrency 16] [--burst 200]

Goals: at least 40% of the bare app's throughput; env.AI.run adds at most 3 ms at p50.
`--burst N` also sends N requests at once (N connections, a fresh client) to each server, three
bursts each, the best kept: what a burst costs beyond the runtime (the same client and cores
against the bare app) is its baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]

BARE = """
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

async def hello(request):
    return Response("hello")

app = Starlette(routes=[Route("/{path:path}", hello)])
"""

WORKER = """
import time
from workers import WorkerEntrypoint, Response

class Default(WorkerEntrypoint):
    async def fetch(self, request):
        if request.url.endswith("/ai"):
            start = time.perf_counter()
            out = await self.env.AI.run("@edge/moonshotai/kimi-k2-mini", {"prompt": "x", "max_tokens": 1})
            t = out["timing"]
            engine_ms = t["queue_ms"] + t["prefill_ms"] + t["decode_ms"]
            return Response.json({"call_ms": (time.perf_counter() - start) * 1000, "engine_ms": engine_ms})
        return Response("hello")
"""

LOADGEN = """
import asyncio, json, sys, time
import httpx

async def main(url, seconds, concurrency):
    latencies = []
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def worker():
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = await client.get(url)
                assert r.status_code == 200, r.text
                latencies.append((time.perf_counter() - t) * 1000)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    print(json.dumps({"rps": len(latencies) / elapsed, "p50": latencies[len(latencies) // 2],
                      "p99": latencies[int(len(latencies) * 0.99)], "n": len(latencies)}))

async def burst(url, n):
    latencies = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:
        async def one():
            t = time.perf_counter()
            r = await client.get(url)
            assert r.status_code == 200, r.text
            latencies.append((time.perf_counter() - t) * 1000)
        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    print(json.dumps({"rps": n / elapsed, "p50": latencies[n // 2], "p99": latencies[int(n * 0.99)], "n": n}))

if sys.argv[2] == "burst":
    asyncio.run(burst(sys.argv[1], int(sys.argv[3])))
else:
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3])))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str) -> None:
    for _ in range(600):
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(url)


def load(url: str, seconds: float | str, concurrency: int) -> dict:
    """`concurrency` connections for `seconds` (or, with seconds="burst", that many at once)."""
    out = subprocess.run(
        [sys.executable, "-c", LOADGEN, url, str(seconds), str(concurrency)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--ai-calls", type=int, default=60)
    parser.add_argument("--burst", type=int, help="also N requests at once to each server")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "bare.py").write_text(textwrap.dedent(BARE))
    (tmp / "worker.py").write_text(textwrap.dedent(WORKER))
    (tmp / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "hello"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [ai]
        binding = "AI"
        [edge]
        pops = ["ICN"]
        models_dir = "{REPO / "models"}"
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    bare_port, edge_port = free_port(), free_port()
    uvicorn_args = ["--log-level", "warning", "--no-access-log"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "bare:app", "--port", str(bare_port), *uvicorn_args],
            cwd=tmp,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runtime.cli",
                "dev",
                "--port",
                str(edge_port),
                "--log-level",
                "warning",
                "--no-reload",
            ],
            cwd=tmp,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        wait(f"http://127.0.0.1:{bare_port}/")
        wait(f"http://127.0.0.1:{edge_port}/cdn-cgi/edge/health")
        load(f"http://127.0.0.1:{edge_port}/", 1, 4)  # warm-up
        bare = load(f"http://127.0.0.1:{bare_port}/", args.seconds, args.concurrency)
        edge = load(f"http://127.0.0.1:{edge_port}/", args.seconds, args.concurrency)
        bursts = {}
        if args.burst:
            for name, url in (("bare", bare_port), ("edge", edge_port)):
                runs = [load(f"http://127.0.0.1:{url}/", "burst", args.burst) for _ in range(3)]
                bursts[name] = min(runs, key=lambda r: r["p50"])
        overhead = []
        for _ in range(args.ai_calls):
            r = httpx.get(f"http://127.0.0.1:{edge_port}/ai", timeout=60).json()
            overhead.append(r["call_ms"] - r["engine_ms"])
    finally:
        for p in procs:
            p.terminate()
    print(
        f"hello-world worker, {args.concurrency} concurrent connections for {args.seconds:.0f} s, "
        f"load from a separate process\n"
    )
    print("| server | requests/s | p50 ms | p99 ms | vs bare |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| bare Starlette on uvicorn (baseline) | {bare['rps']:.0f} | {bare['p50']:.2f} | "
        f"{bare['p99']:.2f} | 1.00x |"
    )
    print(
        f"| edge-workers runtime (isolate, IPC) | {edge['rps']:.0f} | {edge['p50']:.2f} | "
        f"{edge['p99']:.2f} | "
        f"{edge['rps'] / bare['rps']:.2f}x |"
    )
    if bursts:
        bare_b, edge_b = bursts["bare"], bursts["edge"]
        print(f"\n{args.burst} requests at once (best of 3 bursts by p50)\n")
        print("| server | burst req/s | p50 ms | p99 ms | p50 vs bare |")
        print("|---|---:|---:|---:|---:|")
        for name, b in (("bare Starlette on uvicorn (baseline)", bare_b), ("edge-workers runtime", edge_b)):
            ratio = b["p50"] / bare_b["p50"]
            print(f"| {name} | {b['rps']:.0f} | {b['p50']:.1f} | {b['p99']:.1f} | {ratio:.2f}x |")
    print(
        f"\nenv.AI.run overhead over the engine's own time ({args.ai_calls} calls, 1 token): "
        f"p50 {statistics.median(overhead):.2f} ms, "
        f"p90 {sorted(overhead)[int(len(overhead) * 0.9)]:.2f} ms"
    )


if __name__ == "__main__":
    main()
