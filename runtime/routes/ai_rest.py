"""HTTP APIs for clients without a worker: Workers AI REST and an OpenAI-compatible surface.

    POST /client/v4/accounts/{account}/ai/run/{model}          Workers AI envelope; stream: true -> SSE
    GET  /client/v4/accounts/{account}/ai/models/search        the catalog, formats included
    POST /client/v4/accounts/{account}/ai/v1/chat/completions  OpenAI ChatCompletion (and streaming)
    POST /client/v4/accounts/{account}/ai/v1/completions       OpenAI Completion (and streaming)
    GET  /client/v4/accounts/{account}/ai/v1/models            OpenAI model list
    GET  /client/v4/accounts/{account}/ai/v1/models/{model}    OpenAI model (404 in OpenAI's shape)
    POST /client/v4/accounts/{account}/ai/v1/embeddings        OpenAI embeddings (the BGE names' stand-in)

Each call is one AI call object (runtime.ai.call.AICall) made here and answered by the AI service's
one door (runtime.ai.service.AIService.answer), in this door's shape. Request bodies:
runtime.ai.inputs (the structs), runtime.ai.refusals (what is refused and why), runtime.ai.params
(the mapping to the typed request).

Every call carries `Authorization: Bearer <token>`; a token works only for its own account.

A body's top-level `options` ({"rejectIfBusy": true}, runtime.ai.run_options.rest_body_options) is
read beside the inputs on /ai/run and the OpenAI doors. A `cf-aig-gateway-id` header sends the call
through that AI Gateway of the account (its cache, retries, rate limit and log; the other cf-aig-*
headers set its options), as Cloudflare's unified endpoint does: the answer carries cf-aig-log-id.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from edge_sim.topology import PoP, TopologyError
from runtime.ai.batch import BatchNotFound
from runtime.ai.call import CHAT, COMPLETION, EMBEDDINGS, AICall
from runtime.ai.catalog import search_models
from runtime.ai.embeddings import openai_request as embedding_request
from runtime.ai.gateway_options import GatewayOptions
from runtime.ai.gateway_universal import options_from_headers
from runtime.ai.inputs import ChatCompletionRequest, CompletionRequest
from runtime.ai.refusals import InputError, decode_inputs
from runtime.ai.run_options import rest_body_options
from runtime.control.rate_limit import AccountLimited
from runtime.http.errors import BAD_LOCATION
from runtime.http.headers import LOCATION_HEADER
from runtime.http.json_body import BadJSON, decode_json
from workers import AIError

if TYPE_CHECKING:
    from runtime.ai.gateway import GatewayAnswer, Gateways
    from runtime.ai.service import AIService
    from runtime.control.metrics import Metrics
    from runtime.control.state import State

log = logging.getLogger("edge.api")

PREFIX = "/client/v4/accounts/{account}"
AUTH_ERROR = 10000  # Cloudflare's "Authentication error"
HTTP_STATUS = {
    5007: 400, 5004: 400, 5006: 400, 3006: 413, 3040: 429, 3036: 429, 3007: 504, AUTH_ERROR: 401,
    2003: 429,  # an AI Gateway's own rate limit (runtime.ai.gateway)
}  # fmt: skip


SEARCH_PER_PAGE, SEARCH_MAX_PER_PAGE = 20, 1000  # a v4 paginated list's default page size
BAD_QUERY = 1004  # a query parameter out of range (Cloudflare documents no code of its own for it)


def envelope(result: Any = None, errors: list[dict] | None = None, status: int = 200) -> JSONResponse:
    return JSONResponse(
        {"result": result, "success": not errors, "errors": errors or [], "messages": []}, status_code=status
    )


def cf_error(code: int, message: str, status: int | None = None) -> JSONResponse:
    return envelope(None, [{"code": code, "message": message}], status or HTTP_STATUS.get(code, 400))


def ai_error(exc: AIError) -> JSONResponse:
    """A failed AI call in the Workers AI envelope; a rate-limited one with its Retry-After."""
    return _logged(_retry_after(cf_error(exc.code, exc.detail), exc), exc)


def openai_ai_error(exc: AIError, status: int) -> JSONResponse:
    """A failed AI call in OpenAI's shape: a rate-limited one as OpenAI answers it (429, type
    "requests" or "tokens", code "rate_limit_exceeded", Retry-After), others with their code."""
    if isinstance(exc, AccountLimited):
        kind = "requests" if exc.refusal.limit == "rpm" else "tokens"
        body = {"message": exc.detail, "type": kind, "param": None, "code": "rate_limit_exceeded"}
        return _logged(_retry_after(JSONResponse({"error": body}, status_code=429), exc), exc)
    return _logged(openai_error(HTTP_STATUS.get(exc.code, status), exc.detail, exc.code, exc.param), exc)


def _logged(response: JSONResponse, exc: AIError) -> JSONResponse:
    """A call that failed through an AI Gateway names the log row the gateway kept of it
    (cf-aig-log-id), as its answer would have."""
    log_id = getattr(exc, "log_id", None)
    if log_id is not None:
        response.headers["cf-aig-log-id"] = log_id
    return response


def _retry_after(response: JSONResponse, exc: AIError) -> JSONResponse:
    retry_after = getattr(exc, "retry_after", None)  # an account's limits, a gateway's rate limit
    if isinstance(retry_after, int):
        response.headers["retry-after"] = str(retry_after)
    return response


def gateway_options(request: Request, gateway: str) -> GatewayOptions:
    """Gateway `gateway`'s options for a call, as the request's cf-aig-* headers set them
    (runtime.ai.gateway_universal's reading, shared with the universal run's steps); AIError naming a
    header that does not read."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    return GatewayOptions.parse({"id": gateway, **options_from_headers(headers)})


