"""What a running worker may ask of the runtime, handed to each WorkerHandle at construction.

The runtime builds one WorkerServices and gives it to every handle it starts: the AI service, the
metrics and tail, the binding stores, Durable Objects, the outbound fetch policy and service-binding
dispatch. A handle reaches nothing else of the runtime, so the parts import each other one way only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from edge_sim.topology import Location, PoP
from runtime.ai.gateway import Gateways
from runtime.ai.search.service import AISearch
from runtime.ai.service import AIService
from runtime.bindings import BindingStores
from runtime.control.dashboard_feed import DashboardFeed
from runtime.control.metrics import Metrics
from runtime.control.tail import TailHub
from runtime.host.fetch_guard import FetchGuard
from runtime.host.invocation import Invocation
from runtime.host.sockets import SocketHub
from runtime.host.spec import WorkerSpec
from runtime.isolate import ipc


class Secrets(Protocol):
    def secrets(self, account: str, name: str) -> dict[str, str]: ...


class ObjectCalls(Protocol):
    """Durable Objects as a worker reaches them (runtime.host.objects.DurableObjects)."""

    async def call(self, caller: WorkerSpec, call: ipc.ObjectCall, ctx: Invocation) -> ipc.ObjectReply: ...


class WorkflowSteps(Protocol):
    """A workflow run's step calls (runtime.events.workflows.WorkflowEngine)."""

    async def step(self, spec: WorkerSpec, request: int, method: str, args: list) -> Any: ...


ServiceCall = Callable[[WorkerSpec, ipc.FetchCall, Invocation], Awaitable[ipc.FetchReply]]


class NetworkMode(Protocol):
    """The edge's network setting (edge_sim.edge.Edge): `edge dev --network emulate` sets it."""

    emulate: bool


@dataclass
class WorkerServices:
    secrets: Secrets  # the worker's secrets join its env when its isolate starts
    ai: AIService
    metrics: Metrics
    tail: TailHub
    feed: DashboardFeed  # each finished request, for the live dashboard (runtime.routes.dashboard)
    bindings: BindingStores  # KV, D1, R2 and Durable Object storage
    objects: ObjectCalls
    fetch_guard: FetchGuard  # outbound fetch: checked by address on every hop
    refuse_host: Callable[[str, str], str | None]  # (account, host): why that worker host is refused
    call_service: ServiceCall  # a service binding's fetch (another worker, or the assets)
    network: NetworkMode  # its `emulate`: whether the client's round trip is really waited
    event_origin: Callable[[], tuple[Location, PoP]]  # where a cron or queue event's AI calls start
    origin: str = ""  # the runtime's own origin (configured): what URLs handed to a worker start with
    workflows: WorkflowSteps | None = None  # set once the workflow engine is built (runtime.app)
    gateways: Gateways | None = None  # AI Gateway (runtime.ai.gateway); the app sets it
    ai_search: AISearch | None = None  # AI Search (runtime.ai.search); the app sets it
    # the models search view of the catalog (runtime.ai.catalog.catalog_view): env.AI.models()
    catalog_view: Callable[[], list[dict[str, Any]]] = lambda: []  # noqa: E731
    # an object set ((account, script, class, id), ms) or deleted (ms None) its alarm: the scheduler's
    on_alarm: Callable[[tuple[str, str, str, str], int | None], None] | None = None
    sockets: SocketHub = field(default_factory=SocketHub)  # every WebSocket's client connection
