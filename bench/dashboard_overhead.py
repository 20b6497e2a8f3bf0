"""What an open dashboard costs AI serving: AI output tokens a second through `edge dev` under a fixed
load (a worker calling env.AI.run, CONCURRENCY clients in a loop) with one dashboard client signed in
and reading its event stream, and with none, in interleaved rounds; the medians and their ratio.

    python bench/dashboard_overhead.py [--rounds 5] [--seconds 10] [--concurrency 8] [--tokens 24]

Goal (issue 31): the dashboard costs at most 5% of AI tok/s. The dashboard client here reads the
stream as fast as it comes (what the runtime pays: the snapshots built and encoded, the request
events fanned out); a real browser's own rendering runs on the viewer's machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.bench.devserver import MODEL, start_dev, write_project  # noqa: E402

WORK = re.compile(r'"work_s":([0-9.e-]+)}$')

WORKER = f"""
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        n = int(request.url.split("n=")[1]) if "n=" in request.url else 16
        out = await self.env.AI.run(
            "{MODEL}", {{"prompt": "def parse(text):", "max_tokens": n, "temperature": 0}}
        )
        return Response.json(out["usage"])
"""


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time (its threads: the HTTP server and the engines)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(url: str, seconds: float, concurrency: int, tokens: int) -> tuple[float, int]:
    """Completion tokens a second over `seconds` from `concurrency` clients in a loop, and the tokens."""
    done = 0
    deadline = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            r = await http.get(f"{url}/gen?n={tokens}")
            r.raise_for_status()
            done += r.json()["completion_tokens"]

    start = time.monotonic()
    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return done / (time.monotonic() - start), done


class Dashboard:
    """One signed-in dashboard client reading the event stream in a thread until stopped."""

    def __init__(self, url: str, admin_token: str):
        signed = httpx.post(f"{url}/cdn-cgi/edge/dashboard/login", data={"token": admin_token})
        assert signed.status_code == 303, signed.text
        self.url, self.cookie = url, signed.cookies["edge_dashboard"]
        self.bytes = 0
        # (when, the runtime's own count of its dashboard work so far) at each snapshot
        self.work_s: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        cookies, events = {"edge_dashboard": self.cookie}, f"{self.url}/cdn-cgi/edge/dashboard/events"
        with httpx.stream("GET", events, cookies=cookies, timeout=None) as r:
            for line in r.iter_lines():
                self.bytes += len(line) + 1
                if line.startswith("data: ") and (m := WORK.search(line)):
                    self.work_s.append((time.monotonic(), float(m[1])))
                if self.stop.is_set():
                    return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def work_ms_per_s(self) -> float:
        """Milliseconds a second the runtime spent on this dashboard (snapshots, encoding, fan-out)."""
        (t0, w0), (t1, w1) = self.work_s[0], self.work_s[-1]
        return 1000 * (w1 - w0) / (t1 - t0) if t1 > t0 else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--tokens", type=int, default=24)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="edge-bench-dash-") as tmp:
        folder = Path(tmp)
        # the default 300 AI calls a minute would refuse this load within a round: no limit here
        limits = "[edge.accounts.local]\nrpm = 1000000000\ntpm = 1000000000\n"
        write_project(folder, "dash-bench", extra_toml=limits, worker=WORKER)
        proc, url = start_dev(folder, {"EDGE_ADMIN_TOKEN": ""})
        try:
            admin = (folder / ".edge" / "admin-token").read_text().strip()
            asyncio.run(load(url, 3, args.concurrency, args.tokens))  # warm up: compiled steps, caches
            arms: dict[str, list[float]] = {"none": [], "one dashboard": []}
            cpu: dict[str, list[float]] = {"none": [], "one dashboard": []}  # CPU ms per 1,000 tokens
            streamed, work = 0, []
            for i in range(args.rounds):
                for arm in ("none", "one dashboard") if i % 2 == 0 else ("one dashboard", "none"):
                    dash = Dashboard(url, admin) if arm != "none" else None
                    try:
                        time.sleep(1.0 if dash else 0.0)  # its first snapshot out before the round
                        used = cpu_seconds(proc.pid)
                        rate, tokens = asyncio.run(load(url, args.seconds, args.concurrency, args.tokens))
                        cpu[arm].append(1e6 * (cpu_seconds(proc.pid) - used) / max(1, tokens))
                    finally:
                        if dash is not None:
                            dash.close()
                            streamed += dash.bytes
                            work.append(dash.work_ms_per_s())
                    arms[arm].append(rate)
                    print(
                        f"round {i + 1} {arm:>13}: {rate:8.1f} tok/s, {cpu[arm][-1]:6.1f} CPU ms / 1k tok",
                        flush=True,
                    )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    base, dash_rate = (statistics.median(arms[k]) for k in ("none", "one dashboard"))
    ms = {k: statistics.median(v) for k, v in cpu.items()}
    each = {k: ", ".join(f"{r:.1f}" for r in v) for k, v in arms.items()}
    print()
    print(f"| arm | AI tok/s, median of {args.rounds} | each round | runtime CPU ms / 1,000 tokens, median |")
    print("| --- | ---: | --- | ---: |")
    print(f"| no dashboard (baseline) | {base:.1f} | {each['none']} | {ms['none']:.0f} |")
    print(f"| one dashboard client | {dash_rate:.1f} | {each['one dashboard']} | {ms['one dashboard']:.0f} |")
    print(f"\ntok/s ratio {dash_rate / base:.3f} (cost {100 * (1 - dash_rate / base):+.1f}%); CPU per token "
          f"ratio {ms['one dashboard'] / ms['none']:.3f}; "
          f"the dashboard streamed {streamed / 1024:.0f} KiB in all")  # fmt: skip
    print(f"the runtime's own dashboard work (snapshots built, events encoded and fanned out): median "
          f"{statistics.median(work):.2f} ms a second ({statistics.median(work) / 10:.2f}% of one core), "
          f"each round {', '.join(f'{w:.2f}' for w in work)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
