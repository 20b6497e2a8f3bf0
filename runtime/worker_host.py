"""One running worker (an account's script at one version) and the requests it is handling.

A WorkerHandle owns the worker's isolate and answers what the isolate asks of the runtime: AI
calls (to the edge), outbound fetches (through httpx, limited and checked), calls to its service
bindings, and log lines; when a request ends it records the outcome for `edge tail` and /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import secrets as pysecrets
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from edge_sim.accounting import LatencyAccount
from edge_sim.topology import Location, PoP
from runtime import ipc
from runtime.ai import workers_ai_sse
from runtime.bindings import BindingError, BindingRef
from runtime.fetch_guard import FetchError
from runtime.isolate import ExceededResources, Isolate, IsolateCrashed, IsolateLimits, WorkerLoadError
from runtime.objects import OBJECT_STORAGE, namespace_key
from workers import AIError

if TYPE_CHECKING:
    from runtime.app import Runtime

log = logging.getLogger("edge.worker")

LOCATION_HEADER = "x-edge-client-location"
WORKER_EXCEPTION = 1101
WORKER_LIMITS = 1102
WORKER_UNAVAILABLE = 1103
LOG_LINES, LOG_BYTES, LOG_LINE_CHARS = 256, 256 * 1024, 16 * 1024  # kept per request for the tail
BINDING_CALLS = (
    1000  # KV, D1, R2 and Durable Object calls per request (Workers KV's per-invocation operation limit)
)


class LogBudget:
    """Lines a worker may log outside any request: `rate` a second, bursts of up to `burst`."""

    def __init__(self, rate: float = 20.0, burst: int = 200):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class DurableObjectRef(msgspec.Struct, frozen=True):
    """A durable_objects.bindings entry: the class, and the worker that defines it (None: this one)."""

    class_name: str
    script_name: str | None = None


class ObjectAddress(msgspec.Struct, frozen=True):
    """The one Durable Object an isolate serves: its class and id (set by the runtime)."""

    class_name: str
    id: str


class WorkerSpec(msgspec.Struct, frozen=True):
    account: str
    name: str
    version: str | None  # None: the worker `edge dev` serves from the working tree
    script: str
    vars: dict[str, Any]
    ai_binding: str | None
    services: dict[str, str]  # binding -> worker of the same account
    limits: IsolateLimits
    subrequests: int = 50
    bindings: dict[str, BindingRef] = {}  # KV / D1 / R2: env name -> (kind, id), under `account`
    durable_objects: dict[str, DurableObjectRef] = {}  # env name -> the namespace it stands for
    durable_object: ObjectAddress | None = None  # set: this handle runs that object, not Default
    deps: str | None = None  # the project's installed dependencies (runtime.deps): /edge/deps inside


@dataclass
class RequestContext:
    location: Location
    ingress: PoP
    client_rtt_ms: float
    method: str = "GET"
    url: str = ""
    origin: str = ""  # scheme://host:port the runtime was reached at (fetches back to it are refused)
    accounts: list[LatencyAccount] = field(default_factory=list)
    quantization: list[str] = field(default_factory=list)  # per AI call, for x-edge-quantization
    logs: list[dict[str, Any]] = field(default_factory=list)
    subrequests: int = 0
    binding_calls: int = 0
    log_bytes: int = 0
    logs_dropped: int = 0
    started: float = field(default_factory=time.time)


class BodyTooLarge(Exception):
    pass


class ClientBody:
    """A client's request body as it arrives, passed on chunk by chunk; past `limit` bytes it
    stops with BodyTooLarge (the worker's read fails and the client gets 413)."""

    def __init__(self, stream: AsyncIterator[bytes], limit: int):
        self._stream, self.limit = stream, limit
        self.size, self.exceeded = 0, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self.size += len(chunk)
            if self.size > self.limit:
                self.exceeded = True
                raise BodyTooLarge(f"the request body is over {self.limit // (1024 * 1024)} MB")
            if chunk:
                yield chunk


def error_response(
    status: int, code: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def cf_properties(location: Location, ingress: PoP, client_rtt_ms: float) -> dict[str, Any]:
    """request.cf as Cloudflare fills it (coordinates as strings, RTT in ms)."""
    return {
        "colo": ingress.code,
        "city": location.city or ingress.city,
        "country": location.country or ingress.country,
        "continent": location.continent or ingress.continent,
        "latitude": f"{location.lat:.5f}",
        "longitude": f"{location.lon:.5f}",
        "timezone": location.timezone or ingress.timezone,
        "clientTcpRtt": round(client_rtt_ms),
    }


class WorkerHandle:
    def __init__(self, spec: WorkerSpec, runtime: Runtime):
        self.spec = spec
        self.runtime = runtime
        self.requests: dict[int, RequestContext] = {}
        self._background_logs = LogBudget()
        env = {**spec.vars, **runtime.state.secrets(spec.account, spec.name)}  # secrets never logged
        label = f"{spec.name}@{spec.version[:8]}" if spec.version else spec.name
        obj = spec.durable_object
        self.isolate = Isolate(
            f"{label}:{obj.class_name}:{obj.id[:8]}" if obj else label,
            Path(spec.script),
            env,
            spec.ai_binding,
            self._on_ai_call,
            services=list(spec.services),
            limits=spec.limits,
            on_fetch=self._on_fetch,
            on_log=self._on_log,
            bindings={name: ref.kind for name, ref in spec.bindings.items()},
            on_binding=self._on_binding,
            durable_objects={
                name: namespace_key(spec.account, ref.script_name or spec.name, ref.class_name)
                for name, ref in spec.durable_objects.items()
            },
            on_object=self._on_object,
            durable_object=(obj.class_name, obj.id) if obj else None,
            deps=Path(spec.deps) if spec.deps else None,
        )

    @property
    def label(self) -> str:
        return self.spec.name

    # --- what the isolate asks of the runtime -------------------------------------------------------

    async def _on_ai_call(self, call: ipc.AICall):
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.AIReply(
                call.call, error_code=5004, error_message="the request that made this call has ended"
            )
        ai = self.runtime.ai
        try:
            if isinstance(call.inputs, dict) and call.inputs.get("stream") is True:
                req, _ = ai.prepare(call.model, call.inputs, self.spec.account)
                return self._ai_stream(call, req, ctx)
            result, account = await ai.run(
                call.model,
                call.inputs,
                ingress=ctx.ingress,
                client_rtt_ms=ctx.client_rtt_ms,
                account=self.spec.account,
            )
        except AIError as exc:
            return ipc.AIReply(call.call, error_code=exc.code, error_message=exc.detail)
        except Exception as exc:  # an engine bug must not take the runtime down with it
            log.exception("AI call failed")
            return ipc.AIReply(
                call.call, error_code=3007, error_message=f"internal error: {type(exc).__name__}"
            )
        ctx.accounts.append(account)
        q = result["quantization"]
        ctx.quantization.append(
            ", ".join([*(f"{p}={f}" for p, f in q["weights_by_part"].items()), f"kv_cache={q['kv_cache']}"])
        )
        self.runtime.metrics.ai_tokens(call.model, result["usage"])
        return ipc.AIReply(call.call, result=result)

    async def _ai_stream(self, call: ipc.AICall, req, ctx: RequestContext):
        """env.AI.run(..., {stream: true}): SSE bytes as AIChunk messages, then the closing AIReply."""
        async for data in workers_ai_sse(
            self.runtime.ai, req, call.model, ingress=ctx.ingress, client_rtt_ms=ctx.client_rtt_ms
        ):
            yield ipc.AIChunk(call.call, data)
        yield ipc.AIReply(call.call)

    def _on_log(self, msg: ipc.Log) -> None:
        """A line the worker logged. Each request keeps at most LOG_LINES lines and LOG_BYTES
        (the rest is counted and noted once in its tail event); lines outside any request share
        a budget that refills over time. The isolate's own counting is not trusted."""
        ctx = self.requests.get(msg.request)
        text = msg.message[:LOG_LINE_CHARS]
        entry = {"level": msg.level[:16], "message": text, "timestamp": int(time.time() * 1000)}  # ms
        if ctx is not None:
            if len(ctx.logs) >= LOG_LINES or ctx.log_bytes + len(text) > LOG_BYTES:
                ctx.logs_dropped += 1
                return
            ctx.log_bytes += len(text)
            ctx.logs.append(entry)
            return
        if not self._background_logs.take():  # module-level output, waitUntil after the response
            return
        self.runtime.tail.publish(
            self.spec.account,
            self.spec.name,
            {
                "outcome": "log",
                "scriptName": self.spec.name,
                "logs": [entry],
                "eventTimestamp": int(time.time() * 1000),  # milliseconds, as Cloudflare's tail
            },
        )

    async def _on_fetch(self, call: ipc.FetchCall) -> ipc.FetchReply:
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.FetchReply(call.call, error="fetch outside a request is not allowed")
        ctx.subrequests += 1
        if ctx.subrequests > self.spec.subrequests:
            return ipc.FetchReply(
                call.call, error=f"Too many subrequests: the limit is {self.spec.subrequests} per request"
            )
        if call.service is not None:
            return await self.runtime.call_service(self, call, ctx)
        try:  # checked by address on every hop, pinned to the checked address, body capped
            r = await self.runtime.fetch_guard.fetch(
                call.method,
                call.url,
                call.headers,
                call.body,
                runtime_origin=ctx.origin,
                refuse_host=lambda host: self.runtime.refuse_worker_host(self.spec.account, host),
            )
        except FetchError as exc:
            return ipc.FetchReply(call.call, error=str(exc))
        return ipc.FetchReply(call.call, r.status, r.headers, r.body)

    async def _on_binding(self, call: ipc.BindingCall) -> ipc.BindingReply:
        """env.NAME.method(...) on a KV, D1 or R2 binding: the name is looked up in this worker's
        own spec (the isolate cannot pick an id) and the store is this worker's account's."""
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.BindingReply(
                call.call, error_type="Error", error_message="the request that made this call has ended"
            )
        obj = self.spec.durable_object
        ref = self.spec.bindings.get(call.binding)
        if obj is not None and call.binding == OBJECT_STORAGE:
            ref = BindingRef("do", obj.id)  # this object's own storage: the isolate cannot name another
        if ref is None:
            return ipc.BindingReply(
                call.call,
                error_type="TypeError",
                error_message=f"no KV, D1 or R2 binding named {call.binding!r}",
            )
        ctx.binding_calls += 1
        if ctx.binding_calls > BINDING_CALLS:
            return ipc.BindingReply(
                call.call,
                error_type="Error",
                error_message=f"Too many API requests by single worker invocation: at most {BINDING_CALLS} "
                "KV, D1 and R2 calls per request",
            )
        try:
            if ref.kind == "do" and obj is not None:
                result = await self.runtime.bindings.call_object_storage(
                    self.spec.account,
                    self.spec.name,
                    obj.class_name,
                    obj.id,
                    call.method,
                    call.args,
                    call.kwargs,
                )
            else:
                result = await self.runtime.bindings.call(
                    self.spec.account, ref, call.method, call.args, call.kwargs
                )
        except BindingError as exc:
            return ipc.BindingReply(call.call, error_type=exc.type, error_message=str(exc))
        return ipc.BindingReply(call.call, result=result)

    async def _on_object(self, call: ipc.ObjectCall) -> ipc.ObjectReply:
        """`env.NS.get(id).method(...)`: the runtime's Durable Objects run it in that object."""
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.ObjectReply(
                call.call, error_type="Error", error_message="the request that made this call has ended"
            )
        ctx.binding_calls += 1
        if ctx.binding_calls > BINDING_CALLS:
            return ipc.ObjectReply(
                call.call,
                error_type="Error",
                error_message=f"Too many API requests by single worker invocation: at most {BINDING_CALLS} "
                "KV, D1, R2 and Durable Object calls per request",
            )
        return await self.runtime.objects.call(self, call, ctx)

    async def call_object(
        self, method: str, args: list, kwargs: dict, ctx: RequestContext
    ) -> ipc.ObjectResult | ipc.InvokeError:
        """Run `method` on the Durable Object this handle serves (its isolate started if need be)."""
        rid = self.isolate.next_request_id()
        self.requests[rid] = ctx
        try:
            return await self.isolate.call_object(method, args, kwargs, request_id=rid)
        finally:
            self.requests.pop(rid, None)

    # --- serving a request --------------------------------------------------------------------------

    async def serve(
        self,
        request: Request,
        body: bytes | AsyncIterator[bytes],
        ctx: RequestContext,
        headers_out: dict[str, str],
        extra_headers: list[tuple[str, str]] = (),
    ) -> Response:
        rid = self.isolate.next_request_id()
        self.requests[rid] = ctx
        headers = [(k, v) for k, v in request.headers.items() if k != LOCATION_HEADER] + list(extra_headers)
        outcome_name, exception = "ok", None
        try:
            outcome = await self.isolate.invoke(
                request.method,
                str(request.url),
                headers,
                body,
                cf_properties(ctx.location, ctx.ingress, ctx.client_rtt_ms),
                request_id=rid,
            )
        except WorkerLoadError as exc:
            self._finish(rid, ctx, "exception", {"name": "WorkerLoadError", "message": str(exc)}, 503)
            return error_response(503, WORKER_UNAVAILABLE, str(exc), headers_out)
        except ExceededResources as exc:
            self._finish(rid, ctx, exc.outcome, None, 500)
            return error_response(500, WORKER_LIMITS, str(exc), headers_out)
        except IsolateCrashed as exc:
            self._finish(rid, ctx, "exception", {"name": "IsolateCrashed", "message": str(exc)}, 500)
            return error_response(500, WORKER_EXCEPTION, f"Worker threw exception: {exc}", headers_out)
        except BaseException:
            self.requests.pop(rid, None)
            raise
        if isinstance(outcome, ipc.InvokeStart):  # a streamed body: the request lives until it ends
            return self._streamed(outcome, rid, ctx, headers_out)
        timing = dict(headers_out)
        if ctx.accounts:
            timing["server-timing"] = ", ".join(a.server_timing() for a in ctx.accounts)
        if ctx.quantization:  # which compression served the answer: never hidden
            timing["x-edge-quantization"] = "; ".join(ctx.quantization)
        if isinstance(outcome, ipc.InvokeError):
            if outcome.message.startswith("MemoryError"):  # the isolate's memory cap held
                self._finish(rid, ctx, "exceededMemory", None, 500)
                await self.isolate.stop()  # replaced on the next request
                return error_response(500, WORKER_LIMITS, "Worker exceeded resource limits: memory", timing)
            name, _, message = outcome.message.partition(": ")
            exception = {"name": name, "message": message, "stack": outcome.traceback}
            log.warning("worker %s threw: %s\n%s", self.spec.name, outcome.message, outcome.traceback)
            self._finish(rid, ctx, "exception", exception, 500)
            return error_response(500, WORKER_EXCEPTION, f"Worker threw exception: {outcome.message}", timing)
        if self.runtime.edge.emulate:  # the response's half of the client round trip
            await asyncio.sleep(ctx.client_rtt_ms / 2000)
        response = Response(outcome.body, status_code=outcome.status)
        for name, value in outcome.headers:
            response.headers.append(name, value)
        for name, value in timing.items():
            response.headers[name] = value
        self._finish(rid, ctx, outcome_name, exception, outcome.status)
        return response

    def _streamed(
        self, start: ipc.InvokeStart, rid: int, ctx: RequestContext, headers: dict[str, str]
    ) -> Response:
        async def body():
            outcome, exception = "ok", None
            try:
                async for chunk in self.isolate.body(rid):
                    yield chunk
            except IsolateCrashed as exc:  # cut the connection: a partial body is not a whole one
                outcome = exc.outcome if isinstance(exc, ExceededResources) else "exception"
                exception = {"name": type(exc).__name__, "message": str(exc)}
                raise
            finally:
                self._finish(rid, ctx, outcome, exception, start.status)

        response = StreamingResponse(body(), status_code=start.status)
        for name, value in start.headers:
            response.headers.append(name, value)
        for name, value in headers.items():
            response.headers[name] = value
        return response

    def _finish(
        self, rid: int, ctx: RequestContext, outcome: str, exception: dict | None, status: int
    ) -> None:
        self.requests.pop(rid, None)
        request = {"method": ctx.method, "url": ctx.url, "cf": {"colo": ctx.ingress.code}}
        self._publish(ctx, outcome, exception, {"request": request, "response": {"status": status}})

    def _publish(self, ctx: RequestContext, outcome: str, exception: dict | None, event: dict) -> None:
        """An event is over: count it and tail it as Cloudflare's tail shows one (`event` carries
        what kind it was), with a note for the log lines it was not allowed to keep."""
        if ctx.logs_dropped:
            ctx.logs.append(
                {
                    "level": "warn",
                    "message": f"{ctx.logs_dropped} more log line(s) dropped: a request keeps at most "
                    f"{LOG_LINES} lines and {LOG_BYTES // 1024} KiB",
                    "timestamp": int(time.time() * 1000),
                }
            )
        seconds = time.time() - ctx.started
        self.runtime.metrics.request(self.spec.name, outcome, seconds)
        self.runtime.tail.publish(
            self.spec.account,
            self.spec.name,
            {
                "scriptName": self.spec.name,
                "scriptVersion": {"id": self.spec.version} if self.spec.version else None,
                "outcome": outcome,
                "eventTimestamp": int(ctx.started * 1000),  # milliseconds, as Cloudflare's tail
                "event": event,
                "logs": ctx.logs,
                "exceptions": [exception] if exception else [],
                "wallTimeMs": round(seconds * 1000, 3),
            },
        )

    async def _event(self, kind: str, event: dict[str, Any], run) -> tuple[str, dict | None, Any]:
        """A worker event that is no HTTP request (a cron run, a queue batch): `run(rid)` returns
        (the isolate's answer, anything else the caller needs). Returns (outcome, exception, that
        other thing, None when the isolate broke the protocol), and tails it as Cloudflare shows
        such events (`event` carries their fields). AI calls made in it start at the PoP the
        config's client_location lands on."""
        location = self.runtime.default_location
        ingress, _ = self.runtime.edge.ingress(location)
        ctx = RequestContext(location, ingress, 0.0, method="", url="")
        rid = self.isolate.next_request_id()
        self.requests[rid] = ctx
        outcome, exception, extra = "ok", None, None
        try:
            result, extra = await run(rid)
            if isinstance(result, ipc.InvokeError) and result.message.startswith("MemoryError"):
                outcome = "exceededMemory"
                await self.isolate.stop()  # replaced on the next event
            elif isinstance(result, ipc.InvokeError):
                name, _, message = result.message.partition(": ")
                outcome = "exception"
                exception = {"name": name, "message": message, "stack": result.traceback}
                log.warning(
                    "worker %s threw in %s: %s\n%s", self.spec.name, kind, result.message, result.traceback
                )
            elif not isinstance(result, ipc.InvokeResult):  # a body for such an event: broken
                outcome, extra = "exception", None
                exception = {"name": "IsolateCrashed", "message": "the isolate broke the IPC protocol"}
                await self.isolate.stop()
        except WorkerLoadError as exc:
            outcome, exception = "exception", {"name": "WorkerLoadError", "message": str(exc)}
        except ExceededResources as exc:
            outcome, exception = exc.outcome, {"name": "ExceededResources", "message": str(exc)}
        except IsolateCrashed as exc:
            outcome, exception = "exception", {"name": "IsolateCrashed", "message": str(exc)}
        finally:
            self.requests.pop(rid, None)
        self._publish(ctx, outcome, exception, event)
        return outcome, exception, extra

    async def schedule(self, cron: str, scheduled_time_ms: int) -> tuple[str, dict | None]:
        """Run the worker's scheduled handler for `cron` (a Cron Trigger fired, or
        /cdn-cgi/handler/scheduled); returns (outcome, exception); tailed with
        `event: {cron, scheduledTime}`."""

        async def run(rid: int):
            return await self.isolate.schedule(cron, scheduled_time_ms, request_id=rid), None

        event = {"cron": cron, "scheduledTime": scheduled_time_ms}
        outcome, exception, _ = await self._event("scheduled", event, run)
        return outcome, exception

    async def deliver(
        self, queue: str, messages: list[ipc.QueuedMessage]
    ) -> tuple[str, list[str], dict[str, int | None]]:
        """Run the worker's queue handler on a batch of `queue`'s messages; returns (outcome,
        acked ids, {retried id: delay or None}); tailed with `event: {queue, batchSize}`. What the
        isolate reports is held to the batch: an id not in it is ignored, a message it does not
        account for is retried."""

        async def run(rid: int):
            return await self.isolate.deliver(queue, messages, request_id=rid)

        event = {"queue": queue, "batchSize": len(messages)}
        outcome, _, settled = await self._event("queue", event, run)
        ids = {m.id for m in messages}
        acked = [i for i in dict.fromkeys(settled.acked) if i in ids] if settled else []
        retried: dict[str, int | None] = {}
        for m in messages:
            if m.id not in acked:
                delay = settled.retried.get(m.id) if settled else None
                retried[m.id] = delay if isinstance(delay, int) and delay >= 0 else None
        return outcome, acked, retried

    def note(self, level: str, message: str) -> None:
        """A line of the runtime's own about this worker for edge tail (a queue message dropped)."""
        now_ms = int(time.time() * 1000)
        self.runtime.tail.publish(
            self.spec.account,
            self.spec.name,
            {
                "outcome": "log",
                "scriptName": self.spec.name,
                "logs": [{"level": level, "message": message, "timestamp": now_ms}],
                "eventTimestamp": now_ms,
            },
        )

    async def stop(self) -> None:
        await self.isolate.stop()


class TailHub:
    """Live events per worker for `edge tail`: every subscriber gets every event after it joined."""

    def __init__(self) -> None:
        self._subscribers: dict[tuple[str, str], set[asyncio.Queue]] = {}

    def subscribe(self, account: str, worker: str) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(maxsize=10_000)
        self._subscribers.setdefault((account, worker), set()).add(queue)
        return queue

    def unsubscribe(self, account: str, worker: str, queue: asyncio.Queue) -> None:
        self._subscribers.get((account, worker), set()).discard(queue)

    def publish(self, account: str, worker: str, event: dict[str, Any]) -> None:
        for queue in self._subscribers.get((account, worker), ()):
            if not queue.full():  # a subscriber that cannot keep up loses events, not the runtime
                queue.put_nowait(event)


def ray_id() -> str:
    return pysecrets.token_hex(8)


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def urlhost(url: str) -> tuple[str, int | None, str]:
    parts = urlsplit(url)
    return (parts.hostname or "").lower(), parts.port, parts.path or "/"
