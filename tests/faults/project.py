"""The `edge dev` project the fault tests run: one worker that streams the model, awaits it,
sleeps, or writes KV, served from the GPU PoPs a test names; helpers to read what came back (SSE
events, each request's outcome) and to find the processes a fault is aimed at."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import httpx

from tests.integration.dev_server import REPO

MODEL = "@edge/moonshotai/kimi-k2-mini"

WORKER = """
import asyncio
import json

from workers import AIError, Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = request.url.split("/", 3)[3].split("?")[0]
        # raw: the code prompts are continued as written (a long completion the faults cut into);
        # through the chat template the model would answer in a sentence and stop
        if path == "stream":
            body = await request.json()
            try:
                stream = await self.env.AI.run(
                    "@edge/moonshotai/kimi-k2-mini",
                    {"prompt": body["prompt"], "raw": True, "max_tokens": body["n"], "temperature": 0,
                     "stream": True},
                )
            except AIError as exc:
                return Response.json({"error": str(exc)}, status=503)
            return Response(stream, headers={"content-type": "text/event-stream"})
        if path == "generate":
            n = int(request.url.split("n=")[1]) if "n=" in request.url else 8
            out = await self.env.AI.run(
                "@edge/moonshotai/kimi-k2-mini",
                {"prompt": "def fib(n):", "raw": True, "max_tokens": n, "temperature": 0},
            )
            return Response.json(out)
        if path == "sleep":
            await asyncio.sleep(60)
            return Response("woke")
        if path.startswith("kv/"):
            try:
                await self.env.KV.put(path[3:], "v" * 1000)
            except Exception as exc:
                return Response.json({"error": f"{type(exc).__name__}: {exc}"}, status=503)
            return Response("stored")
        return Response("ok")
"""

OTHER_WORKER = """
from workers import Response

async def on_fetch(request, env):
    return Response("other ok")
"""


def write_project(
    folder: Path,
    pops: tuple[str, ...] = ("ICN",),
    models_dir: Path = REPO / "models",
    extra: str = "",
) -> Path:
    """The fault worker and its config in `folder` (KV bound as `KV`); the config's path."""
    (folder / "worker.py").write_text(WORKER)
    config = folder / "wrangler-like.toml"
    config.write_text(
        textwrap.dedent(f"""
        name = "faults"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        kv_namespaces = [{{ binding = "KV", id = "faults-kv" }}]
        [ai]
        binding = "AI"
        [edge]
        pops = {json.dumps(list(pops))}
        models = ["{MODEL}"]
        models_dir = "{models_dir}"
        """)
        + textwrap.dedent(extra)
    )
    return config


def token(folder: Path, name: str = "api-token") -> dict[str, str]:
    """The bearer header for the token edge dev saved under `folder`/.edge (api or admin)."""
    return {"authorization": "Bearer " + (folder / ".edge" / name).read_text().strip()}


def api(url: str, folder: Path, method: str, path: str, **kw) -> httpx.Response:
    """A control-API call for the `local` account."""
    return httpx.request(
        method, f"{url}/client/v4/accounts/local{path}", headers=token(folder), timeout=60, **kw
    )


def events(text: str) -> list:
    """The SSE body's events, decoded ("[DONE]" kept as itself)."""
    out = []
    for block in text.strip().split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def outcome(status: int, body: str) -> tuple[str, str]:
    """One streamed request's end: ("completed", pop) with the final usage and [DONE], ("failed",
    code) with an error that names a code, or ("lost", why) for anything else (a truncation)."""
    if status != 200:
        error = json.loads(body).get("error", "") if body.startswith("{") else ""
        return ("failed", error.split(":")[0]) if error[:4].isdigit() else ("lost", f"{status}: {body[:200]}")
    got = events(body)
    if not got or got[-1] != "[DONE]":
        return "lost", f"no [DONE]: {body[-200:]}"
    last = got[-2] if len(got) > 1 else {}
    if isinstance(last, dict) and "error" in last and last.get("code"):
        return "failed", str(last["code"])
    if isinstance(last, dict) and last.get("usage", {}).get("completion_tokens"):
        return "completed", last["timing"]["pop"]
    return "lost", f"ended without usage or error: {body[-200:]}"


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (by walking /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def isolate_root(runtime_pid: int, bundle: Path) -> int | None:
    """The jail launcher (the isolate tree's root) of the worker whose bundle is `bundle`."""
    mark = f'"source": "{bundle}"'
    return next(
        (p for p in descendants(runtime_pid) if "runtime.isolate.jail" in cmdline(p) and mark in cmdline(p)),
        None,
    )


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def integrity(db: Path) -> str:
    """PRAGMA integrity_check of a SQLite file, read by a fresh connection."""
    import sqlite3

    conn = sqlite3.connect(db, timeout=10)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()
