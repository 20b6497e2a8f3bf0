"""The control plane's canary rollouts (admin token required), for `edge models rollout`:

    GET  /cdn-cgi/edge/models/rollout                        the canaries in progress
    POST /cdn-cgi/edge/models/rollout  {"model", "new", "share"}
         every in-process PoP loads NEW (verified against the trusted keys) as MODEL#canary and
         `share` percent of session keys go to it; 409 with each PoP's reason when one refuses it
    POST /cdn-cgi/edge/models/rollout/finish  {"model", "promote", "reasons"}
         promote: every PoP loads NEW as MODEL (its canary is unloaded); else the canary is
         unloaded. The decision and reasons go to the dev worker's tail and /metrics.

runtime.control.rollout says how calls are split."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_sim.edge import Edge
from edge_sim.pop import ModelSpec
from runtime.ai.catalog import load_catalog
from runtime.control.config import ConfigError, WorkerConfig
from runtime.control.metrics import Metrics
from runtime.control.rollout import Canary, Rollouts, canary_name, rollout_event
from runtime.control.tail import TailHub
from runtime.http.errors import BAD_CONTROL_REQUEST, error_response
from runtime.http.json_body import BadJSON, decode_json

log = logging.getLogger("edge.runtime")

PREFIX = "/cdn-cgi/edge/models/rollout"


class StartRequest(msgspec.Struct):
    model: str
    new: str
    share: float


class FinishRequest(msgspec.Struct):
    model: str
    promote: bool
    reasons: list[str] = []


class RolloutEndpoints:
    def __init__(
        self,
        config: WorkerConfig,
        edge: Edge,
        metrics: Metrics,
        tail: TailHub,
        rollouts: Rollouts,
        admin_body: Callable[[Request], Awaitable[bytes | Response]],
    ):
        self.config, self.edge, self.metrics, self.tail = config, edge, metrics, tail
        self.rollouts, self.admin_body = rollouts, admin_body

    def routes(self) -> list[Route]:
        return [
            Route(PREFIX, self.list_rollouts, methods=["GET"]),
            Route(PREFIX, self.start, methods=["POST"]),
            Route(PREFIX + "/finish", self.finish, methods=["POST"]),
        ]

    async def _decode(self, request: Request, kind: type) -> object:
        if isinstance(body := await self.admin_body(request), Response):
            return body
        try:
            return decode_json(body, kind)
        except (msgspec.ValidationError, BadJSON) as exc:
            fields = ", ".join(kind.__struct_fields__)
            return error_response(400, BAD_CONTROL_REQUEST, f"send JSON with {fields} ({exc})")

    def _spec(self, name: str, model: str, path: str) -> ModelSpec | Response:
        """How to load `path` for catalog model `model` under `name`: its formats, always verified."""
        try:
            catalog = load_catalog(self.config.models_dir)
        except ConfigError as exc:
            return error_response(500, BAD_CONTROL_REQUEST, str(exc))
        if model not in catalog:
            known = ", ".join(catalog)
            return error_response(404, BAD_CONTROL_REQUEST, f"{model!r} is not in the catalog ({known})")
        entry, _ = catalog[model]
        return ModelSpec(
            name, path, entry.weights, entry.kv_cache_dtype, trusted_keys=self.config.trusted_keys
        )

    async def list_rollouts(self, request: Request) -> Response:
        if isinstance(body := await self.admin_body(request), Response):
            return body
        return JSONResponse({"rollouts": [msgspec.to_builtins(c) for c in self.rollouts.canaries.values()]})

    async def start(self, request: Request) -> Response:
        body = await self._decode(request, StartRequest)
        if isinstance(body, Response):
            return body
        assert isinstance(body, StartRequest)
        if not 0 < body.share <= 100:
            return error_response(
                400, BAD_CONTROL_REQUEST, f"share: a percentage in (0, 100], got {body.share}"
            )
        if body.model in self.rollouts.canaries:
            return error_response(
                409, BAD_CONTROL_REQUEST, f"{body.model!r} already has a canary; finish it first"
            )
        spec = self._spec(canary_name(body.model), body.model, body.new)
        if isinstance(spec, Response):
            return spec
        outcome = await asyncio.to_thread(self.edge.reload, spec)
        if any(reason is not None for reason in outcome.values()) or not outcome:
            self.edge.unload(spec.name)
            return JSONResponse({"model": body.model, "pops": _pops(outcome)}, status_code=409)
        self.rollouts.canaries[body.model] = Canary(body.model, body.new, body.share, time.time())
        log.warning("rollout: %s%% of %s's sessions go to %s", body.share, body.model, body.new)
        return JSONResponse(
            {"model": body.model, "canary": spec.name, "share": body.share, "pops": _pops(outcome)}
        )

    async def finish(self, request: Request) -> Response:
        body = await self._decode(request, FinishRequest)
        if isinstance(body, Response):
            return body
        assert isinstance(body, FinishRequest)
        canary = self.rollouts.canaries.get(body.model)
        if canary is None:
            return error_response(404, BAD_CONTROL_REQUEST, f"{body.model!r} has no canary in progress")
        outcome: dict[str, str | None] = {}
        if body.promote:
            spec = self._spec(body.model, body.model, canary.new)
            if isinstance(spec, Response):
                return spec
            outcome = await asyncio.to_thread(self.edge.reload, spec)
        decision = "promoted" if body.promote and all(r is None for r in outcome.values()) else "rolled_back"
        reasons = list(body.reasons)
        if body.promote and decision == "rolled_back":
            reasons.append("a PoP refused the new version: " + "; ".join(r for r in outcome.values() if r))
        del self.rollouts.canaries[body.model]  # new calls stop going to the canary first
        self.edge.unload(canary_name(body.model))
        self.metrics.rollouts.labels(body.model, decision).inc()
        event = rollout_event(self.config.name, body.model, decision, reasons, canary.new)
        self.tail.publish(self.config.account_id, self.config.name, event)
        log.warning(
            "rollout of %s: %s%s", body.model, decision, f" ({'; '.join(reasons)})" if reasons else ""
        )
        return JSONResponse(
            {"model": body.model, "decision": decision, "reasons": reasons, "pops": _pops(outcome)}
        )


def _pops(outcome: dict[str, str | None]) -> dict[str, dict]:
    return {code: {"loaded": reason is None, "refused": reason} for code, reason in outcome.items()}
