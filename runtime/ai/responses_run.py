"""A Responses call (OpenAI's `input` / `instructions` shape) run through the AI service: the
steps /v1/responses, /ai/run, env.AI.run and the batch queue share (runtime.routes.responses serves
the route)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from edge_sim.request import GenerateRequest, GenerateResult
from edge_sim.topology import PoP
from runtime.ai.responses_inputs import ResponsesRequest, bad, chat_inputs, decode_request
from runtime.ai.responses_shapes import response_events, response_object


class AIService(Protocol):
    """What a Responses call uses of runtime.ai.service.AIService (named by shape: the service's
    own door calls these functions, so this module cannot import it)."""

    def prepare(
        self, model: str, inputs: Any, account: str, session: str | None = None, responses: bool = False
    ) -> tuple[GenerateRequest, Any]: ...

    async def generate(
        self, req: GenerateRequest, *, ingress: PoP, client_rtt_ms: float, count_as: str | None = None
    ) -> GenerateResult: ...

    def stream(
        self, req: GenerateRequest, *, ingress: PoP, client_rtt_ms: float, count_as: str | None = None
    ) -> AsyncIterator[Any]: ...


def is_responses(inputs: Any) -> bool:
    """Whether /ai/run or env.AI.run inputs take the Responses shape (they give `input`)."""
    return isinstance(inputs, dict) and "input" in inputs


def prepare_responses(
    service: AIService, model: str, body: Any, account: str, session: str | None
) -> tuple[GenerateRequest, ResponsesRequest]:
    """A Responses body validated into the typed request (AIError / ResponsesInputError)."""
    req = decode_request(body)
    if req.model is not None and req.model != model:
        raise bad(
            "model", f"names {req.model!r}, but the call is to {model!r}; leave it out or make them one"
        )
    prepared, _ = service.prepare(model, chat_inputs(req), account, session, responses=True)
    return prepared, req


async def run_responses(
    service: AIService, model: str, prepared: GenerateRequest, req: ResponsesRequest, ingress: PoP, rtt: float
) -> tuple[dict[str, Any], GenerateResult]:
    result = await service.generate(prepared, ingress=ingress, client_rtt_ms=rtt, count_as=model)
    return response_object(model, req, result), result


def stream_responses(
    service: AIService,
    model: str,
    prepared: GenerateRequest,
    req: ResponsesRequest,
    ingress: PoP,
    rtt: float,
) -> AsyncIterator[bytes]:
    items = service.stream(prepared, ingress=ingress, client_rtt_ms=rtt, count_as=model)
    return response_events(items, model, req)
