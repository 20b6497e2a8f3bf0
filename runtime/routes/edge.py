"""The runtime's own endpoints under /cdn-cgi/: the readiness probe and metrics (open; metrics
per worker with the admin token), the GPU PoPs' state, taking a PoP down or up and reloading a
model (admin), and /cdn-cgi/handler/scheduled (run the dev worker's scheduled handler once)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from edge_sim.edge import Edge
from edge_sim.errors import EdgeError
from runtime.ai.catalog import load_catalog, model_spec
from runtime.control.admin import CONTROL_BODY_BYTES, check_admin, read_capped
from runtime.control.config import ConfigError, WorkerConfig
from runtime.control.metrics import CONTENT_TYPE, Metrics
from runtime.http.errors import (
    ADMIN_AUTH,
    BAD_CONTROL_REQUEST,
    BODY_TOO_LARGE,
    WORKER_EXCEPTION,
    WORKER_LIMITS,
    WORKER_UNAVAILABLE,
    error_response,
)
from runtime.http.json_body import BadJSON, decode_json

log = logging.getLogger("edge.runtime")

CONTROL_PREFIX = "/cdn-cgi/edge/"

RunScheduled = Callable[[str, int], Awaitable[tuple[str, dict | None]]]


class ReloadRequest(msgspec.Struct):
    model: str


class EdgeEndpoints:
    def __init__(
        self,
        config: WorkerConfig,
        edge: Edge,
        metrics: Metrics,
        dev_alive: Callable[[], bool],
        run_scheduled: RunScheduled,
        admin_token: str | None,
    ):
        self.config, self.edge, self.metrics = config, edge, metrics
        self.dev_alive, self.run_scheduled = dev_alive, run_scheduled
        self.admin_token = admin_token  # None refuses every admin call

    def routes(self) -> list[Route]:
        return [
            Route(CONTROL_PREFIX + "health", self.health, methods=["GET"]),
            Route(CONTROL_PREFIX + "pops", self.pops, methods=["GET"]),
            Route(CONTROL_PREFIX + "metrics", self.metrics_endpoint, methods=["GET"]),
            Route(CONTROL_PREFIX + "models/reload", self.reload_model, methods=["POST"]),
            Route(CONTROL_PREFIX + "pops/{code}/{action}", self.pop_state, methods=["POST"]),
            Route("/cdn-cgi/handler/scheduled", self.scheduled_endpoint, methods=["GET"]),
        ]

    def is_admin(self, request: Request) -> bool:
        return check_admin(request.headers.get("authorization"), self.admin_token) is None

    async def admin_body(self, request: Request) -> bytes | Response:
        """The body of a control request from the admin (at most CONTROL_BODY_BYTES, read in
        chunks), or the refusal to send: 401/403 without the admin token, 413 past the cap."""
        refused = check_admin(request.headers.get("authorization"), self.admin_token)
        if refused is not None:
            status, message = refused
            return error_response(status, ADMIN_AUTH, message, {"www-authenticate": 'Bearer realm="edge"'})
        body = await read_capped(request, CONTROL_BODY_BYTES)
        if body is None:
            return error_response(
                413, BODY_TOO_LARGE, f"a control request body is at most {CONTROL_BODY_BYTES // 1024} KiB"
            )
        return body

    async def scheduled_endpoint(self, request: Request) -> Response:
        """GET /cdn-cgi/handler/scheduled?cron=...[&time=ms]: run the dev worker's scheduled handler
        once, as `wrangler dev --test-scheduled` does; "Ran scheduled event", or the error."""
        when = request.query_params.get("time")
        if when is not None and not when.isdigit():
            return error_response(400, BAD_CONTROL_REQUEST, f"time: {when!r}; send ms since the epoch")
        at_ms = int(when) if when else int(time.time() * 1000)
        outcome, exception = await self.run_scheduled(request.query_params.get("cron", ""), at_ms)
        if outcome == "ok":
            return PlainTextResponse("Ran scheduled event")
        if outcome.startswith("exceeded"):
            return error_response(500, WORKER_LIMITS, f"Worker exceeded resource limits: {outcome}")
        name, message = (exception or {}).get("name", ""), (exception or {}).get("message", "")
        if name == "WorkerLoadError":
            return error_response(503, WORKER_UNAVAILABLE, message)
        return error_response(500, WORKER_EXCEPTION, f"Worker threw exception: {name}: {message}")

    async def pops(self, request: Request) -> Response:
        """Each GPU PoP: its engines' formats, KV occupancy, recent steps and expert load (admin)."""
        if isinstance(body := await self.admin_body(request), Response):
            return body
        return JSONResponse({"pops": [msgspec.to_builtins(n.status()) for n in self.edge.nodes.values()]})

    async def reload_model(self, request: Request) -> Response:
        """Load a new version of a catalog model at every PoP; a PoP that refuses it (it fails
        verification, say) keeps serving the version it has and says why (admin)."""
        if isinstance(body := await self.admin_body(request), Response):
            return body
        try:
            name = decode_json(body, ReloadRequest).model
            catalog = load_catalog(self.config.models_dir)
        except (msgspec.ValidationError, BadJSON) as exc:
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
        re-routed) or bring it back (admin)."""
        if isinstance(body := await self.admin_body(request), Response):
            return body
        code, action = request.path_params["code"].upper(), request.path_params["action"]
        node = self.edge.nodes.get(code)
        if node is None or action not in ("down", "up"):
            known = ", ".join(self.edge.nodes)
            return error_response(
                404, BAD_CONTROL_REQUEST, f"POST .../pops/<code>/down|up with a GPU PoP: {known}"
            )
        try:
            rerouted = await node.take_down() if action == "down" else 0
            if action == "up":
                await node.bring_up()
        except EdgeError as exc:  # a remote node did not answer, or refused this runtime's token
            return error_response(502, BAD_CONTROL_REQUEST, exc.message)
        log.warning(
            "PoP %s is %s%s", code, action, f" ({rerouted} queued request(s) re-routed)" if rerouted else ""
        )
        return JSONResponse({"code": code, "up": node.up, "rerouted": rerouted})

    async def health(self, request: Request) -> Response:
        """The readiness probe, open to all: the dev worker's name and each PoP's state only."""
        return JSONResponse(
            {
                "status": "ok" if self.dev_alive() else "degraded",
                "worker": self.config.name,
                "pops": [
                    {"code": n.code, "up": n.up, "models": sorted(n.models())}
                    for n in self.edge.nodes.values()
                ],
                "models": self.edge.models(),
            }
        )

    async def metrics_endpoint(self, request: Request) -> Response:
        """Open: totals with no worker or account names; with the admin token, per worker too."""
        return Response(self.metrics.render(detailed=self.is_admin(request)), media_type=CONTENT_TYPE)
