"""AI Gateway's REST API, as Cloudflare's (and so the `cloudflare` SDK's `client.ai_gateway`) serves
it; runtime.ai.gateway does the work, runtime.ai.gateway_registry keeps the gateways:

    GET    /client/v4/accounts/{account}/ai-gateway/gateways[?page&per_page&search]   the account's
           gateways (made on first use, declared in the config, created here), with result_info
    POST   .../gateways  {id, cache_ttl, collect_logs, rate_limiting_*, ...}    create one (409: it exists)
    GET    .../gateways/{gateway}                                                one gateway
    PUT    .../gateways/{gateway}  {cache_ttl, collect_logs, ...}   replace its settings (409: declared)
    DELETE .../gateways/{gateway}                   it, its logs and its cache gone (409: declared)
    GET    .../gateways/{gateway}/url/{provider}    its door's URL for a provider (getUrl's)
    GET    .../gateways/{gateway}/logs[?page&per_page&order_by&filters...]   a page of its log rows,
           with result_info {page, per_page, count, total_count} (runtime.ai.gateway_log_query)
    GET    .../logs/{id}                            one log row, with its bodies' sizes and heads
    PATCH  .../logs/{id}  {score?, feedback?, metadata?}
    GET    .../logs/{id}/request | /response         the body sent, the body answered, as they were
                                                     (not in the envelope: the SDK reads them bare)

Every answer but the bodies is Cloudflare's envelope; every error one too, with a stable code: 10000
authentication (401, or 403 for another account's path), 10014 a parameter or field that does not
read (400, its message starting with the parameter's name), 10007 no such gateway or log (404),
10009 a gateway of that id exists, 10010 a gateway the config declares cannot be changed here (409).
A token acts only for its own account: another account's gateways are neither listed nor reached."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.ai.gateway import Gateways
from runtime.ai.gateway_api_shapes import api_log_row
from runtime.ai.gateway_log_query import MAX_PER_PAGE, PER_PAGE, LogQuery, QueryError, integer
from runtime.ai.gateway_options import GATEWAY_ID, GatewaySettings
from runtime.ai.gateway_registry import GatewayDeclared, GatewayExists
from runtime.http.json_body import BadJSON, decode_json
from runtime.routes.ai_rest import AIApi, AuthError, cf_error, envelope
from workers import AIError

GATEWAYS = "/client/v4/accounts/{account}/ai-gateway/gateways"
ONE = GATEWAYS + "/{gateway}"
LOGS = ONE + "/logs"
AUTH_ERROR, NOT_FOUND, BAD_REQUEST = 10000, 10007, 10014
GATEWAY_EXISTS, GATEWAY_DECLARED = 10009, 10010
MAX_SEARCH = 64

Handler = Callable[[Request, str], Awaitable[Response]]


class GatewayRestApi:
    """`origin()`: the runtime's own origin, which a gateway's URL starts with (never a request's
    Host header, which any client writes)."""

    def __init__(self, api: AIApi, gateways: Gateways, origin: Callable[[], str]):
        self.api, self.gateways, self.origin = api, gateways, origin

    def routes(self) -> list[Route]:
        def door(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
            async def endpoint(request: Request) -> Response:  # async: starlette awaits it
                return await self._answer(request, handler)

            return endpoint

        return [
            Route(GATEWAYS, door(self.list_or_create), methods=["GET", "POST"]),
            Route(ONE, door(self.gateway), methods=["GET", "PUT", "DELETE"]),
            Route(ONE + "/url/{provider}", door(self.url), methods=["GET"]),
            Route(LOGS, door(self.logs), methods=["GET"]),
            Route(LOGS + "/{id}", door(self.log), methods=["GET", "PATCH"]),
            Route(LOGS + "/{id}/request", door(self.body), methods=["GET"]),
            Route(LOGS + "/{id}/response", door(self.body), methods=["GET"]),
        ]

    async def _answer(self, request: Request, handler: Handler) -> Response:
        """The request's account (its token's), then the handler; each refusal in the envelope."""
        try:
            account = self.api.authenticate(request)
            return await handler(request, account)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        except QueryError as exc:
            return cf_error(BAD_REQUEST, str(exc), 400)
        except (AIError, BadJSON) as exc:
            return cf_error(BAD_REQUEST, getattr(exc, "detail", str(exc)), 400)
        except LookupError as exc:
            return cf_error(NOT_FOUND, str(exc.args[0] if exc.args else exc), 404)
        except GatewayExists as exc:
            return cf_error(GATEWAY_EXISTS, str(exc), 409)
        except GatewayDeclared as exc:
            return cf_error(GATEWAY_DECLARED, str(exc), 409)

    # --- gateways ---------------------------------------------------------------------------------

    async def list_or_create(self, request: Request, account: str) -> Response:
        if request.method == "POST":
            body = await _object(request)
            gateway_id = body.pop("id", None)
            if not isinstance(gateway_id, str) or not GATEWAY_ID.fullmatch(gateway_id):
                raise QueryError("id", "name the gateway: 1 to 64 letters, digits, '-' or '_'")
            made = await self.gateways.create_gateway(account, gateway_id, GatewaySettings.from_api(body))
            return envelope(made.to_api())
        query = _only(request, ("page", "per_page", "search"))
        page = integer("page", query.get("page", "1"), 1, 1_000_000_000)
        per_page = integer("per_page", query.get("per_page", str(PER_PAGE)), 1, MAX_PER_PAGE)
        search = query.get("search") or None
        if search is not None and len(search) > MAX_SEARCH:
            raise QueryError("search", f"at most {MAX_SEARCH} characters")
        found, total = await self.gateways.list_gateways(account, search, page, per_page)
        return _page([g.to_api() for g in found], page, per_page, total)

    async def gateway(self, request: Request, account: str) -> Response:
        gateway_id = _gateway_id(request)
        if request.method == "GET":
            return envelope((await self.gateways.get_gateway(account, gateway_id)).to_api())
        if request.method == "DELETE":
            return envelope((await self.gateways.delete_gateway(account, gateway_id)).to_api())
        body = await _object(request)
        if body.pop("id", gateway_id) != gateway_id:
            raise QueryError("id", f"the path names gateway {gateway_id!r}; a gateway's id does not change")
        settings = GatewaySettings.from_api(body)
        return envelope((await self.gateways.update_gateway(account, gateway_id, settings)).to_api())

    async def url(self, request: Request, account: str) -> Response:
        """getUrl(provider): the one function env.AI.gateway(id).getUrl answers with
        (Gateways.url), so the two never differ; a provider this edge cannot reach is a 400 naming
        those it can."""
        gateway_id, provider = _gateway_id(request), request.path_params["provider"]
        return envelope(self.gateways.url(account, gateway_id, provider, self.origin()))

    # --- logs -------------------------------------------------------------------------------------

    async def logs(self, request: Request, account: str) -> Response:
        query = LogQuery.parse(request.query_params.multi_items())
        rows, total, meta = await self.gateways.list_logs(account, _gateway_id(request), query)
        return _page([api_log_row(r) for r in rows], query.page, query.per_page, total, meta)

    async def log(self, request: Request, account: str) -> Response:
        gateway_id, log_id = _gateway_id(request), request.path_params["id"]
        if request.method == "PATCH":
            patch = decode_json(await request.body() or b"{}")
            if not isinstance(patch, dict):
                raise QueryError("body", "send {score?, feedback?, metadata?}")
            await self.gateways.patch_log(account, gateway_id, log_id, patch)
        return envelope(api_log_row(await self.gateways.log_detail(account, gateway_id, log_id)))

    async def body(self, request: Request, account: str) -> Response:
        """The request's or the answer's body as the log kept it, bare (the SDK's logs.request and
        logs.response read it as it comes): JSON as JSON, an event stream as its text. A body past
        the store's LOG_BODY_BYTES kept its head only, answered as text with x-edge-body-kept."""
        which = request.url.path.rsplit("/", 1)[1]
        log_id = request.path_params["id"]
        kept, size, kind = await self.gateways.log_body(account, _gateway_id(request), log_id, which)
        if kept is None:
            why = "none was sent" if size is None and which == "request" else "it is no longer kept"
            raise LookupError(f"log {log_id[:64]!r} has no {which} body: {why}")
        if size is not None and len(kept) < size:
            headers = {"x-edge-body-kept": f"{len(kept)} of {size} bytes"}
            return Response(kept, media_type="text/plain; charset=utf-8", headers=headers)
        return Response(kept, media_type=kind)


