"""A finished request as the live dashboard lists it (runtime.control.dashboard_feed): who sent it
where, its outcome, each AI call's latency account (measured, and modeled at full size) and its
last log lines, each field bounded so that a hostile worker cannot grow the dashboard's window."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import msgspec

from runtime.host.invocation import AI_CALLS_KEPT, Invocation
from runtime.host.spec import WorkerSpec

LOG_LINES = 20  # the last ones; the whole log is `edge tail`'s
LOG_CHARS = 300
PATH_CHARS = 200
AI_CALLS = 16


def request_entry(
    spec: WorkerSpec, ctx: Invocation, outcome: str, event: dict[str, Any], seconds: float
) -> dict[str, Any]:
    status = (event.get("response") or {}).get("status")
    kind = "fetch" if "request" in event else next(iter(event), "event")
    path = urlsplit(ctx.url).path if ctx.url else ""
    where = ctx.location  # None for an event no client sent (some Durable Object calls)
    calls = []
    for record in ctx.ai_answers[:AI_CALLS]:  # each answered call's record, as the headers report it
        call = msgspec.to_builtins(record.timing)
        call["model"], call["quantization"] = record.served, record.quantization
        calls.append(call)
    return {
        "t": ctx.started,
        "account": spec.account,
        "worker": spec.name,
        "kind": kind,
        "method": ctx.method,
        "path": path[:PATH_CHARS],
        "status": status,
        "outcome": outcome,
        "wall_ms": round(seconds * 1000, 3),
        "client": None if where is None else {"name": where.name[:80], "lat": where.lat, "lon": where.lon},
        "ingress": ctx.ingress.code if ctx.ingress is not None else "",
        "ai": calls,
        "ai_calls": len(ctx.ai_answers),
        # the calls that went through an AI Gateway: which, its log (`edge gateway logs`), its cache
        "gateway": [
            {"gateway": r.gateway[:64], "log": str(r.gateway_log_id)[:64], "cache": r.cache_status}
            for r in ctx.ai_calls[:AI_CALLS_KEPT]
            if r.gateway is not None
        ][:AI_CALLS],
        "logs": [
            {"level": str(e.get("level", ""))[:8], "message": str(e.get("message", ""))[:LOG_CHARS]}
            for e in ctx.logs[-LOG_LINES:]
        ],
    }
