"""What a running worker is (WorkerSpec) and what one request or event carries (RequestContext).

Plain data shared by the worker host, the registry, Durable Objects and the APIs; it imports no
other part of the runtime that serves requests, so any of them may use it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from edge_sim.accounting import LatencyAccount
from edge_sim.topology import Location, PoP
from runtime.bindings import BindingRef
from runtime.control.limits import IsolateLimits


class DurableObjectRef(msgspec.Struct, frozen=True):
    """A durable_objects.bindings entry: the class, and the worker that defines it (None: this one)."""

    class_name: str
    script_name: str | None = None


class ObjectAddress(msgspec.Struct, frozen=True):
    """The one Durable Object an isolate serves: its class and id (set by the runtime)."""

    class_name: str
    id: str


class WorkflowAddress(msgspec.Struct, frozen=True):
    """The workflow an isolate runs instances of: its name (the instances' key) and class."""

    name: str
    class_name: str


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
    deps: str | None = None  # the project's installed dependencies (runtime.host.deps): /edge/deps inside
    local_secrets: dict[str, str] = {}  # edge dev's .dev.vars (control.dev_vars): over vars, secrets
    workflow: WorkflowAddress | None = None  # set: this handle runs that workflow's instances


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
    models: list[str] = field(default_factory=list)  # per AI call, the model that served it (dashboard)
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

    def sub(self, method: str, url: str) -> RequestContext:
        """A call this request makes to another worker or object: same client, fresh counters,
        the chain of objects it is nested in kept."""
        return RequestContext(
            self.location,
            self.ingress,
            self.client_rtt_ms,
            method=method,
            url=url,
            origin=self.origin,
            objects=self.objects,
        )


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
