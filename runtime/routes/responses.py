"""The Responses API: POST /client/v4/accounts/{account}/ai/v1/responses (OpenAI's shape, its
errors OpenAI's), and the same inputs through /ai/run and env.AI.run (Cloudflare's gpt-oss
examples call `{"instructions": ..., "input": ...}` and read `output`).

A Responses request is one AI call (runtime.ai.call.AICall, in the Responses shape), translated into
the chat inputs AIService.check validates (runtime.ai.responses_inputs), so it meets every bound and
refusal a chat call meets; the answer is shaped from the one typed result (runtime.ai.responses_shapes).
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.ai.call import RESPONSES
from runtime.ai.responses_inputs import ResponsesInputError
from runtime.http.json_body import BadJSON, decode_json
from runtime.routes.ai_rest import (
    AUTH_ERROR,
    PREFIX,
    AIApi,
    AuthError,
    openai_error,
)

log = logging.getLogger("edge.api")


class ResponsesApi:
    """POST /v1/responses, with AIApi's authentication, location and metrics."""

    def __init__(self, api: AIApi):
        self.api = api

    def routes(self) -> list[Route]:
        return [Route(PREFIX + "/ai/v1/responses", self.create, methods=["POST"])]

    async def create(self, request: Request) -> Response:
        try:
            account = self.api.authenticate(request)
        except AuthError as exc:
            return openai_error(exc.status, str(exc), AUTH_ERROR)
        try:
            body = decode_json(await request.body() or b"{}")
        except BadJSON as exc:
            return openai_error(400, str(exc))
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            return openai_error(
                400, "model: give the model to run, such as a name from /v1/models", param="model"
            )
        try:
            return await self.api.openai_answer(request, account, model, body, RESPONSES)
        except ResponsesInputError as exc:
            return openai_error(400, exc.detail, "invalid_request_error", param=exc.param)