def _gateway_id(request: Request) -> str:
    """The path's gateway id; one that no gateway can have is a 404, as any gateway not there."""
    gateway_id = request.path_params["gateway"]
    if not GATEWAY_ID.fullmatch(gateway_id):
        raise LookupError(f"no gateway {gateway_id[:64]!r}: an id is 1 to 64 letters, digits, '-' or '_'")
    return gateway_id


async def _object(request: Request) -> dict[str, Any]:
    body = decode_json(await request.body() or b"{}")
    if not isinstance(body, dict):
        raise QueryError("body", "send a JSON object of the gateway's fields")
    return body


def _only(request: Request, names: tuple[str, ...]) -> dict[str, str]:
    """The query's parameters, each one of `names` (QueryError naming another)."""
    query = dict(request.query_params)
    for key in query:
        if key not in names:
            raise QueryError(key[:64], f"no such parameter; this list takes {', '.join(names)}")
    return query


def _page(
    result: list[Any], page: int, per_page: int, total: int, more: dict[str, Any] | None = None
) -> JSONResponse:
    """A page of a list in the envelope, with result_info: where it lies, how many in all. The
    SDK's auto-pagination asks the next page until one comes back empty."""
    info = {"page": page, "per_page": per_page, "count": len(result), "total_count": total, **(more or {})}
    return JSONResponse(
        {"result": result, "result_info": info, "success": True, "errors": [], "messages": []}
    )
