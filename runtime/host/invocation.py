"""One invocation of a worker on the runtime's side (a fetch, an RPC or service call, a cron run, a
queue batch, an alarm, a socket event, a workflow run): the one object that owns what the request
is and spends, instead of a bag of fields that several modules write and others read later.

It owns where its client is (the origin of its AI calls' latency), its budgets (subrequests, binding
calls, log lines and bytes kept for the tail), its AI calls' records (runtime.control.ai_record: the
one record each call makes of itself, which its tail event and the headers that report its latency
and formats read), its console lines and its tail event, and the Durable Objects it is nested in.
Its time and CPU are the isolate's watchdog's (runtime.isolate.watchdog), and the calls it has in
flight end with it at the isolate (runtime.isolate.calls), both keyed by the same id.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from edge_sim.topology import Location, PoP
from runtime.control.ai_record import AIRecord
from runtime.host.spec import WorkerSpec
from runtime.isolate.console import WorkerConsole

LOG_LINES, LOG_BYTES = 256, 256 * 1024  # kept per invocation for the tail
# KV, D1, R2 and Durable Object calls per invocation (Workers KV's per-invocation operation limit)
BINDING_CALLS = 1000
AI_CALLS_KEPT = 64  # env.AI.run calls named in one tail event


@dataclass
class Invocation:
    location: Location
    ingress: PoP
    client_rtt_ms: float
    method: str = "GET"
    url: str = ""
    # the runtime's own scheme://host:port, as configured (never the request's Host): what URLs handed
    # to the worker start with; fetches back to its port are refused
    origin: str = ""
    # the records of the AI calls it made (env.AI.run, env.AI.gateway(id).run), as each call was
    # made: its tail event lists the first AI_CALLS_KEPT
    ai_calls: list[AIRecord] = field(default_factory=list)
    # the records of the calls a generation answered whole, in the order answered (a universal
    # gateway run's: the step's): their latency and formats are reported in its headers
    ai_answers: list[AIRecord] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    subrequests: int = 0
    binding_calls: int = 0
    log_bytes: int = 0
    logs_dropped: int = 0
    started: float = field(default_factory=time.time)
    console: Any = None  # its lines in edge dev's terminal (runtime.isolate.console.EventLines)
    # the Durable Objects whose calls this one is nested in, outermost first, ending with the one
    # it runs in (runtime.host.objects keys): set by the runtime only, to refuse a call cycle
    objects: tuple[tuple, ...] = ()

    def sub(self, method: str, url: str) -> Invocation:
        """A call this invocation makes to another worker or object: same client, fresh budgets,
        the chain of objects it is nested in kept."""
        return Invocation(
            self.location,
            self.ingress,
            self.client_rtt_ms,
            method=method,
            url=url,
            origin=self.origin,
            objects=self.objects,
        )

    # --- its budgets ---------------------------------------------------------------------------------

    def spend_subrequest(self, limit: int) -> str | None:
        """One outbound fetch or service call; why it is refused, past `limit`."""
        self.subrequests += 1
        if self.subrequests > limit:
            return f"Too many subrequests: the limit is {limit} per request"
        return None

    def spend_binding_call(self, kinds: str) -> str | None:
        """One KV, D1, R2 or Durable Object call; why it is refused, past BINDING_CALLS."""
        self.binding_calls += 1
        if self.binding_calls > BINDING_CALLS:
            return (
                f"Too many API requests by single worker invocation: at most {BINDING_CALLS} "
                f"{kinds} calls per request"
            )
        return None

    def keep_log(self, level: str, text: str, console: WorkerConsole) -> None:
        """A line the worker logged: shown at once (`console`, the worker's, makes its event's
        lines on the first), kept for the tail within LOG_LINES and LOG_BYTES, the rest counted."""
        if self.console is None:
            self.console = console.event()
        self.console.write(level, text)
        if len(self.logs) >= LOG_LINES or self.log_bytes + len(text) > LOG_BYTES:
            self.logs_dropped += 1
            return
        self.log_bytes += len(text)
        self.logs.append({"level": level, "message": text, "timestamp": int(time.time() * 1000)})  # ms

    # --- its AI calls --------------------------------------------------------------------------------

    def timing_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """`headers` and what its AI calls report: server-timing, and the compression that served
        them (never hidden)."""
        out = dict(headers)
        if self.ai_answers:
            out["server-timing"] = ", ".join(r.server_timing for r in self.ai_answers)
            out["x-edge-quantization"] = "; ".join(r.quantization for r in self.ai_answers)
        return out

    # --- its end -------------------------------------------------------------------------------------

    def tail_event(
        self, spec: WorkerSpec, outcome: str, exception: dict | None, event: dict, seconds: float
    ) -> dict[str, Any]:
        """The event `edge tail` shows (Cloudflare's shape; `event` says what kind it was), with a
        note for the log lines it was not allowed to keep; its console lines end here."""
        if self.console is not None:
            self.console.end()
        calls = [r.tail_entry() for r in self.ai_calls[:AI_CALLS_KEPT]]
        if self.logs_dropped:
            self.logs.append(
                {
                    "level": "warn",
                    "message": f"{self.logs_dropped} more log line(s) dropped: a request keeps at most "
                    f"{LOG_LINES} lines and {LOG_BYTES // 1024} KiB",
                    "timestamp": int(time.time() * 1000),
                }
            )
        return {
            "scriptName": spec.name,
            "scriptVersion": {"id": spec.version} if spec.version else None,
            "outcome": outcome,
            "eventTimestamp": int(self.started * 1000),  # milliseconds, as Cloudflare's tail
            "event": event,
            "logs": self.logs,
            "exceptions": [exception] if exception else [],
            "wallTimeMs": round(seconds * 1000, 3),
            **({"ai": calls} if calls else {}),
        }
