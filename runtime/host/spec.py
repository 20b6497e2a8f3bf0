"""What a running worker is (WorkerSpec), and request.cf as a worker reads it.

Plain data shared by the worker host, the registry, Durable Objects and the APIs; it imports no
other part of the runtime that serves requests, so any of them may use it.
"""

from __future__ import annotations

from typing import Any

import msgspec

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
