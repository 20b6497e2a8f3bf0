"""The HTTP front: requests go to a worker's isolate; AI calls come back to the edge.

Per request: locate the client (x-edge-client-location or the config default), land it on its
nearest PoP (request.cf), pick the worker (a deployed worker by host or x-edge-worker, else the
one `edge dev` serves) and its version (the deployment's split, sticky by
Cloudflare-Workers-Version-Key), invoke it, and answer with cf-ray and Server-Timing headers that
carry the latency account of the AI calls it made. The runtime's own endpoints live under
/cdn-cgi/ and /client/v4/, so a worker keeps every other path: the runtime answers every path
under those two itself (404 or 405 where nothing serves it), so none ever reaches a worker. The
control endpoints that change or reveal state need the admin token (runtime.admin).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import time
from pathlib import Path
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Match, Route

from edge_sim.edge import Edge
from edge_sim.errors import EdgeError
from edge_sim.remote import health_checks
from edge_sim.topology import TopologyError
from runtime import ipc
from runtime.admin import CONTROL_BODY_BYTES, check_admin, read_capped
from runtime.ai import AIService
from runtime.api import AIApi, cf_error
from runtime.assets import ASSETS_SERVICE, AssetResponse, AssetServer
from runtime.bindings import BindingStores, binding_refs
from runtime.catalog import CatalogEntry, alias_map, load_catalog, model_spec
from runtime.config import ConfigError, WorkerConfig
from runtime.control import ControlApi
from runtime.cron import CronError, CronExpression, run_schedule
from runtime.fetch_guard import FetchGuard
from runtime.limits import validate as validate_limits
from runtime.metrics import CONTENT_TYPE, Metrics
from runtime.objects import DurableObjects
from runtime.queue_consumers import ConsumerError, ConsumerSettings, consume
from runtime.state import State, materialise_bundle
from runtime.worker_host import (
    LOCATION_HEADER,
    WORKER_EXCEPTION,
    WORKER_LIMITS,
    WORKER_UNAVAILABLE,
    ClientBody,
    DurableObjectRef,
    RequestContext,
    TailHub,
    WorkerHandle,
    WorkerSpec,
    error_response,
    ray_id,
)

log = logging.getLogger("edge.runtime")

MAX_BODY_BYTES = 100 * 1024 * 1024  # Cloudflare's request body limit on the Free and Pro plans
CONTROL_PREFIX = "/cdn-cgi/edge/"
WORKER_HOST_SUFFIX = ".edge.localhost"  # <worker>.<account>.edge.localhost reaches a deployed worker
WORKER_HEADER = "x-edge-worker"  # or: x-edge-worker: <account>/<worker>
VERSION_KEY_HEADER = "cloudflare-workers-version-key"

# Runtime error codes (Cloudflare's where one exists).
BAD_LOCATION = 1110
BODY_TOO_LARGE = 1113
BAD_CONTROL_REQUEST = 1120  # also: no /cdn-cgi/ endpoint at that path (404) or for that method (405)
NO_SUCH_WORKER = 1121
ADMIN_AUTH = 1124  # a control endpoint without the admin token (401) or with a wrong one (403)
# /client/v4/ paths no API serves, in the Cloudflare envelope
NO_ROUTE = 7000  # Cloudflare's "No route for that URI"
METHOD_NOT_ALLOWED = 7001


class ReloadRequest(msgspec.Struct):
    model: str


class Runtime:
    def __init__(
        self,
        config: WorkerConfig,
        edge: Edge,
        state: State | None = None,
        catalog: dict[str, tuple[CatalogEntry, Path]] | None = None,
        deps: Path | None = None,
    ):
        self.config = config
        self.deps = deps  # the dev worker's installed dependencies (runtime.deps), if it lists any
        self.edge = edge
        self.state = state or State(config.state_dir / "state.db")
        self.catalog = catalog or {}
        self.ai = AIService(
            edge,
            {name: e.schema for name, (e, _) in self.catalog.items()},
            {alias: (target, a.schema) for alias, (target, a) in alias_map(self.catalog).items()},
        )
        self.metrics = Metrics()
        self.tail = TailHub()
        self.bindings = BindingStores(config.state_dir)  # KV, D1, R2 of every account, under .edge/
        self.objects = DurableObjects(self)  # Durable Object instances, each in its own isolate
        self.default_location = edge.locate(config.edge.client_location)
        a = config.assets  # [assets]: served before the dev worker, and through env.<binding>
        self.assets = (
            AssetServer(
                Path(config.base_dir) / a.directory,
                a.html_handling,
                a.not_found_handling,
                a.run_worker_first,
                hidden=[config.state_dir],
            )
            if a is not None
            else None
        )
        self.dev = WorkerHandle(self.dev_spec(), self)
        self._deployed: dict[tuple[str, str, str], WorkerHandle] = {}
        self._tasks: list[asyncio.Task] = []
        self.watch = False  # edge dev: restart the dev worker when its source changes
        self.api = AIApi(self)
        self.control = ControlApi(self)
        # Outbound fetches from workers: public addresses, plus the operator's allowlist; never this
        # runtime (its port joins as requests arrive) nor a PoP node.
        self.fetch_guard = FetchGuard(
            allow=config.edge.fetch_allow,
            pop_urls={node.code: node.url for node in edge.remote_nodes()},
        )
        self.admin_token: str | None = None  # edge dev sets it (runtime.admin); None refuses every admin call

    def dev_spec(self) -> WorkerSpec:
        c = self.config
        limits = validate_limits(msgspec.structs.asdict(c.limits), "limits")  # as load_config did
        return WorkerSpec(
            account=c.account_id,
            name=c.name,
            version=None,
            script=str(c.main_path),
            vars=dict(c.vars),
            ai_binding=c.ai.binding if c.ai else None,
            services={s.binding: s.service for s in c.services}
            | ({c.assets.binding: ASSETS_SERVICE} if c.assets and c.assets.binding else {}),
            limits=limits.isolate(),
            subrequests=limits.subrequests,
            bindings=binding_refs(c.kv_namespaces, c.d1_databases, c.r2_buckets, c.queues.producers),
            durable_objects={
                b.name: DurableObjectRef(b.class_name, b.script_name) for b in c.durable_objects.bindings
            },
            deps=str(self.deps) if self.deps else None,
        )

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        remotes = self.edge.remote_nodes()
        if remotes:  # know their state before the first request, then keep checking
            await asyncio.gather(*(node.refresh() for node in remotes))
            self._tasks.append(asyncio.create_task(health_checks(remotes)))
        try:
            await self.dev.isolate.start()
        except Exception as exc:  # keep serving: requests get a 503 naming the error until it is fixed
            log.error("%s\n%s", exc, getattr(exc, "traceback", ""))
        if self.watch:
            self._tasks.append(asyncio.create_task(self._watch_source()))
        if self.assets is not None and not self.assets.root.is_dir():
            log.warning("assets.directory: %s is not a folder; no assets are served", self.assets.root)
        crons = []
        for text in self.config.triggers.crons:
            try:
                crons.append(CronExpression.parse(text))
            except CronError as exc:
                log.error("triggers.crons: %s; it never fires", exc)
        if crons:
            log.info("cron triggers (UTC): %s", ", ".join(c.text for c in crons))
            self._tasks.append(asyncio.create_task(run_schedule(crons, self.run_scheduled)))
        self._start_queue_consumers()

    def _start_queue_consumers(self) -> None:
        """One delivery loop per queues.consumers entry of the dev worker (runtime.queue_consumers)."""
        consumers = []
        for i, entry in enumerate(self.config.queues.consumers):
            try:
                consumers.append(ConsumerSettings.from_config(entry, f"queues.consumers.{i}"))
            except ConsumerError as exc:
                log.error("%s; that consumer never runs", exc)
        if not consumers:
            return
        store = self.bindings.queues
        store.release_leases()  # a delivery the last run never settled: delivered again

        def note(level: str, message: str) -> None:
            log.warning("%s", message)
            self.dev.note(level, message)

        account = self.config.account_id
        for settings in consumers:
            deliver = lambda queue, messages: self.dev.deliver(queue, messages)  # noqa: E731 - the dev worker of now
            task = consume(store, self.bindings.run, account, settings, deliver, note)
            self._tasks.append(asyncio.create_task(task))
        log.info("queue consumers: %s", ", ".join(c.queue for c in consumers))

    async def run_scheduled(self, cron: str, scheduled_time_ms: int) -> tuple[str, dict | None]:
        """A Cron Trigger fired (or /cdn-cgi/handler/scheduled was called): the dev worker's
        scheduled handler runs; its outcome goes to edge tail."""
        return await self.dev.schedule(cron, scheduled_time_ms)

    def _source_stamp(self) -> tuple:
        root = self.config.main_path.parent
        return tuple(
            sorted(
                (str(p), p.stat().st_mtime_ns)
                for p in root.rglob("*.py")
                if ".edge" not in p.parts and "__pycache__" not in p.parts
            )
        )

    async def _watch_source(self, interval: float = 0.5) -> None:
        stamp = self._source_stamp()
        while True:
            await asyncio.sleep(interval)
            now = self._source_stamp()
            if now != stamp:
                stamp = now
                await self.reload_dev()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.dev.stop()
        for handle in self._deployed.values():
            await handle.stop()
        await self.objects.stop()
        self.bindings.close()
        self.edge.close()

    async def restart_worker(self, account: str, name: str) -> None:
        """Its env changed (a secret): stop its isolates; the next request starts fresh ones."""
        if (account, name) == (self.config.account_id, self.config.name):
            await self.reload_dev()
        for key in [k for k in self._deployed if k[:2] == (account, name)]:
            await self._deployed.pop(key).stop()

    async def reload_dev(self) -> None:
        """The dev worker's source changed: the next request starts a fresh isolate on it."""
        old, self.dev = self.dev, WorkerHandle(self.dev_spec(), self)
        await old.stop()
        await self.objects.stop_worker(self.config.account_id, self.config.name)
        log.info("reloaded %s", self.config.name)

    # --- which worker, which version ----------------------------------------------------------------

    def locate(self, request: Request) -> RequestContext:
        """Where the client is and the PoP it lands on; raises TopologyError for a bad location."""
        where = request.headers.get(LOCATION_HEADER)
        if where:  # the server reads header bytes as Latin-1; clients send UTF-8 ("São Paulo")
            try:
                where = where.encode("latin-1").decode("utf-8")
            except UnicodeError:
                pass  # not UTF-8: keep the Latin-1 reading
        location = self.edge.locate(where) if where else self.default_location
        ingress, client_rtt = self.edge.ingress(location)
        server = request.scope.get("server")
        if server and server[1]:  # the port really listened on (the Host header may say otherwise)
            self.fetch_guard.runtime_ports.add(server[1])
        return RequestContext(
            location,
            ingress,
            client_rtt,
            method=request.method,
            url=str(request.url),
            origin=f"{request.url.scheme}://{request.url.netloc}",
        )

    def target(self, request: Request) -> tuple[str, str] | None:
        """(account, worker) a request addresses, or None for the worker edge dev serves."""
        header = request.headers.get(WORKER_HEADER)
        if header and "/" in header:
            account, worker = header.split("/", 1)
            return account, worker
        host = request.url.hostname or ""
        if host.endswith(WORKER_HOST_SUFFIX):
            parts = host[: -len(WORKER_HOST_SUFFIX)].split(".")
            if len(parts) == 2:
                return parts[1], parts[0]
        return None

    def pick_version(self, account: str, worker: str, request: Request) -> str | None:
        strategy = self.state.active(account, worker)
        if not strategy:
            return None
        key = request.headers.get(VERSION_KEY_HEADER)
        bucket = (int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100) if key else random.randrange(100)
        for version, percentage in strategy:  # the same key always lands in the same bucket
            if bucket < percentage:
                return version
            bucket -= percentage
        return strategy[-1][0]

    def handle_for(self, account: str, worker: str, version: str) -> WorkerHandle:
        key = (account, worker, version)
        if key not in self._deployed:
            record = self.state.version(account, worker, version)
            if record is None:
                raise LookupError(f"no version {version} of worker {worker!r} in account {account!r}")
            cfg = record["config"]
            try:  # the same check the deploy API made; a version stored before it was made fails here
                limits = validate_limits(cfg, "config")
            except ValueError as exc:
                raise ValueError(f"version {version} of worker {worker!r}: {exc}; deploy it again") from None
            folder = materialise_bundle(self.config.state_dir, version, record["files"])
            self._deployed[key] = WorkerHandle(
                WorkerSpec(
                    account=account,
                    name=worker,
                    version=version,
                    script=str(folder / record["main"]),
                    vars=cfg.get("vars", {}),
                    ai_binding=cfg.get("ai_binding"),
                    services=cfg.get("services", {}),
                    limits=limits.isolate(),
                    subrequests=limits.subrequests,
                    bindings=binding_refs(
                        cfg.get("kv_namespaces", []), cfg.get("d1_databases", []), cfg.get("r2_buckets", [])
                    ),
                ),
                self,
            )
        return self._deployed[key]

    def worker(self, account: str, name: str, request: Request | None = None) -> WorkerHandle | None:
        if (
            account == self.config.account_id
            and name == self.config.name
            and not self.state.active(account, name)
        ):
            return self.dev
        version = self.pick_version(account, name, request) if request is not None else None
        if version is None and request is None:
            strategy = self.state.active(account, name)
            version = strategy[0][0] if strategy else None
        return self.handle_for(account, name, version) if version else None

    # --- calls the isolates make --------------------------------------------------------------------

    def refuse_worker_host(self, account: str, host: str) -> str | None:
        """Why `account`'s worker may not fetch `host` by name (another account's worker), or None;
        every address check is self.fetch_guard's, on every redirect hop too."""
        if host.endswith(WORKER_HOST_SUFFIX):
            parts = host[: -len(WORKER_HOST_SUFFIX)].split(".")
            if len(parts) == 2 and parts[1] != account:
                return f"fetch to another account's worker ({parts[0]}.{parts[1]}) is not allowed"
        return None

    async def call_service(
        self, caller: WorkerHandle, call: ipc.FetchCall, ctx: RequestContext
    ) -> ipc.FetchReply:
        service = caller.spec.services.get(call.service)
        if service == ASSETS_SERVICE and self.assets is not None and caller.spec.version is None:
            served = self.assets.fetch(call.method, call.url, {k.lower(): v for k, v in call.headers})
            if len(served.body) > ipc.TO_ISOLATE - ipc.CHUNK:  # one reply frame carries it
                return ipc.FetchReply(
                    call.call,
                    error=f"{call.service}.fetch: the asset is over {ipc.TO_ISOLATE // 2**20 - 1} MiB",
                )
            return ipc.FetchReply(call.call, served.status, served.headers, served.body)
        handle = self.worker(caller.spec.account, service) if service else None
        if handle is None:
            return ipc.FetchReply(
                call.call,
                error=f"service binding {call.service}: no worker {service!r} "
                f"in account {caller.spec.account!r}",
            )
        sub = RequestContext(
            ctx.location, ctx.ingress, ctx.client_rtt_ms, method=call.method, url=call.url, origin=ctx.origin
        )
        fake = _InternalRequest(call.method, call.url, call.headers)
        response = await handle.serve(fake, call.body, sub, {})
        body = (
            response.body
            if hasattr(response, "body")
            else b"".join([c async for c in response.body_iterator])
        )
        return ipc.FetchReply(call.call, response.status_code, list(response.headers.items()), bytes(body))

    # --- the HTTP surface -----------------------------------------------------------------------------

    async def _client_body(self, request: Request) -> bytes | ClientBody | None:
        """The body as the worker will read it: bytes when it is small, else a stream that is
        passed on as it arrives (never held whole here); None when it is declared too large."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > MAX_BODY_BYTES:
                return None
            if int(declared) <= ipc.CHUNK:
                return await request.body()
        elif "transfer-encoding" not in request.headers:
            return b""  # no body at all
        return ClientBody(request.stream(), MAX_BODY_BYTES)

    async def handle(self, request: Request) -> Response:
        try:
            ctx = self.locate(request)
        except TopologyError as exc:
            return error_response(400, BAD_LOCATION, f"{LOCATION_HEADER}: {exc}")
        ray = {"cf-ray": f"{ray_id()}-{ctx.ingress.code}"}
        if self.assets is not None and self.target(request) is None:  # the dev worker's assets first
            served = self.assets.serve(
                request.method, request.scope["path"], request.headers, request.url.query
            )
            if served is not None:
                return _asset_response(served, ray)
        too_large = f"request body exceeds {MAX_BODY_BYTES // (1024 * 1024)} MB; send less"
        body = await self._client_body(request)
        if body is None:
            return error_response(413, BODY_TOO_LARGE, too_large, ray)
        target = self.target(request)
        handle = self.dev if target is None else self.worker(*target, request=request)
        if handle is None:
            return error_response(
                404,
                NO_SUCH_WORKER,
                f"no worker {target[1]!r} is deployed in account {target[0]!r}; deploy it with `edge deploy`",
                ray,
            )
        if self.edge.emulate:  # the request's half of the client round trip, really waited
            await asyncio.sleep(ctx.client_rtt_ms / 2000)
        response = await handle.serve(request, body, ctx, ray)
        if isinstance(body, ClientBody) and body.exceeded:  # it grew past the limit on the way
            if isinstance(response, StreamingResponse):
                await response.body_iterator.aclose()
            return error_response(413, BODY_TOO_LARGE, too_large, ray)
        return response

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

    def is_admin(self, request: Request) -> bool:
        return check_admin(request.headers.get("authorization"), self.admin_token) is None

    async def _admin_body(self, request: Request) -> bytes | Response:
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

    async def pops(self, request: Request) -> Response:
        """Each GPU PoP: its engines' formats, KV occupancy, recent steps and expert load (admin)."""
        if isinstance(body := await self._admin_body(request), Response):
            return body
        return JSONResponse({"pops": [msgspec.to_builtins(n.status()) for n in self.edge.nodes.values()]})

    async def reload_model(self, request: Request) -> Response:
        """Load a new version of a catalog model at every PoP; a PoP that refuses it (it fails
        verification, say) keeps serving the version it has and says why (admin)."""
        if isinstance(body := await self._admin_body(request), Response):
            return body
        try:
            name = msgspec.json.decode(body, type=ReloadRequest).model
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
        re-routed) or bring it back (admin)."""
        if isinstance(body := await self._admin_body(request), Response):
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
                "status": "ok" if self.dev.isolate.alive else "degraded",
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

    def catalog_view(self) -> list[dict[str, Any]]:
        """The catalog as the models search API shows it: formats that serve each model, always;
        then each alias (another provider's name, `@cf/...`) with the miniature that stands in."""
        from runtime.catalog import quality_view

        out = []
        for name, (entry, folder) in self.catalog.items():
            formats = next((n.formats(name) for n in self.edge.nodes.values() if name in n.models()), None)
            weights, kv, by_part = formats if formats else (entry.weights, entry.kv_cache_dtype, {})
            out.append(
                {
                    "id": name,
                    "name": name,
                    "description": entry.description,
                    "task": {"name": "Text Generation"},  # Cloudflare's task for its Kimi and GLM too
                    "schema": entry.schema,
                    "properties": [
                        {"property_id": "context_window", "value": str(entry.context_window or "")}
                    ],
                    "quantization": {"weights": weights, "weights_by_part": by_part, "kv_cache": kv},
                    "quality": quality_view(folder),
                    "served": name in self.edge.models(),
                    "served_by": {"model": name, "stand_in": False, "weights": weights, "kv_cache": kv},
                    "aliases": [a.name for a in entry.aliases],
                }
            )
        views = {view["name"]: view for view in out}
        for alias, (target, entry) in alias_map(self.catalog).items():
            view = views[target]
            out.append(
                {
                    **view,
                    "id": alias,
                    "name": alias,
                    "description": f"{entry.description} Served here by the miniature {target}.".strip(),
                    "schema": entry.schema or view["schema"],
                    "served_by": {**view["served_by"], "stand_in": True},
                    "aliases": [],
                    "source": entry.source,
                }
            )
        return out


class _InternalRequest:
    """A service-binding call presented to WorkerHandle.serve like an incoming request."""

    def __init__(self, method: str, url: str, headers: list[tuple[str, str]]):
        from starlette.datastructures import URL, Headers

        self.method = method
        self.url = URL(url)
        self.headers = Headers(raw=[(k.lower().encode(), v.encode()) for k, v in headers])


def create_app(runtime: Runtime) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    served = [
        Route(CONTROL_PREFIX + "health", runtime.health, methods=["GET"]),
        Route(CONTROL_PREFIX + "pops", runtime.pops, methods=["GET"]),
        Route(CONTROL_PREFIX + "metrics", runtime.metrics_endpoint, methods=["GET"]),
        Route(CONTROL_PREFIX + "models/reload", runtime.reload_model, methods=["POST"]),
        Route(CONTROL_PREFIX + "pops/{code}/{action}", runtime.pop_state, methods=["POST"]),
        Route("/cdn-cgi/handler/scheduled", runtime.scheduled_endpoint, methods=["GET"]),
        *runtime.api.routes(),
        *runtime.control.routes(),
    ]
    return Starlette(
        routes=[
            *served,
            # Every other path under the runtime's prefixes, whatever the method, is answered here and
            # never reaches a worker (with the caller's API token). A later full match beats an
            # earlier method-only match in Starlette's router, so these decide 404 or 405 themselves.
            Route("/client/v4{rest:path}", _NotServed(served, _cf_shape)),
            Route("/cdn-cgi{rest:path}", _NotServed(served, _runtime_shape)),
            Route("/{path:path}", runtime.handle, methods=methods),
        ],
        lifespan=lifespan,
    )


def _asset_response(served: AssetResponse, headers: dict[str, str]) -> Response:
    response = Response(served.body, status_code=served.status)
    for name, value in [*served.headers, *headers.items()]:
        response.headers[name] = value
    return response


def _cf_shape(status: int, message: str) -> Response:
    return cf_error(NO_ROUTE if status == 404 else METHOD_NOT_ALLOWED, message, status)


def _runtime_shape(status: int, message: str) -> Response:
    return error_response(status, BAD_CONTROL_REQUEST, message)


class _NotServed:
    """An ASGI app (so that its route matches every method) for a runtime path nothing serves:
    405 (with Allow) where a route has that path for other methods, else 404. It reads no body."""

    def __init__(self, served: list[BaseRoute], shape):
        self.served, self.shape = served, shape

    async def __call__(self, scope, receive, send) -> None:
        allowed: set[str] = set()
        for route in self.served:
            match, _ = route.matches(scope)
            if match == Match.PARTIAL:
                allowed |= getattr(route, "methods", None) or set()
        path = Request(scope).url.path
        if allowed:
            allow = ", ".join(sorted(allowed))
            response = self.shape(405, f"{scope['method']} is not allowed on {path}; use {allow}")
            response.headers["allow"] = allow
        else:
            response = self.shape(404, f"No route for that URI: nothing in this runtime serves {path}")
        await response(scope, receive, send)
