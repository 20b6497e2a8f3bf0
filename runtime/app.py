"""The runtime assembled: the parts that serve workers, each handed only what it uses.

Per request: locate the client (runtime.host.addressing), land it on its nearest PoP (request.cf),
pick the worker (a deployed worker by host or x-edge-worker, else the one `edge dev` serves) and
its version (runtime.host.registry), invoke it (runtime.host.worker), and answer with cf-ray and
Server-Timing headers that carry the latency account of the AI calls it made (runtime.host.front).
The runtime's own endpoints live under /cdn-cgi/ (runtime.routes.edge; accounts in
runtime.routes.accounts) and /client/v4/ (runtime.routes.ai_rest, runtime.routes.deploy), so a worker
keeps every other path: the runtime answers every path under those two itself (404 or 405 where nothing
serves it; runtime.routes.app), so none ever reaches a worker. The control endpoints that change or
reveal state need the admin token.

Runtime builds the parts, starts and stops the background work (PoP health checks, the source
watcher, cron triggers, queue consumers, the AI batch queue) and holds nothing a part reaches back for.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request

from edge_sim.edge import Edge
from edge_sim.remote import health_checks
from runtime.ai.batch import BatchQueue
from runtime.ai.catalog import CatalogAlias, CatalogEntry, alias_map, catalog_view
from runtime.ai.gateway import Gateways, GatewaySettings
from runtime.ai.search.binding import prepare as prepare_ai_search
from runtime.ai.search.errors import AISearchError
from runtime.ai.search.service import AISearch
from runtime.ai.service import AIService, account_rows
from runtime.bindings import BindingStores
from runtime.bindings.ai_search import source_folders
from runtime.control.accounts import Accounts
from runtime.control.addresses import DEFAULT_ORIGIN, parse_origin
from runtime.control.config import WorkerConfig, account_settings
from runtime.control.dashboard_feed import DashboardFeed
from runtime.control.metrics import Metrics
from runtime.control.rate_limit import AccountRateLimits
from runtime.control.rollout import Rollouts
from runtime.control.state import State
from runtime.control.tail import TailHub
from runtime.events.alarms import AlarmScheduler
from runtime.events.cron import CronError, CronExpression, run_schedule
from runtime.events.queue_consumers import ConsumerError, ConsumerSettings, consume
from runtime.events.workflows import WorkflowEngine
from runtime.host.addressing import Locator, refuse_worker_host
from runtime.host.assets import AssetServer
from runtime.host.fetch_guard import FetchGuard
from runtime.host.front import WorkerFront
from runtime.host.invocation import Invocation
from runtime.host.objects import DurableObjects
from runtime.host.registry import WorkerRegistry
from runtime.host.service_binding import ServiceBindings
from runtime.host.services import WorkerServices
from runtime.host.sockets import SocketHub
from runtime.host.source_watch import watch_source
from runtime.host.spec import WorkerSpec
from runtime.host.worker import WorkerHandle
from runtime.routes.accounts import AccountEndpoints
from runtime.routes.ai_models import AIModelsApi
from runtime.routes.ai_rest import AIApi
from runtime.routes.ai_search import AISearchRestApi  # AI Search REST (issue 58, REST/CLI helper)
from runtime.routes.app import assemble
from runtime.routes.dashboard import DashboardEndpoints
from runtime.routes.deploy import ControlApi
from runtime.routes.edge import EdgeEndpoints
from runtime.routes.gateway import GatewayApi
from runtime.routes.gateway_rest import GatewayRestApi
from runtime.routes.openapi import routes as openapi_routes
from runtime.routes.responses import ResponsesApi
from runtime.routes.rollouts import RolloutEndpoints
from runtime.routes.workflows import WorkflowApi

log = logging.getLogger("edge.runtime")


@dataclass
class ApiServices:
    """What the AI APIs use (runtime.routes.ai_rest.AIApiHost)."""

    state: State
    ai: AIService
    metrics: Metrics
    locator: Locator
    catalog: dict[str, tuple[CatalogEntry, Path]]
    edge: Edge
    aliases: dict[str, tuple[str, CatalogAlias]]

    def locate(self, request: Request) -> Invocation:
        return self.locator.locate(request)

    def catalog_view(self) -> list[dict[str, Any]]:
        return catalog_view(self.catalog, self.edge, self.aliases)


class Runtime:
    def __init__(
        self,
        config: WorkerConfig,
        edge: Edge,
        state: State | None = None,
        catalog: dict[str, tuple[CatalogEntry, Path]] | None = None,
        deps: Path | None = None,
        admin_token: str
        | None = None,  # edge dev sets it (runtime.control.admin); None refuses every admin call
        watch: bool = False,  # edge dev --reload: restart the dev worker when its source changes
        origin: str = DEFAULT_ORIGIN,  # where edge dev listens (listen_origin); [edge] public_url wins
    ):
        self.config, self.edge, self.watch = config, edge, watch
        # what URLs handed to a worker start with: configured, never read from a request's Host
        self.origin = parse_origin(config.edge.public_url) if config.edge.public_url else origin
        self.state = state or State(config.state_dir / "state.db")
        self.accounts = Accounts(self.state)
        for name in config.edge.accounts:  # [edge.accounts.NAME]: the config wins over the stored
            self.accounts.put(name, account_settings(config, name))
        self.catalog = catalog or {}
        self.metrics = Metrics()
        self.feed = DashboardFeed()  # the live dashboard's windows (runtime.routes.dashboard)

        def refused(account: str, model: str, limit: str) -> None:
            self.metrics.ai_rate_limited(account, model, limit)
            self.feed.rate_limited(account, model, limit)

        self.rate_limits = AccountRateLimits(self.accounts.limits_of, on_refused=refused)
        # the catalog's aliases and, unless [edge] strict_models, Cloudflare's other names
        stand_ins = None if config.edge.strict_models else list(config.edge.models)
        self.aliases = alias_map(self.catalog, stand_ins_from=stand_ins)
        self.ai = AIService(
            edge,
            {name: e.schema for name, (e, _) in self.catalog.items()},
            {alias: (target, a.schema) for alias, (target, a) in self.aliases.items()},
            self.rate_limits,
            settings_of=self.accounts.settings,
        )
        own = {a.name for entry, _ in self.catalog.values() for a in entry.aliases}
        self.ai.stand_ins = frozenset(self.aliases.keys() - own)  # the names alias_map added
        self.ai.serve_embeddings = not config.edge.strict_models
        # queued batch requests, kept in the state database; run by a task started in start()
        self.batches = BatchQueue(self.state, self.ai, lambda code: edge.topology.pops[code])
        self.ai.batches, self.ai.metrics, self.ai.feed = self.batches, self.metrics, self.feed
        self.metrics.watch_accounts(lambda: account_rows(edge))  # per account, from the engines' stats
        self.tail = TailHub()
        self.bindings = BindingStores(config.state_dir)  # KV, D1, R2 of every account, under .edge/
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
        # Outbound fetches from workers: public addresses, plus the operator's allowlist; never this
        # runtime (its port joins as requests arrive) nor a PoP node.
        self.fetch_guard = FetchGuard(
            allow=config.edge.fetch_allow,
            pop_urls={node.code: node.url for node in edge.remote_nodes()},
        )
        self.locator = Locator(edge, self.default_location, self.fetch_guard, self.origin)

        # A worker's handle is given the services; the registry and Durable Objects start handles,
        # and service bindings look workers up in the registry, so `start` is bound last.
        def start(spec: WorkerSpec) -> WorkerHandle:
            return WorkerHandle(spec, services)

        # Durable Object instances, each in its own isolate; WebSockets' client connections
        self.objects = DurableObjects(
            start, hibernate_s=config.edge.hibernate_s, on_hibernate=self.metrics.object_hibernated
        )
        self.sockets = SocketHub()
        dispatch = ServiceBindings(lambda account, name: self.workers.worker(account, name), self.assets)
        services = WorkerServices(
            secrets=self.state,
            ai=self.ai,
            metrics=self.metrics,
            tail=self.tail,
            feed=self.feed,
            bindings=self.bindings,
            objects=self.objects,
            fetch_guard=self.fetch_guard,
            refuse_host=refuse_worker_host,
            call_service=dispatch.call,
            network=edge,
            event_origin=lambda: (self.default_location, edge.ingress(self.default_location)[0]),
            origin=self.origin,
            sockets=self.sockets,
            catalog_view=lambda: catalog_view(self.catalog, edge, self.aliases),
        )
        # AI Gateway: every account's gateways, their cache and logs under .edge/ (runtime.ai.gateway)
        gateway_settings = {
            gid: GatewaySettings(
                g.cache_ttl, g.collect_logs, g.rate_limit, g.rate_limit_period_s, g.rate_limit_technique
            )
            for gid, g in config.edge.ai_gateways.items()
        }
        self.gateways = Gateways(self.ai, self.bindings.pool, config.state_dir, settings=gateway_settings)
        services.gateways = self.gateways
        # AI Search: every account's namespaces and instances under .edge/ (runtime.ai.search)
        self.ai_search = AISearch(config.state_dir, self.bindings)
        services.ai_search = self.ai_search
        self.workers = WorkerRegistry(config, self.state, start, self.objects, deps)
        # the dev worker's workflows: each runs its instances in an isolate of its own
        configured = {w.name: w.class_name for w in config.bindings.get("workflows", [])}
        self.workflows = WorkflowEngine(lambda: self.workers.dev.spec, start, self.bindings, configured)
        services.workflows = self.workflows
        # Durable Object alarms: resumed from the objects' files at start, fired in their turn
        self.alarms = AlarmScheduler(self.bindings.objects, self.bindings.run, self._fire_alarm)
        services.on_alarm = self.alarms.changed
        self.front = WorkerFront(self.locator, self.workers, self.assets, edge, self.sockets)
        self.endpoints = EdgeEndpoints(
            config,
            edge,
            self.metrics,
            lambda: self.workers.dev.isolate.alive,
            self.run_scheduled,
            admin_token,
        )
        self.account_endpoints = AccountEndpoints(self.accounts, self.endpoints.admin_body)
        self.ai.rollouts = Rollouts()
        self.rollout_endpoints = RolloutEndpoints(
            config, edge, self.metrics, self.tail, self.ai.rollouts, self.endpoints.admin_body
        )
        self.dashboard = DashboardEndpoints(
            edge, self.feed, self.ai.rollouts, admin_token, ai_search=self.ai_search.progress
        )
        self.api = AIApi(
            ApiServices(self.state, self.ai, self.metrics, self.locator, self.catalog, edge, self.aliases),
            self.gateways,
        )
        self.ai_models = AIModelsApi(self.api)
        self.responses = ResponsesApi(self.api)
        self.gateway_api = GatewayApi(self.api, self.gateways)
        self.gateway_rest = GatewayRestApi(self.api, self.gateways, lambda: self.origin)
        self.ai_search_rest = AISearchRestApi(self.api, self.ai_search)  # AI Search REST (issue 58)
        self.control = ControlApi(self.state, config.state_dir, self.tail, self.workers.restart_worker)
        self.workflow_api = WorkflowApi(self.state, self.bindings, lambda: dict(self.workflows.names))
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def dev(self) -> WorkerHandle:
        """The worker `edge dev` serves (replaced when its source changes)."""
        return self.workers.dev

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self, ai_search_wait_s: float = 0.0) -> None:
        """Start serving; `ai_search_wait_s`: how long to wait for the AI Search folders' documents
        to be indexed first (the pytest plugin waits; `edge dev` serves at once)."""
        self._loop = asyncio.get_running_loop()
        remotes = self.edge.remote_nodes()
        if remotes:  # know their state before the first request, then keep checking
            await asyncio.gather(*(node.refresh() for node in remotes))
            self._tasks.append(asyncio.create_task(health_checks(remotes)))
        await self.workers.load_dev()  # a script that does not load is reported, and served 503s
        await self._prepare_ai_search(ai_search_wait_s)
        if self.watch:
            watch = watch_source(self.config.main_path.parent, self.workers.source_changed)
            self._tasks.append(asyncio.create_task(watch))
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
        self._tasks.append(asyncio.create_task(self.batches.run_forever()))
        if self.workflows.names:
            log.info("workflows: %s", ", ".join(self.workflows.names))
            self._tasks.append(asyncio.create_task(self.workflows.run_forever()))
        self._tasks.append(asyncio.create_task(self.alarms.run()))
        self._tasks.append(asyncio.create_task(self.dashboard.publish_forever()))

    async def _prepare_ai_search(self, wait_s: float) -> None:
        """The dev worker's AI Search bindings: their namespaces made, and each [[ai_search]]
        source_dir indexed into its instance and kept in step (runtime.ai.search.binding.prepare);
        a folder missing is said and the rest serve."""
        namespaces = [e.namespace for e in self.config.bindings.get("ai_search_namespaces", [])]
        try:
            folders = source_folders(self.config.bindings.get("ai_search", []), Path(self.config.base_dir))
            await prepare_ai_search(self.ai_search, self.config.account_id, namespaces, folders, wait_s)
        except (ValueError, AISearchError) as exc:
            log.error("ai_search: %s", exc)

    def _start_queue_consumers(self) -> None:
        """One delivery loop per queues.consumers entry of the dev worker (runtime.events.queue_consumers)."""
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
            run = functools.partial(self.bindings.run, account=account)  # in the account's own queue
            task = consume(store, run, account, settings, deliver, note)
            self._tasks.append(asyncio.create_task(task))
        log.info("queue consumers: %s", ", ".join(c.queue for c in consumers))

    async def _fire_alarm(self, address: tuple[str, str, str, str], retry_count: int, due_ms: int) -> str:
        """An object's alarm is due: the worker of now that defines its class runs it."""
        account, script, class_name, object_id = address
        handle = self.workers.worker(account, script)
        if handle is None:
            return "gone"
        return await self.objects.alarm(handle.spec, class_name, object_id, retry_count, due_ms)

    async def run_scheduled(self, cron: str, scheduled_time_ms: int) -> tuple[str, dict | None]:
        """A Cron Trigger fired (or /cdn-cgi/handler/scheduled was called): the dev worker's
        scheduled handler runs; its outcome goes to edge tail."""
        return await self.dev.schedule(cron, scheduled_time_ms)

    def closing(self) -> None:
        """The server was told to stop (a signal, from any thread): the dashboards' streams end now,
        since the server waits for every open response before it stops, and the shared pools stop
        taking work and interrupt what runs (a D1 statement, an embedding), so the requests that
        wait on them answer now. What was acknowledged stays: each statement commits on its own."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._close_shared)

    def _close_shared(self) -> None:
        self.feed.close()
        self.bindings.pool.close()
        self.ai.embed_pool.close()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.alarms.stop()
        await self.sockets.stop()
        await self.workers.stop()
        await self.workflows.stop()
        await self.objects.stop()
        self.ai_search.close()  # before the bindings: it reads R2 sources
        self.bindings.close()
        self.gateways.close()
        self.ai.embed_pool.close()
        self.edge.close()


def create_app(runtime: Runtime) -> Starlette:
    served = [
        *runtime.endpoints.routes(),
        *runtime.account_endpoints.routes(),
        *runtime.rollout_endpoints.routes(),
        *runtime.dashboard.routes(),
        *runtime.api.routes(),
        *runtime.ai_models.routes(),
        *runtime.responses.routes(),
        *runtime.gateway_api.routes(),
        *runtime.gateway_rest.routes(),
        *runtime.ai_search_rest.routes(),  # AI Search REST (issue 58)
        *runtime.control.routes(),
        *runtime.workflow_api.routes(),
        *openapi_routes(),
    ]
    return assemble(served, runtime.front.handle, runtime.start, runtime.stop, runtime.front.handle_websocket)
