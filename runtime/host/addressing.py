"""Where a request comes from and which worker it addresses.

The client's location (x-edge-client-location, else the config's default) lands it on its
nearest PoP; the worker is named by `x-edge-worker: <account>/<worker>` or by the host
`<worker>.<account>.edge.localhost`, and none of them means the worker `edge dev` serves.
"""

from __future__ import annotations

from starlette.requests import Request

from edge_sim.edge import Edge
from edge_sim.topology import Location
from runtime.control.addresses import DEFAULT_ORIGIN
from runtime.host.fetch_guard import FetchGuard
from runtime.host.invocation import Invocation
from runtime.http.headers import LOCATION_HEADER

WORKER_HOST_SUFFIX = ".edge.localhost"  # <worker>.<account>.edge.localhost reaches a deployed worker
WORKER_HEADER = "x-edge-worker"  # or: x-edge-worker: <account>/<worker>


class Locator:
    """A request's Invocation: its client's location, ingress PoP and round trip, and the runtime's
    own origin (`origin`: configured, runtime.control.addresses), whatever Host the client sent."""

    def __init__(
        self, edge: Edge, default_location: Location, fetch_guard: FetchGuard, origin: str = DEFAULT_ORIGIN
    ):
        self.edge, self.default_location, self.fetch_guard = edge, default_location, fetch_guard
        self.origin = origin

    def locate(self, request: Request) -> Invocation:
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
        return Invocation(
            location,
            ingress,
            client_rtt,
            method=request.method,
            url=str(request.url),
            # not the request's scheme and Host: a client writes them, and a URL built on them
            # (getUrl) would send the worker's calls, and its token, where the client chose
            origin=self.origin,
        )


def target(request: Request) -> tuple[str, str] | None:
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


def refuse_worker_host(account: str, host: str) -> str | None:
    """Why `account`'s worker may not fetch `host` by name (another account's worker), or None;
    every address check is the fetch guard's, on every redirect hop too."""
    if host.endswith(WORKER_HOST_SUFFIX):
        parts = host[: -len(WORKER_HOST_SUFFIX)].split(".")
        if len(parts) == 2 and parts[1] != account:
            return f"fetch to another account's worker ({parts[0]}.{parts[1]}) is not allowed"
    return None
