"""How far one request walks through this repository: `curl` -> examples/hello_ai/worker.py ->
`env.AI.run` -> back, recorded on both sides of the isolate.

    python bench/request_walk.py [--show-path] [--json]

The runtime is built in this process as `edge dev` builds it (one GPU PoP, kimi-k2-mini) and one
warm-up request is sent; then the next request is recorded with sys.setprofile on the event loop's
thread (the engine's own thread is left out: this counts the request path, not the model), and the
isolate records its side of the same request (`EDGE_REQUEST_WALK=1`, which the jail passes) and
reports it on its stderr. A hop is a call from a function in one file of this repository to a
function in another (the standard library and site-packages left out; each caller-callee pair
once, so loops and polls do not make the count depend on timing); a return is a hop into a file
the walk had already been in (runtime.isolate.inside.walk). Two scopes: every call, and the calls made from
runtime/ and workers/ files (the request path this runtime owns; edge_sim's routing and the
engine's bookkeeping below it are left to their own rooms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["EDGE_REQUEST_WALK"] = "1"  # before any isolate starts: it records its side

import httpx  # noqa: E402

from runtime.isolate.inside import walk as call_walk  # noqa: E402

SCOPE = ("runtime" + os.sep, "workers" + os.sep)

CONFIG = """name = "walk"
main = "{main}"
compatibility_date = "2026-11-01"

[ai]
binding = "AI"

[edge]
client_location = "Seoul"
pops = ["ICN"]
"""


def _runtime_parts():
    """The names `edge dev` builds the runtime from (the same on every layout this tool measures)."""
    from runtime.ai.catalog import catalog_if_any
    from runtime.app import Runtime, create_app
    from runtime.cli.servers import build_edge
    from runtime.control.config import load_config

    return Runtime, create_app, catalog_if_any, build_edge, load_config


def _capture_isolate_lines(found: list[dict]) -> None:
    """The isolate's EDGE_WALK line arrives on its stderr pipe, shown as a console line: keep it."""
    try:
        from runtime.isolate.process.console import WorkerConsole
    except ImportError:
        from runtime.isolate.console import WorkerConsole
    shown = WorkerConsole.write

    def write(self, level: str, text: str) -> None:
        if text.startswith(call_walk.MARK):
            found.append(json.loads(text[len(call_walk.MARK) :]))
            return
        shown(self, level, text)

    WorkerConsole.write = write


async def walk_one(show_path: bool) -> dict:
    Runtime, create_app, catalog_if_any, build_edge, load_config = _runtime_parts()
    isolate_side: list[dict] = []
    _capture_isolate_lines(isolate_side)
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "wrangler-like.toml"
        conf.write_text(CONFIG.format(main=REPO / "examples" / "hello_ai" / "worker.py"))
        config = load_config(str(conf))
        runtime = Runtime(config, build_edge(config), catalog=catalog_if_any(config))
        app = create_app(runtime)
        await runtime.start()
        try:
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8787") as client:
                body = {"prompt": "def fib(n):", "max_tokens": 8}
                warm = await client.post("/", json=body, timeout=120)
                warm.raise_for_status()
                for _ in range(50):  # the warm-up's own isolate line
                    if isolate_side:
                        break
                    await asyncio.sleep(0.05)
                isolate_side.clear()
                walk = call_walk.Walk()
                walk.start()
                try:
                    answer = await client.post("/", json=body, timeout=120)
                finally:
                    walk.stop()
                answer.raise_for_status()
                for _ in range(100):
                    if isolate_side:
                        break
                    await asyncio.sleep(0.05)
        finally:
            await runtime.stop()
    if not isolate_side:
        raise SystemExit("request_walk: the isolate sent no EDGE_WALK line (is EDGE_REQUEST_WALK passed?)")
    sides = {
        "runtime process": walk.summary(),
        "runtime process, from runtime/": walk.summary(SCOPE),
        "isolate (all runtime/ and workers/)": isolate_side[-1],
    }
    files = sorted({f for side in sides.values() for f in side["files"]})
    scoped = [sides["runtime process, from runtime/"], sides["isolate (all runtime/ and workers/)"]]
    total = {
        "hops": sides["runtime process"]["hops"] + scoped[1]["hops"],
        "returns": sides["runtime process"]["returns"] + scoped[1]["returns"],
        "scoped_hops": sum(s["hops"] for s in scoped),
        "scoped_returns": sum(s["returns"] for s in scoped),
        "files": len(files),
        "runtime_files": sum(1 for f in files if f.startswith("runtime" + os.sep)),
    }
    return {"sides": sides, "total": total, "show_path": show_path}


def report(result: dict) -> str:
    lines = ["| side | hops | returns | files |", "| --- | ---: | ---: | ---: |"]
    for name, side in result["sides"].items():
        lines.append(f"| {name} | {side['hops']} | {side['returns']} | {len(side['files'])} |")
    t = result["total"]
    lines.append(f"| both processes, every call | {t['hops']} | {t['returns']} | {t['files']} |")
    lines.append(
        f"| **both processes, from runtime/ and workers/** | **{t['scoped_hops']}** "
        f"| **{t['scoped_returns']}** | {t['runtime_files']} in runtime/ |"
    )
    rooms = Counter(f.split(os.sep)[0] for f in {f for s in result["sides"].values() for f in s["files"]})
    lines.append("")
    lines.append("files touched by room: " + ", ".join(f"{room} {n}" for room, n in sorted(rooms.items())))
    if result["show_path"]:
        for name, side in result["sides"].items():
            if name == "runtime process, from runtime/":
                continue
            lines.append(f"\n{name} path:")
            lines += [f"  {f}" for f in side.get("path", [])]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show-path", action="store_true", help="print each side's sequence of files")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args()
    result = asyncio.run(walk_one(args.show_path))
    if args.json:
        print(json.dumps({"total": result["total"], "sides": result["sides"]}, indent=1))
    else:
        print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
