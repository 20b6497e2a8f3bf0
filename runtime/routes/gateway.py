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
    POST .../compat/embeddings   OpenAI's embeddings through the gateway, `model`
         "workers-ai/@cf/baai/bge-..."
    GET  .../compat/models       the models the compat door reaches, as OpenAI lists them
         ("workers-ai/<name>", what `model` takes)

A body's `options` ({"rejectIfBusy": true}) is read as the REST API reads it
(runtime.ai.run_options.rest_body_options).

The gateways themselves, their logs (listed, read, patched, their bodies) and their URLs are
Cloudflare's REST API under /client/v4/accounts/{account}/ai-gateway/gateways:
runtime.routes.gateway_rest.

Cloudflare serves the first at gateway.ai.cloudflare.com/v1/{account}/{gateway}/...; here it is
under the runtime's own /cdn-cgi/ prefix, so it never shadows a worker's paths. Each is
authenticated by the account's API token (Authorization: Bearer), the path's account the token's
own: another account's gateway, cache and logs are never reached."""

from __future__ import annotations

import time
import uuid

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime.ai.call import CHAT, AICall
from runtime.ai.gateway import OPENAI, PROVIDER, Gateways
from runtime.ai.inputs import ChatCompletionRequest
from runtime.ai.run_options import rest_body_options
from runtime.http.json_body import BadJSON, decode_json
from runtime.routes.ai_rest import (
    AIApi,
    AuthError,
    ai_error,
    cf_error,
    envelope,
    gateway_options,
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
            Route(DOOR + "/compat/embeddings", self.compat_embeddings, methods=["POST"]),
            Route(DOOR + "/compat/models", self.compat_models, methods=["GET"]),
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
            inputs, busy = rest_body_options(inputs)
            options = gateway_options(request, request.path_params["gateway"])
            ingress, rtt = self.api._where(request)
            session = session_key(request)
            model = request.path_params["model"]
            call = AICall(
                model, inputs, account, session, ingress, rtt, reject_if_busy=busy, request_id=request_id
            )
            through = await self.gateways.run(call, options, body=body)
        except AIError as exc:
            response = ai_error(exc)
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
        model = _compat_model(body.model)
        if isinstance(model, Response):
            return model
        body = msgspec.structs.replace(body, model=model)
        try:
            options = gateway_options(request, request.path_params["gateway"])
            ingress, rtt = self.api._where(request)
            call = AICall(model, body, account, None, ingress, rtt, shape=CHAT, reject_if_busy=busy)
            through = await self.gateways.run(call, options, shape=OPENAI, body=await request.body())
        except AIError as exc:
            return openai_ai_error(exc, 400)
        if through.answer.stream is not None:
            return StreamingResponse(
                through.answer.stream, media_type="text/event-stream", headers=dict(through.headers)
            )
        return JSONResponse(through.answer.body, headers=dict(through.headers))

    async def compat_embeddings(self, request: Request) -> Response:
        """OpenAI's embeddings through the gateway: `model` "workers-ai/<an embedding name>",
        answered as /ai/v1/embeddings answers, with the gateway's cache, retries and log."""
        try:
            account = self.api.authenticate(request)
        except AuthError as exc:
            return openai_error(exc.status, str(exc), AUTH_ERROR)
        try:
            body = decode_json(await request.body() or b"{}")
        except BadJSON as exc:
            return openai_error(400, str(exc))
        named = body.get("model") if isinstance(body, dict) else None
        model = _compat_model(named) if isinstance(named, str) else None
        if isinstance(model, Response):
            return model
        gateway = request.path_params["gateway"]
        return await self.api.openai_embeddings(request, account, body, model=model, gateway=gateway)

    async def compat_models(self, request: Request) -> Response:
        """The models the compat door reaches, under the names its `model` takes."""
        try:
            self.api.authenticate(request)
        except AuthError as exc:
            return openai_error(exc.status, str(exc), AUTH_ERROR)
        created = int(time.time())
        models = [
            {
                "id": f"{PROVIDER}/{m['name']}",
                "object": "model",
                "created": created,
                "owned_by": "edge-workers",
            }
            for m in self.api.runtime.catalog_view()
        ]
        return JSONResponse({"object": "list", "data": models})


def _compat_model(name: str) -> str | Response:
    """The compat door's `model` ("workers-ai/<model>", or a bare Workers AI name) as the AI
    service names it, or the OpenAI-shaped 400 for a provider this edge cannot reach."""
    if "/" in name and not name.startswith((f"{PROVIDER}/", "@")):
        where = name.split("/", 1)[0]
        why = f"model: provider {where!r} cannot be reached from this edge (no network); "
        why += f"name {PROVIDER}/<model>"
        return openai_error(400, why, 5007, "model")
    return name.removeprefix(f"{PROVIDER}/")
