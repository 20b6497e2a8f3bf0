"""The steps of AI Gateway's universal run (`env.AI.gateway(id).run([...])`, Cloudflare's universal
endpoint): each `{"provider", "endpoint", "headers", "query"}` read into the model, its inputs and
the gateway options its `cf-aig-*` headers set. Only `workers-ai` is served: this edge reaches no
other network, so another provider is that step's failure (and the chain goes on).

A step may name the PoP it prefers with the header `cf-aig-edge-pop: <IATA code>` (this edge's own,
Cloudflare has none): the call enters the edge at that PoP, so the router ranks that PoP first when
it serves the model and has room (a full PoP still hands the call to the next best, as routing
does); a PoP the edge does not have, or one that does not serve the model, fails the step, so a
chain can say "NRT, else any"."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.ai.gateway_options import GatewayOptions
from workers import AIError

PROVIDER = "workers-ai"  # the one provider this edge serves (it reaches no other network)
MAX_STEPS = 8
POP_HEADER = "cf-aig-edge-pop"
# step header -> (the gateway option it sets, how its text reads)
STEP_HEADERS = {
    "cf-aig-cache-ttl": ("cacheTtl", int),
    "cf-aig-request-timeout": ("requestTimeoutMs", int),
    "cf-aig-max-attempts": ("retries.maxAttempts", int),
    "cf-aig-retry-delay": ("retries.retryDelayMs", int),
    "cf-aig-backoff": ("retries.backoff", str),
    "cf-aig-cache-key": ("cacheKey", str),
    "cf-aig-skip-cache": ("skipCache", lambda v: str(v).lower() == "true"),
    "cf-aig-collect-log": ("collectLog", lambda v: str(v).lower() != "false"),
    "cf-aig-event-id": ("eventId", str),
    "cf-aig-metadata": ("metadata", json.loads),  # a JSON object
}


@dataclass(frozen=True)
class Step:
    model: str
    inputs: Any
    options: GatewayOptions
    pop: str | None = None  # the PoP the step prefers (cf-aig-edge-pop)


def options_from_headers(given: dict[str, Any], where: str = "") -> dict[str, Any]:
    """The gateway options (env.AI.run's `gateway` keys) that cf-aig-* headers set, `given` by
    lower-case name; AIError naming a header whose text does not read (`where` prefixes its name)."""
    options: dict[str, Any] = {}
    for name, (key, read) in STEP_HEADERS.items():
        if name not in given:
            continue
        try:
            value = read(given[name])
        except (TypeError, ValueError):
            raise AIError(5004, f"{where}{name}: {str(given[name])[:32]!r} does not read as {key}") from None
        if key.startswith("retries."):
            options.setdefault("retries", {})[key.removeprefix("retries.")] = value
        else:
            options[key] = value
    return options


def read_step(request: Any, gateway_id: str) -> Step:
    """One universal request, or AIError naming what is wrong with it (3040 for a provider this
    edge cannot reach, 5004 for a malformed request)."""
    if not isinstance(request, dict):
        raise AIError(5004, "a request is {provider, endpoint, headers, query}")
    provider = request.get("provider")
    if provider != PROVIDER:
        raise AIError(
            3040,
            f"provider {str(provider)[:64]!r} cannot be reached from this edge (no network): only {PROVIDER}",
        )
    endpoint = request.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise AIError(5004, "endpoint: the model to run, such as @edge/moonshotai/kimi-k2-mini")
    headers = request.get("headers") or {}
    if not isinstance(headers, dict):
        raise AIError(5004, "headers: a dict of header names to strings")
    given = {str(k).lower(): v for k, v in headers.items()}
    options = options_from_headers(given, "headers.")
    options["id"] = gateway_id
    pop = given.get(POP_HEADER)
    if pop is not None and not isinstance(pop, str):
        raise AIError(5004, f"headers.{POP_HEADER}: a PoP's IATA code, such as NRT")
    return Step(endpoint.removeprefix("run/"), request.get("query"), GatewayOptions.parse(options), pop)
