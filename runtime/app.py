"""The HTTP front: every request goes to the worker's isolate; AI calls come back to the edge.

Per request: locate the client (x-edge-client-location or the config default), land it on its
nearest PoP (request.cf), invoke the worker, and answer with cf-ray and Server-Timing headers
that carry the latency account of the AI calls the worker made.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_sim.accounting import LatencyAccount
from edge_sim.edge import Edge
from edge_sim.remote import health_checks
from edge_sim.topology import Location, PoP, TopologyError
from runtime import ipc
from runtime.ai import AIService
from runtime.catalog import load_catalog, model_spec
from runtime.config import ConfigError, WorkerConfig
from runtime.isolate import Isolate, IsolateCrashed, WorkerLoadError
from workers import AIError

log = logging.getLogger("edge.runtime")

LOCATION_HEADER = "x-edge-client-location"
MAX_BODY_BYTES = 100 * 1024 * 1024  # Cloudflare's request body limit on the Free and Pro plans
CONTROL_PREFIX = "/cdn-cgi/edge/"

# Runtime error codes (Cloudflare's where one exists).
WORKER_EXCEPTION = 1101
WORKER_UNAVAILABLE = 1103
BAD_LOCATION = 1110
BODY_TOO_LARGE = 1113
BAD_CONTROL_REQUEST = 1120


class ReloadRequest(msgspec.Struct):
    model: str


@dataclass
class RequestContext:
    location: Location
    ingress: PoP
    client_rtt_ms: float
    accounts: list[LatencyAccount] = field(default_factory=list)
    quantization: list[str] = field(default_factory=list)  # per AI call, for x-edge-quantization


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


class Runtime:
    def __init__(self, config: WorkerConfig, edge: Edge):
        self.config = config
        self.edge = edge
        self.ai = AIService(edge)
        self.default_location = edge.locate(config.edge.client_location)
        self.isolate = Isolate(
            config.name,
            config.main_path,
            dict(config.vars),
            config.ai.binding if config.ai else None,
            self._on_ai_call,
        )
        self._requests: dict[int, RequestContext] = {}
        self._health_task: asyncio.Task | None = None

    async def start(self) -> None:
        remotes = self.edge.remote_nodes()
        if remotes:  # know their state before the first request, then keep checking
            await asyncio.gather(*(node.refresh() for node in remotes))
            self._health_task = asyncio.create_task(health_checks(remotes))
        try:
            await self.isolate.start()
        except WorkerLoadError as exc:  # keep serving: requests get a 503 naming the error until it is fixed
            log.error("%s\n%s", exc, exc.traceback)

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        await self.isolate.stop()
        self.edge.close()

    async def _on_ai_call(self, call: ipc.AICall) -> ipc.AIReply:
        ctx = self._requests.get(call.request)
        if ctx is None:
            return ipc.AIReply(
                call.call, error_code=5004, error_message="the request that made this call has ended"
            )
        try:
            result, account = await self.ai.run(
                call.model,
                call.inputs,
                ingress=ctx.ingress,
                client_rtt_ms=ctx.client_rtt_ms,
                account=self.config.account_id,
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
        return ipc.AIReply(call.call, result=result)

    async def _read_body(self, request: Request) -> bytes | None:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def handle(self, request: Request) -> Response:
        ray = secrets.token_hex(8)
        where = request.headers.get(LOCATION_HEADER)
        try:
            location = self.edge.locate(where) if where else self.default_location
        except TopologyError as exc:
            return error_response(400, BAD_LOCATION, f"{LOCATION_HEADER}: {exc}")
        ingress, client_rtt = self.edge.ingress(location)
        ray_header = {"cf-ray": f"{ray}-{ingress.code}"}

        body = await self._read_body(request)
        if body is None:
            return error_response(
                413,
                BODY_TOO_LARGE,
                f"request body exceeds {MAX_BODY_BYTES // (1024 * 1024)} MB; send less",
                ray_header,
            )
        ctx = RequestContext(location, ingress, client_rtt)
        if self.edge.emulate:  # the request's half of the client round trip, really waited
            await asyncio.sleep(client_rtt / 2000)
        rid = self.isolate.next_request_id()
        self._requests[rid] = ctx
        headers = [(k, v) for k, v in request.headers.items() if k != LOCATION_HEADER]
        try:
            outcome = await self.isolate.invoke(
                request.method,
                str(request.url),
                headers,
                body,
                cf_properties(location, ingress, client_rtt),
                request_id=rid,
            )
        except WorkerLoadError as exc:
            log.error("%s", exc)
            return error_response(503, WORKER_UNAVAILABLE, str(exc), ray_header)
        except IsolateCrashed as exc:
            return error_response(500, WORKER_EXCEPTION, f"Worker threw exception: {exc}", ray_header)
        finally:
            self._requests.pop(rid, None)

        timing = {"server-timing": ", ".join(a.server_timing() for a in ctx.accounts)} if ctx.accounts else {}
        if ctx.quantization:  # which compression served the answer: never hidden
            timing["x-edge-quantization"] = "; ".join(ctx.quantization)
        if isinstance(outcome, ipc.InvokeError):
            log.warning("worker %s threw: %s\n%s", self.config.name, outcome.message, outcome.traceback)
            return error_response(
                500, WORKER_EXCEPTION, f"Worker threw exception: {outcome.message}", ray_header | timing
            )
        if self.edge.emulate:  # and the response's half
            await asyncio.sleep(client_rtt / 2000)
        response = Response(outcome.body, status_code=outcome.status)
        for name, value in outcome.headers:
            response.headers.append(name, value)
        for name, value in (ray_header | timing).items():
            response.headers[name] = value
        return response

    async def pops(self, request: Request) -> Response:
        """Each GPU PoP: its engines' formats, KV occupancy, recent steps and expert load."""
        return JSONResponse({"pops": [node.status() for node in self.edge.nodes.values()]})

    async def reload_model(self, request: Request) -> Response:
        """Load a new version of a catalog model at every PoP; a PoP that refuses it (it fails
        verification, say) keeps serving the version it has and says why."""
        try:
            name = msgspec.json.decode(await request.body(), type=ReloadRequest).model
            catalog = load_catalog(self.config.models_dir)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return error_response(400, BAD_CONTROL_REQUEST, f'send {{"model": "<catalog name>"}} ({exc})')
        except ConfigError as exc:
            return error_response(500, BAD_CONTROL_REQUEST, str(exc))
        if name not in catalog:
            return error_response(
                404, BAD_CONTROL_REQUEST, f"{name!r} is not in the catalog ({', '.join(catalog)})"
            )
        outcome = await asyncio.to_thread(self.edge.reload, model_spec(self.config, name, catalog))
        status = 200 if all(v is None for v in outcome.values()) else 409
        return JSONResponse(
            {
                "model": name,
                "pops": {
                    code: {"loaded": reason is None, "refused": reason} for code, reason in outcome.items()
                },
            },
            status_code=status,
        )

    async def pop_state(self, request: Request) -> Response:
        """POST /cdn-cgi/edge/pops/{code}/down|up: take a GPU PoP out (its queued requests are
        re-routed) or bring it back."""
        code, action = request.path_params["code"].upper(), request.path_params["action"]
        node = self.edge.nodes.get(code)
        if node is None or action not in ("down", "up"):
            known = ", ".join(self.edge.nodes)
            return error_response(
                404, BAD_CONTROL_REQUEST, f"POST .../pops/<code>/down|up with a GPU PoP: {known}"
            )
        outcome = node.take_down() if action == "down" else node.bring_up()
        if inspect.isawaitable(outcome):  # a remote node answers over HTTP
            outcome = await outcome
        rerouted = outcome or 0
        log.warning(
            "PoP %s is %s%s", code, action, f" ({rerouted} queued request(s) re-routed)" if rerouted else ""
        )
        return JSONResponse({"code": code, "up": node.up, "rerouted": rerouted})

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok" if self.isolate.alive else "degraded",
                "worker": self.config.name,
                "pops": [
                    {"code": n.code, "up": n.up, "models": sorted(n.models())}
                    for n in self.edge.nodes.values()
                ],
                "models": self.edge.models(),
            }
        )


def create_app(runtime: Runtime) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return Starlette(
        routes=[
            Route(CONTROL_PREFIX + "health", runtime.health, methods=["GET"]),
            Route(CONTROL_PREFIX + "pops", runtime.pops, methods=["GET"]),
            Route(CONTROL_PREFIX + "models/reload", runtime.reload_model, methods=["POST"]),
            Route(CONTROL_PREFIX + "pops/{code}/{action}", runtime.pop_state, methods=["POST"]),
            Route("/{path:path}", runtime.handle, methods=methods),
        ],
        lifespan=lifespan,
    )
