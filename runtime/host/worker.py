"""One running worker (an account's script at one version) and the requests it is handling.

A WorkerHandle owns the worker's isolate: it sends it requests, cron runs and queue batches, and
when one ends records the outcome for `edge tail` and /metrics. What the isolate asks of the
runtime meanwhile is answered by runtime.host.worker_calls, with the services the runtime handed in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime.bindings.kinds import sdk_clients
from runtime.control.tail import log_event
from runtime.host.invocation import Invocation
from runtime.host.objects import namespace_key
from runtime.host.request_entry import request_entry
from runtime.host.services import WorkerServices
from runtime.host.sockets import ServerSocket, SocketEvent, SocketOwner, SocketUpgrade
from runtime.host.spec import WorkerSpec, cf_properties
from runtime.host.worker_calls import WorkerCalls
from runtime.http.errors import WORKER_EXCEPTION, WORKER_LIMITS, WORKER_UNAVAILABLE, error_response
from runtime.http.headers import LOCATION_HEADER
from runtime.isolate import ipc
from runtime.isolate.console import WorkerConsole, indented
from runtime.isolate.process import ExceededResources, Isolate, IsolateCrashed, WorkerLoadError

ObjectAnswer = ipc.ObjectResult | ipc.InvokeError

log = logging.getLogger("edge.worker")


class WorkerHandle:
    def __init__(self, spec: WorkerSpec, services: WorkerServices):
        self.spec = spec
        self.services = services
        self.requests: dict[int, Invocation] = {}
        label = f"{spec.name}@{spec.version[:8]}" if spec.version else spec.name
        obj = spec.durable_object
        if spec.workflow is not None:
            label = f"{label}:{spec.workflow.class_name}"
        # its console lines in edge dev's terminal: [name], [name:Counter(1a2b3c4d)] for an object
        self.console = WorkerConsole(f"{label}:{obj.class_name}({obj.id[:8]})" if obj else label)
        self.calls = WorkerCalls(spec, self.requests, services, self.console)
        calls = self.calls  # the isolate's calls and lines, answered by it directly
        self.ai, self.fetch, self.binding, self.object = calls.ai, calls.fetch, calls.binding, calls.object
        self.ai_query, self.ai_gateway, self.ai_gateway_run = (
            calls.ai_query,
            calls.ai_gateway,
            calls.ai_gateway_run,
        )
        self.log, self.output = calls.log, calls.output
        # its WebSockets (a Durable Object's handle is given its object's, which outlive it)
        self.sockets = SocketOwner(services.sockets, spec.account, self.console.label, self.socket_event)
        stored = services.secrets.secrets(spec.account, spec.name)
        env = {**spec.vars, **stored, **spec.local_secrets}  # secrets never logged
        self.isolate = Isolate(
            f"{label}:{obj.class_name}:{obj.id[:8]}" if obj else label,
            Path(spec.script),
            env,
            spec.ai_binding,
            self,  # its host: the calls answered by self.calls, its sockets by self.sockets
            services=list(spec.services),
            limits=spec.limits,
            bindings=sdk_clients(spec.bindings),
            durable_objects={
                name: namespace_key(spec.account, ref.script_name or spec.name, ref.class_name)
                for name, ref in spec.durable_objects.items()
            },
            durable_object=(obj.class_name, obj.id) if obj else None,
            deps=Path(spec.deps) if spec.deps else None,
            workflow=spec.workflow.class_name if spec.workflow else None,
        )
        self._offers: dict[int, ServerSocket | str] = {}  # request -> the socket its 101 carried
        self._background: set[asyncio.Task] = set()

    @property
    def label(self) -> str:
        return self.spec.name

    # --- the isolate's host (runtime.isolate.host.IsolateHost): its calls and lines are answered by
    # self.calls (WorkerCalls' bound methods, set in __init__), its sockets here -----------------------

    def socket(self, msg: ipc.SocketSend | ipc.SocketClose | ipc.SocketAttach) -> None:
        self.sockets.from_isolate(msg)

    def held_sockets(self) -> tuple[int, list[ipc.HeldSocket]]:
        return self.sockets.next_id, self.sockets.held()

    def socket_offer(self, msg: ipc.InvokeResult) -> None:
        """A 101 from the isolate, as it is read (before the frames that follow it on the socket)."""
        offer = msg.web_socket
        if offer is not None and offer.token is None and msg.status == 101:
            self._offers[msg.id] = self.sockets.open(offer, self.isolate.generation)

    def exited(self) -> None:
        self.sockets.isolate_gone()

    async def call_object(self, method: str, args: list, kwargs: dict, ctx: Invocation) -> ObjectAnswer:
        """Run `method` on the Durable Object this handle serves (its isolate started if need be);
        tailed as Cloudflare tails one, with `event: {rpcMethod}` (not counted as a request)."""
        rid = self.isolate.next_request_id()
        return await self._tailed_event(
            rid, ctx, self.isolate.call_object(method, args, kwargs, request_id=rid), {"rpcMethod": method}
        )

    async def run_workflow(self, rid: int, instance_id: str, payload: Any, timestamp_ms: int) -> ObjectAnswer:
        """One run of a workflow instance (`rid` from isolate.next_request_id, so that the caller
        knows which run each step call belongs to); tailed with `event: {workflow, instanceId}`.
        Raises what the isolate raises (ExceededResources, IsolateCrashed, WorkerLoadError)."""
        location, ingress = self.services.event_origin()
        ctx = Invocation(location, ingress, 0.0, method="", url="", origin=self.services.origin)
        ctx.console = self.console.event(f"workflow({instance_id[:12]})")
        name = self.spec.workflow.name if self.spec.workflow else ""
        return await self._tailed_event(
            rid,
            ctx,
            self.isolate.run_workflow(instance_id, payload, timestamp_ms, request_id=rid),
            {"workflow": name, "instanceId": instance_id},
        )

    async def _tailed_event(
        self, rid: int, ctx: Invocation, call: Awaitable[ObjectAnswer], event: dict
    ) -> ObjectAnswer:
        """Await an isolate call that is not a request (an RPC, a workflow run) under request id
        `rid`, and tail its outcome with `event` (not counted as a request)."""
        self.requests[rid] = ctx
        outcome, exception = "canceled", None
        try:
            result = await call
            if isinstance(result, ipc.InvokeError):
                name, _, message = result.message.partition(": ")
                outcome, exception = (
                    "exception",
                    {"name": name, "message": message, "stack": result.traceback},
                )
            else:
                outcome = "ok"
            return result
        except (ExceededResources, IsolateCrashed, WorkerLoadError) as exc:
            outcome = exc.outcome if isinstance(exc, ExceededResources) else "exception"
            exception = {"name": type(exc).__name__, "message": str(exc)}
            raise
        finally:
            self.requests.pop(rid, None)
            self._publish(ctx, outcome, exception, event, count=False)

    # --- serving a request --------------------------------------------------------------------------

    async def serve(
        self,
        request: Request,
        body: bytes | AsyncIterator[bytes],
        ctx: Invocation,
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
            if isinstance(sock := self._offers.pop(rid, None), ServerSocket):  # cancelled meanwhile
                sock.cut(1001, "the request was cancelled")
            raise
        if isinstance(outcome, ipc.InvokeStart):  # a streamed body: the request lives until it ends
            return self._streamed(outcome, rid, ctx, headers_out)
        timing = ctx.timing_headers(headers_out)
        if isinstance(outcome, ipc.InvokeError):
            if outcome.message.startswith("MemoryError"):  # the isolate's memory cap held
                self._finish(rid, ctx, "exceededMemory", None, 500)
                await self.isolate.stop()  # replaced on the next request
                return error_response(500, WORKER_LIMITS, "Worker exceeded resource limits: memory", timing)
            name, _, message = outcome.message.partition(": ")
            exception = {"name": name, "message": message, "stack": outcome.traceback}
            log.warning(
                "worker %s threw: %s", self.spec.name, indented(f"{outcome.message}\n{outcome.traceback}")
            )
            self._finish(rid, ctx, "exception", exception, 500)
            return error_response(500, WORKER_EXCEPTION, f"Worker threw exception: {outcome.message}", timing)
        if outcome.status == 101:  # a WebSocket: its client is attached by the front (or passed on)
            upgrade = self._upgrade(outcome)
            if isinstance(upgrade, str):
                self._finish(rid, ctx, "exception", {"name": "Error", "message": upgrade}, 500)
                return error_response(500, WORKER_EXCEPTION, f"Worker threw exception: {upgrade}", timing)
            self._finish(rid, ctx, outcome_name, exception, 101)
            return upgrade
        if self.services.network.emulate:  # the response's half of the client round trip
            await asyncio.sleep(ctx.client_rtt_ms / 2000)
        response = Response(outcome.body, status_code=outcome.status)
        for name, value in outcome.headers:
            response.headers.append(name, value)
        for name, value in timing.items():
            response.headers[name] = value
        self._finish(rid, ctx, outcome_name, exception, outcome.status)
        return response

    def _upgrade(self, outcome: ipc.InvokeResult) -> SocketUpgrade | str:
        """The socket a 101 carries: one of this isolate's pairs, or one its object passed on."""
        offer = outcome.web_socket
        if offer is None:
            return "a 101 response needs web_socket=client (the client end of a WebSocketPair)"
        if offer.token is not None:
            sock = self.services.sockets.claim(offer.token, self.spec.account)
            if sock is None:
                return "the response's WebSocket is not one this worker's Durable Objects answered with"
        else:
            sock = self._offers.pop(outcome.id, None) or "the response's WebSocket was not taken"
            if isinstance(sock, str):  # refused: the isolate's server end is closed, so it lets go
                self._tell_closed(offer.ws, sock)
                return sock
        return SocketUpgrade(sock, list(outcome.headers))

    def _tell_closed(self, ws: int, why: str) -> None:
        generation = self.isolate.generation

        async def tell() -> None:
            if not self.isolate.alive or self.isolate.generation != generation:
                return  # its end went with the process: never start one just to say so
            event = SocketEvent("close", code=1011, reason=why[:123], was_clean=False)
            try:
                await self.isolate.socket_event(lambda rid: event.message(rid, ws))
            except Exception:  # the isolate is gone: so is its end
                pass

        task = asyncio.ensure_future(tell())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def socket_event(self, sock: ServerSocket, event: SocketEvent) -> None:
        """A client's message or close for one of the sockets this handle's isolate holds; tailed
        with `event: {webSocket}`. A socket whose isolate has stopped since (it did not hibernate
        with its object) is closed instead."""
        if not sock.hibernatable and (sock.generation != self.isolate.generation or not self.isolate.alive):
            sock.cut(1012, "the worker's isolate stopped", tell_worker=False)
            return

        async def run(rid: int):
            return await self.isolate.socket_event(lambda r: event.message(r, sock.ws), request_id=rid), None

        key = self.spec.durable_object
        objects = (
            ((self.spec.account, self.spec.name, self.spec.version, key.class_name, key.id),) if key else ()
        )
        await self._event(
            "websocket", f"websocket({event.kind})", {"webSocket": {"kind": event.kind}}, run, objects
        )

    def _streamed(
        self, start: ipc.InvokeStart, rid: int, ctx: Invocation, headers: dict[str, str]
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

    def _finish(self, rid: int, ctx: Invocation, outcome: str, exception: dict | None, status: int) -> None:
        self.requests.pop(rid, None)
        request = {"method": ctx.method, "url": ctx.url, "cf": {"colo": ctx.ingress.code}}
        self._publish(ctx, outcome, exception, {"request": request, "response": {"status": status}})

    def _publish(
        self, ctx: Invocation, outcome: str, exception: dict | None, event: dict, count: bool = True
    ) -> None:
        """An event is over: count it (unless not `count`) and tail it as Cloudflare's tail shows
        one (`event` carries what kind it was)."""
        seconds = time.time() - ctx.started
        if count:
            self.services.metrics.request(self.spec.name, outcome, seconds)
        tail = ctx.tail_event(self.spec, outcome, exception, event, seconds)
        self.services.tail.publish(self.spec.account, self.spec.name, tail)
        self.services.feed.request(request_entry(self.spec, ctx, outcome, event, seconds))

    async def _event(
        self, kind: str, tag: str, event: dict[str, Any], run, objects: tuple = ()
    ) -> tuple[str, dict | None, Any]:
        """A worker event that is no HTTP request (a cron run, a queue batch): `run(rid)` returns
        (the isolate's answer, anything else the caller needs). Returns (outcome, exception, that
        other thing, None when the isolate broke the protocol), and tails it as Cloudflare shows
        such events (`event` carries their fields); its console lines show under `tag` (as
        `cron(*/5 * * * *)`). AI calls made in it start at the PoP the config's client_location
        lands on."""
        location, ingress = self.services.event_origin()
        ctx = Invocation(
            location, ingress, 0.0, method="", url="", origin=self.services.origin, objects=objects
        )
        ctx.console = self.console.event(tag)
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
                    "worker %s threw in %s: %s",
                    self.spec.name,
                    kind,
                    indented(f"{result.message}\n{result.traceback}"),
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
        outcome, exception, _ = await self._event("scheduled", f"cron({cron})", event, run)
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
        outcome, _, settled = await self._event("queue", f"queue({queue})", event, run)
        ids = {m.id for m in messages}
        acked = [i for i in dict.fromkeys(settled.acked) if i in ids] if settled else []
        retried: dict[str, int | None] = {}
        for m in messages:
            if m.id not in acked:
                delay = settled.retried.get(m.id) if settled else None
                retried[m.id] = delay if isinstance(delay, int) and delay >= 0 else None
        return outcome, acked, retried

    async def alarm(
        self, retry_count: int, scheduled_ms: int, objects: tuple = ()
    ) -> tuple[str, dict | None]:
        """Run the alarm handler of the Durable Object this handle serves; returns (outcome,
        exception); tailed as Cloudflare tails one, with `event: {scheduledTime}`. `objects`: the
        object's own key, for the call-cycle books."""

        async def run(rid: int):
            return await self.isolate.alarm(retry_count, request_id=rid), None

        event = {"scheduledTime": scheduled_ms, "retryCount": retry_count}
        outcome, exception, _ = await self._event("alarm", "alarm", event, run, objects)
        return outcome, exception

    def note(self, level: str, message: str) -> None:
        """A line of the runtime's own about this worker for edge tail (a queue message dropped)."""
        entry = {"level": level, "message": message, "timestamp": int(time.time() * 1000)}
        self.services.tail.publish(self.spec.account, self.spec.name, log_event(self.spec.name, [entry]))

    async def stop(self) -> None:
        await self.isolate.stop()
        self.sockets.isolate_gone()