class AuthError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def openai_error(
    status: int, message: str, code: str | int | None = None, param: str | None = None
) -> JSONResponse:
    kind = (
        "authentication_error"
        if status == 401
        else "invalid_request_error"
        if status < 500
        else "server_error"
    )
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status
    )


def session_key(request: Request) -> str | None:
    """Cloudflare's prompt-caching header: calls naming one session go back to the PoP that holds
    its prefix cache (edge_sim.affinity)."""
    return request.headers.get("x-session-affinity")


def authenticate(state, request: Request) -> str:
    """The account a request acts for (by its Bearer token); it must be the one in its path."""
    header = request.headers.get("authorization", "")
    if not header.lower().startswith("bearer "):
        raise AuthError(401, "send Authorization: Bearer <API token> (edge dev prints one at first start)")
    account = state.account_for(header[7:].strip())
    if account is None:
        raise AuthError(401, "the API token is not valid")
    if account != request.path_params["account"]:
        raise AuthError(
            403,
            f"this token belongs to another account; it cannot act for {request.path_params['account']!r}",
        )
    return account


class Located(Protocol):
    """What the AI APIs read of a located request (runtime.host.invocation.Invocation)."""

    ingress: PoP
    client_rtt_ms: float


class AIApiHost(Protocol):
    """What the AI APIs use of the runtime (runtime.app.ApiServices)."""

    state: State
    ai: AIService
    metrics: Metrics

    def locate(self, request: Request) -> Located: ...

    def catalog_view(self) -> list[dict[str, Any]]: ...


GATEWAY_HEADER = "cf-aig-gateway-id"


