"""One AI call, the object every AI door makes once: env.AI.run (runtime.host.worker_calls, from the
isolate's AIRun message), POST /ai/run, the OpenAI-compatible doors and the Responses API
(runtime.routes), AI Gateway's doors (runtime.routes.gateway, env.AI.gateway(id).run) and a queued
batch's items (runtime.ai.batch).

It carries what the door was given (model, inputs, account, where the client is, the session key,
the priority header, the request id and tags) and what is decided of it once, here: its mode (a
plain run, a stream, a queued batch, a batch poll, a Responses call) and whether an embedding model
answers it; the shape its answer takes is the door's (`shape`). AIService.check validates it once
into the typed request it carries down to the PoP; the AI service completes its record once from the
result (`answered`), and every counter reads that record (runtime.control.ai_record).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from edge_sim.request import GenerateRequest, GenerateResult
from edge_sim.topology import PoP
from runtime.ai.embeddings import EMBEDDING_MODELS
from runtime.ai.shapes import quantization_label
from runtime.control.ai_record import AIRecord

# the shape of a call's answer, as its door answers it
WORKERS_AI = "workers-ai"  # Workers AI's, in the model's own schema (env.AI.run, /ai/run, gateways)
CHAT = "chat"  # OpenAI's chat completions (inputs: a decoded ChatCompletionRequest)
COMPLETION = "completion"  # OpenAI's completions (inputs: a decoded CompletionRequest)
RESPONSES = "responses"  # OpenAI's Responses API (inputs: its body)
EMBEDDINGS = "embeddings"  # OpenAI's embeddings (inputs: the texts, checked by the door)

# its mode
RUN, STREAM, BATCH, POLL = "run", "stream", "batch", "poll"


@dataclass
class AICall:
    model: str  # as the caller named it (an alias, a prefix:model): counted under this name
    inputs: Any  # as given (a dict), or decoded by the door's own API (OpenAI's structs)
    account: str
    session: str | None = None  # the x-session-affinity key (edge_sim.affinity)
    ingress: PoP | None = None  # where the client entered the edge (None: a call only checked)
    client_rtt_ms: float = 0.0
    queue: bool = False  # queueRequest: a batch to queue, not to run now
    # rejectIfBusy (the binding's third argument, the REST body's `options`): refused with 3040 rather
    # than queued when every PoP serving the model is full (edge_sim.router)
    reject_if_busy: bool = False
    priority: str | None = None  # the x-edge-priority header as given (checked with the inputs)
    request_id: str = ""  # cf-ai-req-id
    tags: tuple[str, ...] = ()
    shape: str = WORKERS_AI
    # decided once, as the call is made
    mode: str = field(init=False)
    # an embedding model's stand-in answers it (runtime.ai.embeddings): a Workers AI call naming one
    # (read off the names, as the mode is), or OpenAI's embeddings door's (which calls AIService.embed)
    embedding: bool = field(init=False)
    record: AIRecord = field(init=False)
    # set once checked (AIService.check): the typed request, and a Responses call's decoded body
    request: GenerateRequest | None = field(default=None, init=False, repr=False)
    responses: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.mode = _mode(self)
        by_name = self.shape == WORKERS_AI and self.model in EMBEDDING_MODELS
        self.embedding = self.shape == EMBEDDINGS or by_name
        self.record = AIRecord(self.model, self.account, self.request_id, self.tags)

    def answered(self, result: GenerateResult) -> AIRecord:
        """Its record completed from the generation that answered it (once: a call is answered
        once; a gateway's retry answers only after the attempt before it failed)."""
        record = self.record
        record.served = self.request.model if self.request is not None else result.model
        record.prompt_tokens, record.completion_tokens = result.prompt_tokens, result.completion_tokens
        record.timing = result.timing
        record.quantization = quantization_label(result)
        if result.timing is not None:
            record.server_timing = result.timing.server_timing()
        return record

    def cut(self, tokens: int) -> AIRecord:
        """Its record for a stream the client dropped before its end: what ran still counts against
        its account's tokens per minute (the prompt as estimated, a token per delta sent)."""
        record = self.record
        record.served = self.request.model if self.request is not None else self.model
        record.prompt_tokens, record.completion_tokens = tokens, 0
        return record

    def embedded(self, tokens: int) -> AIRecord:
        """Its record once an embedding model's stand-in answered it: its texts' tokens."""
        record = self.record
        record.served, record.prompt_tokens, record.completion_tokens = self.model, tokens, 0
        return record


def is_responses(inputs: Any) -> bool:
    """Whether /ai/run or env.AI.run inputs take OpenAI's Responses shape (they give `input`)."""
    return isinstance(inputs, dict) and "input" in inputs


def _mode(call: AICall) -> str:
    """ "batch", "poll", "responses", "stream" or "run", told apart by the door, the inputs and the
    options, once."""
    if call.shape == RESPONSES:
        return RESPONSES
    if isinstance(call.inputs, msgspec.Struct):  # decoded by an API of its own (OpenAI's)
        return STREAM if getattr(call.inputs, "stream", False) is True else RUN
    inputs = call.inputs if isinstance(call.inputs, dict) else {}
    if call.queue or "requests" in inputs:
        return BATCH
    if "request_id" in inputs:
        return POLL
    if is_responses(inputs):
        return RESPONSES
    return STREAM if inputs.get("stream") is True else RUN
