"""The API behind `edge workflows list | describe | trigger`, at Cloudflare's paths:

    GET  /client/v4/accounts/{account}/workflows                    each workflow, its instances by status
    GET  .../workflows/{name}/instances/{id}                        an instance: status, params, output, steps
    POST .../workflows/{name}/instances  {"instance_id"?, "params"?}  a new instance

Authenticated by the account's API token; the account in the path is the token's own, so another
account's instance id is not found. Only the workflows the served config lists can be triggered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.bindings import BindingError, BindingRef, BindingStores
from runtime.control.admin import read_capped
from runtime.control.state import State
from runtime.http.json_body import BadJSON, decode_json
from runtime.routes.ai_rest import AuthError, authenticate, cf_error, envelope

PREFIX = "/client/v4/accounts/{account}/workflows"
NOT_FOUND, BAD_REQUEST = 10007, 10014
BODY_BYTES = 2 * 1024 * 1024


class TriggerRequest(msgspec.Struct, forbid_unknown_fields=True):
    """POST .../workflows/{name}/instances: a new instance (`edge workflows trigger`)."""

    instance_id: str | None = None  # default: a generated one
    params: Any = None  # the instance's event.payload


class WorkflowApi:
    def __init__(self, state: State, stores: BindingStores, configured: Callable[[], dict[str, str]]):
        self.state, self.stores, self.configured = state, stores, configured

    def routes(self) -> list[Route]:
        return [
            Route(PREFIX, self.list_workflows, methods=["GET"]),
            Route(PREFIX + "/{name}/instances", self.trigger, methods=["POST"]),
            Route(PREFIX + "/{name}/instances/{id}", self.describe, methods=["GET"]),
        ]

    async def list_workflows(self, request: Request) -> Response:
        try:
            account = authenticate(self.state, request)
        except AuthError as exc:
            return cf_error(10000, str(exc), exc.status)
        counts = await self.stores.run(self.stores.store("workflow").summary, account)
        classes = self.configured()
        names = sorted(set(classes) | set(counts))
        return envelope(
            [{"name": n, "class_name": classes.get(n), "instances": counts.get(n, {})} for n in names]
        )

    async def describe(self, request: Request) -> Response:
        try:
            account = authenticate(self.state, request)
        except AuthError as exc:
            return cf_error(10000, str(exc), exc.status)
        name, ident = request.path_params["name"], request.path_params["id"]
        found = await self.stores.run(self.stores.store("workflow").describe, account, name, ident)
        if found is None:
            return cf_error(
                NOT_FOUND, f"instance.not_found: workflow {name!r} has no instance {ident!r}", 404
            )
        return envelope(found)

    async def trigger(self, request: Request) -> Response:
        try:
            account = authenticate(self.state, request)
        except AuthError as exc:
            return cf_error(10000, str(exc), exc.status)
        name = request.path_params["name"]
        if name not in self.configured():
            listed = ", ".join(self.configured()) or "none"
            return cf_error(
                NOT_FOUND, f"no workflow {name!r} is served here (the config lists: {listed})", 404
            )
        body = await read_capped(request, BODY_BYTES)  # in chunks: None past the cap, length or not
        try:
            if body is None:
                raise BadJSON("the body is over 2 MiB")
            data = decode_json(body or b"{}", TriggerRequest)
        except (BadJSON, msgspec.ValidationError) as exc:
            return cf_error(BAD_REQUEST, f'send {{"instance_id": optional, "params": any JSON}} ({exc})', 400)
        opts = {"params": data.params} | ({"id": data.instance_id} if data.instance_id is not None else {})
        try:
            made = await self.stores.call(account, BindingRef("workflow", name), "create", [opts], {})
        except BindingError as exc:
            return cf_error(BAD_REQUEST, str(exc), 400)
        return envelope({"id": made["id"], "status": "queued"})