class AIApi:
    def __init__(self, runtime: AIApiHost, gateways: Gateways | None = None):
        """`gateways`: the accounts' AI Gateways, for calls that name one in cf-aig-gateway-id
        (None: such a call is refused, saying this runtime has none)."""
        self.runtime = runtime
        self.gateways = gateways

    def routes(self) -> list[Route]:
        return [
            Route(PREFIX + "/ai/run/{model:path}", self.run, methods=["POST"]),
            Route(PREFIX + "/ai/models/search", self.search, methods=["GET"]),
            Route(PREFIX + "/ai/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route(PREFIX + "/ai/v1/completions", self.completions, methods=["POST"]),
            Route(PREFIX + "/ai/v1/models", self.openai_models, methods=["GET"]),
            Route(PREFIX + "/ai/v1/models/{model:path}", self.openai_model, methods=["GET"]),
            Route(PREFIX + "/ai/v1/embeddings", self.embeddings, methods=["POST"]),
        ]

    # --- shared -----------------------------------------------------------------------------------

    def authenticate(self, request: Request) -> str:
        return authenticate(self.runtime.state, request)

    def _where(self, request: Request):
        """The ingress PoP and client RTT; AIError (400, the front door's code) for a location
        header that names no place."""
        try:
            ctx = self.runtime.locate(request)
        except TopologyError as exc:
            raise AIError(BAD_LOCATION, f"{LOCATION_HEADER}: {exc}") from None
        return ctx.ingress, ctx.client_rtt_ms

    async def _json(self, request: Request) -> Any:
        return decode_json(await request.body() or b"{}")

    async def _answer(
        self, request: Request, call: AICall, shape: str, gateway: str | None = None
    ) -> tuple[Any, list[tuple[str, str]]]:
        """The call answered by the AI service, or through an AI Gateway: `gateway` (a gateway
        door's path names it), else the one its cf-aig-gateway-id header names (`shape`: the
        gateway's name for the answer's shape, which keys its cache): (the answer, the cf-aig-*
        headers to send back). Raises AIError."""
        gateway = gateway or request.headers.get(GATEWAY_HEADER)
        if gateway is None:
            return await self.runtime.ai.answer(call), []
        if self.gateways is None:
            raise AIError(5004, f"{GATEWAY_HEADER}: this runtime has no AI Gateway to route the call through")
        options = gateway_options(request, gateway)
        through: GatewayAnswer = await self.gateways.run(
            call, options, shape=shape, body=await request.body()
        )
        return through.answer, list(through.headers)

    # --- Workers AI REST ----------------------------------------------------------------------------

    async def run(self, request: Request) -> Response:
        """POST /ai/run/{model}; every answer names its request (cf-ai-req-id), as Cloudflare's."""
        request_id = str(uuid.uuid4())
        response = await self._run(request, request_id)
        response.headers["cf-ai-req-id"] = request_id
        return response

    async def _run(self, request: Request, request_id: str) -> Response:
        try:
            account = self.authenticate(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        model = request.path_params["model"]
        try:
            inputs = await self._json(request)
        except BadJSON as exc:
            return cf_error(5004, f"{exc}; send the model inputs as a JSON object")
        try:
            inputs, busy = rest_body_options(inputs)
            ingress, rtt = self._where(request)
            call = AICall(
                model,
                inputs,
                account,
                session_key(request),
                ingress,
                rtt,
                queue=request.query_params.get("queueRequest", "").lower() == "true",
                reject_if_busy=busy,
                priority=request.headers.get("x-edge-priority"),
                request_id=request_id,
            )
            answer, headers = await self._answer(request, call, "workers-ai")
        except BatchNotFound as exc:
            return cf_error(exc.code, exc.detail, 404)
        except AIError as exc:
            return ai_error(exc)
        if answer.stream is not None:
            return StreamingResponse(answer.stream, media_type="text/event-stream", headers=dict(headers))
        response = envelope(answer.body)
        response.headers.update(dict(headers))
        if answer.result is not None:
            response.headers["server-timing"] = call.record.server_timing
        return response

    async def search(self, request: Request) -> Response:
        """Cloudflare's Model Search: `search` (in the name or description), `task` (a task name,
        "Text Generation"), `author` (the name's second part, `@cf/<author>/...`), `page` and
        `per_page`; `result_info` says where the page lies. `hide_experimental` and `source` are
        accepted: no model here is experimental, and all come from one source."""
        try:
            self.authenticate(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        query = request.query_params
        try:
            page = int(query.get("page", "1"))
            per_page = int(query.get("per_page", str(SEARCH_PER_PAGE)))
            if page < 1 or not 1 <= per_page <= SEARCH_MAX_PER_PAGE:
                raise ValueError
        except ValueError:
            return cf_error(
                BAD_QUERY,
                f"page must be an integer from 1 and per_page one from 1 to {SEARCH_MAX_PER_PAGE}",
                400,
            )
        models = search_models(
            self.runtime.catalog_view(), query.get("search"), query.get("task"), query.get("author")
        )
        shown = models[(page - 1) * per_page : page * per_page]
        info = {"page": page, "per_page": per_page, "count": len(shown), "total_count": len(models)}
        return JSONResponse(
            {"result": shown, "success": True, "errors": [], "messages": [], "result_info": info}
        )

    # --- OpenAI-compatible ----------------------------------------------------------------------------

    async def _openai_call(self, request: Request, kind: type) -> tuple[str, Any, bool] | Response:
        """(the account, the decoded body, its options' rejectIfBusy), or the error to answer."""
        try:
            account = self.authenticate(request)
        except AuthError as exc:
            return openai_error(exc.status, str(exc), AUTH_ERROR)
        try:
            inputs, busy = rest_body_options(decode_json(await request.body()))
            body = decode_inputs(inputs, kind, "OpenAI's API")
        except InputError as exc:
            return openai_ai_error(exc, 400)
        except AIError as exc:
            return openai_ai_error(exc, 400)
        except BadJSON as exc:
            return openai_error(400, str(exc))
        return account, body, busy

    async def chat_completions(self, request: Request) -> Response:
        return await self._openai(request, ChatCompletionRequest, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._openai(request, CompletionRequest, chat=False)

    async def _openai(self, request: Request, kind: type, chat: bool) -> Response:
        decoded = await self._openai_call(request, kind)
        if isinstance(decoded, Response):
            return decoded
        account, body, busy = decoded
        shape = CHAT if chat else COMPLETION
        return await self.openai_answer(request, account, body.model, body, shape, reject_if_busy=busy)

    async def openai_answer(
        self, request: Request, account: str, model: str, inputs, shape: str, reject_if_busy: bool = False
    ) -> Response:
        """The call an OpenAI-shaped door makes, answered in OpenAI's way: its SSE stream, or its body
        with Server-Timing; an AIError as OpenAI's error (400 refused before it ran, 500 while)."""
        call = None
        try:
            ingress, rtt = self._where(request)
            call = AICall(
                model,
                inputs,
                account,
                session_key(request),
                ingress,
                rtt,
                shape=shape,
                reject_if_busy=reject_if_busy,
            )
            answer, headers = await self._answer(request, call, "openai")
        except AIError as exc:
            return openai_ai_error(exc, 400 if call is None or call.request is None else 500)
        if answer.stream is not None:
            return StreamingResponse(answer.stream, media_type="text/event-stream", headers=dict(headers))
        response = JSONResponse(answer.body, headers=dict(headers))
        if answer.result is not None:
            response.headers["server-timing"] = call.record.server_timing
        return response

    async def openai_models(self, request: Request) -> Response:
        try:
            self.authenticate(request)
        except AuthError as exc:
            return openai_error(exc.status, str(exc), AUTH_ERROR)
        created = int(time.time())
        return JSONResponse(
            {"object": "list", "data": [_model_object(m, created) for m in self.runtime.catalog_view()]}
        )

    async def openai_model(self, request: Request) -> Response:
        """models.retrieve: a model in the catalog or served, or 404 in OpenAI's shape (model_not_found)."""
        try:
            self.authenticate(request)
        except AuthError as exc:
            return openai_error(exc.status, str(exc), AUTH_ERROR)
        wanted = request.path_params["model"]
        known = {m["name"] for m in self.runtime.catalog_view()} | set(self.runtime.ai.names())
        if wanted in known:
            return JSONResponse(_model_object({"name": wanted}, int(time.time())))
        return openai_error(
            404,
            f"The model {wanted!r} does not exist here; GET /models lists those served",
            "model_not_found",
            "model",
        )

    async def embeddings(self, request: Request) -> Response:
        """OpenAI's embeddings.create under an embedding model's name (runtime.ai.embeddings):
        `input` a string or a list of strings, `model`, `encoding_format` "float"; a text
        generation model's name is a 400 naming the embedding models."""
        try:
            account = self.authenticate(request)
        except AuthError as exc:
            return openai_error(exc.status, str(exc), AUTH_ERROR)
        try:
            body = decode_json(await request.body() or b"{}")
        except BadJSON as exc:
            return openai_error(400, str(exc))
        return await self.openai_embeddings(request, account, body)

    async def openai_embeddings(
        self, request: Request, account: str, body: Any, model: str | None = None, gateway: str | None = None
    ) -> Response:
        """OpenAI's embeddings answered for `account`, through `gateway` (the compat door's) or the
        one cf-aig-gateway-id names, if any; `model` in place of the body's (the compat door's, its
        provider stripped)."""
        try:
            body, busy = rest_body_options(body)
            if model is not None and isinstance(body, dict):
                body = {**body, "model": model}
            model, _ = embedding_request(body, self.runtime.ai.names())
            call = AICall(model, body, account, shape=EMBEDDINGS, reject_if_busy=busy)
            answer, headers = await self._answer(request, call, "openai", gateway)
        except AIError as exc:
            if exc.code == 5007:  # OpenAI's answer for a model that cannot serve the call
                return openai_error(404, exc.detail, "model_not_found", "model")
            return openai_ai_error(exc, 400)
        return JSONResponse(answer.body, headers=dict(headers))


def _model_object(entry: dict[str, Any], created: int) -> dict[str, Any]:
    return {"id": entry["name"], "object": "model", "created": created, "owned_by": "edge-workers"}
