"""AI Gateway's HTTP doors (runtime.ai.gateway does the work):

    POST /cdn-cgi/ai-gateway/v1/{account}/{gateway}/workers-ai/{model}   a Workers AI call through
         the gateway (what `env.AI.gateway(id).getUrl("workers-ai")` names); the request's cf-aig-*
         headers set its options: cf-aig-cache-ttl, cf-aig-skip-cache, cf-aig-cache-key,
         cf-aig-request-timeout, cf-aig-max-attempts, cf-aig-retry-delay, cf-aig-backoff,
         cf-aig-collect-log, cf-aig-event-id, cf-aig-metadata (JSON); the answer carries
         cf-aig-log-id and cf-aig-cache-status
    POST /cdn-cgi/ai-gateway/v1/{account}/{gateway}/compat/chat/completions   OpenAI's chat
         completions through the gateway (`getUrl("compat")`: an OpenAI SDK's base_url), `model`
         "workers-ai/<model>"

The gateways themselves, their logs (listed, read, patched, their bodies) and their URLs are
Cloudflare's REST API under /client/v4/accounts/{account}/ai-gateway/gateways:
runtime.routes.gateway_rest.

Cloudflare serves the first at gateway.ai.cloudflare.com/v1/{account}/{gateway}/...; here it is
under the runtime's own /cdn-cgi/ prefix, so it never shadows a worker's paths. Each is
authenticated by the account's API token (Authorization: Bearer), the path's account the token's
own: another account's gateway, cache and logs are never reached."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime.ai.call import CHAT, AICall
from runtime.ai.gateway import OPENAI, GatewayOptions, Gateways
from runtime.ai.gateway_universal import options_from_headers
from runtime.ai.inputs import ChatCompletionRequest
from runtime.http.json_body import BadJSON, decode_json
from runtime.routes.ai_rest import (
    AIApi,
    AuthError,
    ai_error,
    cf_error,
    envelope,
    openai_ai_error,
    openai_error,
    session_key,
)
from workers import AIError

DOOR = "/cdn-cgi/ai-gateway/v1/{account}/{gateway}"
AUTH_ERROR = 10000


class GatewayApi:
    def __init__(self, api: AIApi, gateways: Gateways):
        self.api, self.gateways = api, gateways

    def routes(self) -> list[Route]:
        return [
            Route(DOOR + "/workers-ai/{model:path}", self.run, methods=["POST"]),
            Route(DOOR + "/compat/chat/completions", self.compat, methods=["POST"]),
        ]

    async def run(self, request: Request) -> Response:
        request_id = str(uuid.uuid4())  # cf-ai-req-id, as the REST door's; logged with the call
        try:
            account = self.api.authenticate(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        body = await request.body()
        try:
            inputs = decode_json(body or b"{}")
        except BadJSON as exc:
            return cf_error(5004, f"{exc}; send the model inputs as a JSON object")
        try:
            options = GatewayOptions.parse({"id": request.path_params["gateway"], **_header_options(request)})
            ingress, rtt = self.api._where(request)
            session = session_key(request)
            model = request.path_params["model"]
            call = AICall(model, inputs, account, session, ingress, rtt, request_id=request_id)
            through = await self.gateways.run(call, options, body=body)
        except AIError as exc:
            response = _logged(ai_error(exc), exc)
            response.headers["cf-ai-req-id"] = request_id
            return response
        headers = {**dict(through.headers), "cf-ai-req-id": request_id}
        answer = through.answer
        if answer.stream is not None:
            return StreamingResponse(answer.stream, media_type="text/event-stream", headers=headers)
        response = envelope(answer.body)
        response.headers.update(headers)
        return response

    async def compat(self, request: Request) -> Response:
        """AI Gateway's OpenAI-compatible door: a chat completion whose `model` is
        "workers-ai/<model>" (a bare model name too), through the gateway's cache, retries and logs,
        answered in OpenAI's shape (or its event stream)."""
        decoded = await self.api._openai_call(request, ChatCompletionRequest)
        if isinstance(decoded, Response):
            return decoded
        account, body, busy = decoded
        if "/" in body.model and not body.model.startswith(("workers-ai/", "@")):
            where = body.model.split("/", 1)[0]
            why = f"model: provider {where!r} cannot be reached from this edge (no network); "
            why += "name workers-ai/<model>"
            return openai_error(400, why, 5007, "model")
        model = body.model.removeprefix("workers-ai/")
        body = msgspec.structs.replace(body, model=model)
        try:
            options = GatewayOptions.parse({"id": request.path_params["gateway"], **_header_options(request)})
            ingress, rtt = self.api._where(request)
            call = AICall(model, body, account, None, ingress, rtt, shape=CHAT, reject_if_busy=busy)
            through = await self.gateways.run(call, options, shape=OPENAI, body=await request.body())
        except AIError as exc:
            return _logged(openai_ai_error(exc, 400), exc)
        if through.answer.stream is not None:
            return StreamingResponse(
                through.answer.stream, media_type="text/event-stream", headers=dict(through.headers)
            )
        return JSONResponse(through.answer.body, headers=dict(through.headers))


def _header_options(request: Request) -> dict[str, Any]:
    """The gateway options a request's cf-aig-* headers set (runtime.ai.gateway_universal's,
    shared with the universal run's steps); AIError naming a header that does not read."""
    return options_from_headers({k.lower(): v for k, v in request.headers.items()})


def _logged(response: Response, exc: AIError) -> Response:
    """A failed call's answer, naming the log row the gateway kept of it (cf-aig-log-id)."""
    log_id = getattr(exc, "log_id", None)
    if log_id is not None:
        response.headers["cf-aig-log-id"] = log_id
    return response
