"""One account's flood of AI Search uploads against another account's searches, through a real
`edge dev` and its REST door: the quiet account's search latency (p50, p99) alone, then while the
flooding account uploads documents from several clients at once (each upload queued for indexing
in the same runtime), from the same run. The goal (issue 58): the quiet account's p99 under 1 s.

    python bench/ai_search_tenants.py [--docs 300] [--seconds 20] [--uploaders 8] [--json]

The quiet account holds `--docs` generated 2 KB documents; the flood uploads 2 KB documents as
fast as its clients can for `--seconds`. Printed: both phases' search latencies, the uploads
accepted and how many the flooding account had indexed by the end (the indexer takes one of its
items at a time: it shares the pool with the quiet account's searches).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runtime.bench.devserver import start_dev  # noqa: E402

WORDS = (
    "river harbor lantern copper meadow signal engine garden ledger orbit canvas timber glacier "
    "beacon summit quarry falcon prairie anchor compass thunder velvet marble cedar ember tundra"
).split()


def document(i: int) -> str:
    """About 2 KB of Markdown whose words depend on i (so that searches have a best answer)."""
    words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(8)]
    body = " ".join(f"The {w} of item {i} is recorded in section {j}." for j, w in enumerate(words * 7))
    return f"# Document {i}: {words[0]} and {words[1]}\n\n{body}\n"


def host() -> str:
    """The CPU's model name (AMD EPYC or Intel Xeon: speeds differ 2-5x between them)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Api:
    def __init__(self, url: str, token: str, account: str):
        self.base = f"{url}/client/v4/accounts/{account}/ai-search/namespaces/default/instances"
        self.client = httpx.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=60)

    async def create(self, name: str) -> None:
        r = await self.client.post(self.base, json={"id": name})
        r.raise_for_status()

    async def upload(self, name: str, key: str, text: str) -> httpx.Response:
        return await self.client.post(
            f"{self.base}/{name}/items", files={"file": (key, text.encode(), "text/markdown")}
        )

    async def stats(self, name: str) -> dict:
        r = await self.client.get(f"{self.base}/{name}/stats")
        r.raise_for_status()
        return r.json()["result"]

    async def search(self, name: str, query: str) -> float:
        started = time.perf_counter()
        r = await self.client.post(f"{self.base}/{name}/search", json={"query": query})
        r.raise_for_status()
        assert r.json()["result"]["chunks"], "a search found nothing"
        return (time.perf_counter() - started) * 1000


async def searches(api: Api, seconds: float) -> list[float]:
    out, i, end = [], 0, time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(
            await api.search("docs", f"{WORDS[i % len(WORDS)]} {WORDS[(i * 5) % len(WORDS)]} item {i % 300}")
        )
        i += 1
    return out


async def flood(api: Api, seconds: float, uploaders: int) -> tuple[int, int]:
    accepted, refused, end = 0, 0, time.monotonic() + seconds
    counter = iter(range(10**9))

    async def one() -> None:
        nonlocal accepted, refused
        while time.monotonic() < end:
            i = next(counter)
            r = await api.upload("flood", f"f{i}.md", document(10_000 + i))
            accepted, refused = (accepted + 1, refused) if r.status_code == 200 else (accepted, refused + 1)

    await asyncio.gather(*(one() for _ in range(uploaders)))
    return accepted, refused


async def measure(url: str, quiet_token: str, flood_token: str, flood_account: str, args) -> dict:
    quiet, loud = Api(url, quiet_token, "local"), Api(url, flood_token, flood_account)
    await quiet.create("docs")
    await loud.create("flood")
    started = time.perf_counter()
    for i in range(args.docs):
        (await quiet.upload("docs", f"d{i}.md", document(i))).raise_for_status()
    while (s := await quiet.stats("docs"))["queued"] + s["running"]:
        await asyncio.sleep(0.1)
    indexing_s = time.perf_counter() - started
    alone = await searches(quiet, args.seconds / 2)
    during, (accepted, refused) = await asyncio.gather(
        searches(quiet, args.seconds), flood(loud, args.seconds, args.uploaders)
    )
    flooded = await loud.stats("flood")
    return {
        "host": host(),
        "cpus": os.cpu_count(),
        "quiet_docs": args.docs,
        "quiet_indexing_docs_per_s": round(args.docs / indexing_s, 1),
        "alone": {
            "searches": len(alone),
            "p50_ms": statistics.median(alone),
            "p99_ms": percentile(alone, 0.99),
        },
        "during_flood": {
            "searches": len(during),
            "p50_ms": statistics.median(during),
            "p99_ms": percentile(during, 0.99),
        },
        "flood": {
            "uploads_accepted": accepted,
            "uploads_refused": refused,
            "indexed_by_end": flooded["completed"],
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--uploaders", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(
        dir=REPO / "bench" / "out" if (REPO / "bench" / "out").is_dir() else None
    ) as d:
        folder = Path(d)
        (folder / "worker.py").write_text(
            "from workers import Response\n\nasync def on_fetch(request, env):\n    return Response('ok')\n"
        )
        (folder / "wrangler-like.toml").write_text(
            textwrap.dedent("""
            name = "ai-search-tenants"
            main = "worker.py"
            compatibility_date = "2026-11-01"
            [edge]
            pops = ["ICN"]
            models = []
            """)
        )
        proc, url = start_dev(folder, {})
        try:
            token = (folder / ".edge" / "api-token").read_text().strip()
            admin = (folder / ".edge" / "admin-token").read_text().strip()
            made = httpx.post(
                f"{url}/cdn-cgi/edge/accounts",
                headers={"authorization": f"Bearer {admin}"},
                json={"name": "flood"},
                timeout=30,
            ).json()
            result = asyncio.run(measure(url, token, made["token"]["token"], "flood", args))
        finally:
            proc.terminate()
            proc.wait(30)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"host {result['host']}, {result['cpus']} CPUs; quiet account: {args.docs} docs of ~2 KB, "
        f"indexed at {result['quiet_indexing_docs_per_s']} docs/s"
    )
    print(f"{'phase':<14}{'searches':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for phase in ("alone", "during_flood"):
        r = result[phase]
        print(f"{phase:<14}{r['searches']:>10}{r['p50_ms']:>10.1f}{r['p99_ms']:>10.1f}")
    f = result["flood"]
    print(
        f"flood: {f['uploads_accepted']} uploads accepted ({f['uploads_refused']} refused), "
        f"{f['indexed_by_end']} indexed by the end; p99 ratio during/alone "
        f"{result['during_flood']['p99_ms'] / result['alone']['p99_ms']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
