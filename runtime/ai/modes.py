"""The calls /ai/run and env.AI.run answer besides a plain model run, told apart by their inputs
and options in one place for both doors: a queued batch (`{"requests": [...]}` with queueRequest),
a batch poll (`{"request_id": ID}`), and the Responses shape (`{"input": ..., "instructions": ...}`,
answered with a Response object or its event stream)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edge_sim.request import GenerateResult
from edge_sim.topology import PoP
from runtime.ai.responses_run import is_responses, prepare_responses, run_responses, stream_responses
from workers import AIError

if TYPE_CHECKING:
    from runtime.ai.batch import BatchQueue
    from runtime.ai.service import AIService


@dataclass
class Answer:
    """What a call other than a plain run answers: a JSON body (`result`: the generation behind
    it, for metrics and timing), or an event stream."""

    body: dict[str, Any] | None = None
    result: GenerateResult | None = None
    stream: AsyncIterator[bytes] | None = None


def queue_option(options: Any) -> bool:
    """env.AI.run's `{"queueRequest": true}` option."""
    return isinstance(options, dict) and options.get("queueRequest") is True


async def special_call(
    service: AIService,
    batches: BatchQueue | None,
    model: str,
    inputs: Any,
    *,
    queue: bool,
    account: str,
    session: str | None,
    ingress: PoP,
    client_rtt_ms: float,
) -> Answer | None:
    """The answer to a batch submit, a batch poll or a Responses call; None for a plain run.
    Raises AIError as a run does."""
    is_dict = isinstance(inputs, dict)
    if queue or (is_dict and "requests" in inputs):
        if not queue:
            raise AIError(5004, "requests: a batch is queued: send it with queueRequest (true)")
        if batches is None:
            raise AIError(5004, "queueRequest: this runtime has no batch queue")
        return Answer(body=batches.submit(model, inputs, account, ingress, client_rtt_ms))
    if is_dict and "request_id" in inputs:
        if batches is None:
            raise AIError(5004, "request_id: this runtime has no batch queue")
        return Answer(body=batches.poll(model, inputs, account))
    if not is_responses(inputs):
        return None
    prepared, req = prepare_responses(service, model, inputs, account, session)
    if req.stream:
        return Answer(stream=stream_responses(service, model, prepared, req, ingress, client_rtt_ms))
    body, result = await run_responses(service, model, prepared, req, ingress, client_rtt_ms)
    return Answer(body=body, result=result)
