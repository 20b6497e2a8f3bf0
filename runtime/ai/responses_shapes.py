"""OpenAI's Response object and its stream of semantic events, made from the one typed result
(edge_sim.request.GenerateResult): what POST /v1/responses, and /ai/run or env.AI.run given
`input`, answer. The official client parses both (tests/integration/test_responses_api.py)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from edge_sim.request import GenerateResult
from engine.outputs import Logprobs
from engine.structured.choices import Delta
from engine.structured.tool_types import ToolCall
from runtime.ai.responses_inputs import ResponsesRequest
from runtime.ai.shape_parts import chat_logprobs
from runtime.ai.shapes import quantization, served_by, timing
from workers import AIError


def _ident(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_logprobs(steps: list[Logprobs] | None) -> list[dict[str, Any]]:
    """The Responses shape of a text's logprobs: per token {token, logprob, bytes, top_logprobs}."""
    return chat_logprobs(steps)["content"] if steps else []


def message_item(
    ident: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]
    return {"type": "message", "id": ident, "role": "assistant", "status": status, "content": content}


def call_item(ident: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": ident,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def response_usage(result: GenerateResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": _reasoning_tokens(result)},
        "total_tokens": result.total_tokens,
    }


def _reasoning_tokens(result: GenerateResult) -> int:
    return result.choices[0].reasoning_tokens if result.choices else 0


def reasoning_item(ident: str, text: str, status: str) -> dict[str, Any]:
    """A thinking model's reasoning, whole (never a summary): the item before its message."""
    return {
        "type": "reasoning",
        "id": ident,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def _tool_calls(result: GenerateResult) -> list[ToolCall]:
    return list(result.choices[0].tool_calls or []) if result.choices else []


def _text(result: GenerateResult) -> str:
    return result.choices[0].text if result.choices else result.text


class ResponseShape:
    """One response's identity and the request's echoed settings, shared by its events."""

    def __init__(self, model: str, req: ResponsesRequest):
        self.model, self.req = model, req
        self.ident = _ident("resp")
        self.created_at = int(time.time())

    def body(
        self, status: str, output: list[dict[str, Any]], result: GenerateResult | None = None
    ) -> dict[str, Any]:
        req = self.req
        incomplete = status == "incomplete"
        body: dict[str, Any] = {
            "id": self.ident,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
            "store": False,
            "temperature": req.temperature,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "top_p": req.top_p,
            "user": req.user,
            "usage": None,
        }
        if status in ("completed", "incomplete"):
            body["completed_at"] = int(time.time())
        if result is not None:
            body["output_text"] = "".join(
                part["text"] for item in output if item["type"] == "message" for part in item["content"]
            )
            body["usage"] = response_usage(result)
            body["timing"] = timing(result)
            body["quantization"] = quantization(result)
            body["served_by"] = served_by(self.model, result)
        return body


def status_of(result: GenerateResult) -> str:
    return "incomplete" if result.finish_reason == "length" else "completed"


def response_object(model: str, req: ResponsesRequest, result: GenerateResult) -> dict[str, Any]:
    """The whole Response: a message item for the text (none when the model only called tools),
    then a function_call item per call, in order."""
    shape, status = ResponseShape(model, req), status_of(result)
    output = []
    text, calls = _text(result), _tool_calls(result)
    thought = result.choices[0].reasoning if result.choices else ""
    if thought:
        output.append(reasoning_item(_ident("rs"), thought, "completed"))
    if text or not calls:
        steps = result.choices[0].logprobs if result.choices else None
        output.append(message_item(_ident("msg"), text, status, output_logprobs(steps)))
    for call in calls:
        output.append(call_item(_ident("fc"), call.id, call.name, call.arguments, "completed"))
    return shape.body(status, output, result)


# --- the stream --------------------------------------------------------------------------------------


class _Events:
    """The event sequence of one streamed response: numbered, with the open output items."""

    def __init__(self, shape: ResponseShape):
        self.shape = shape
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # items done, in order
        self.message: dict[str, Any] | None = None  # the message item being streamed
        self.calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its item being streamed
        self.pending: list[dict[str, Any]] = []  # logprobs of tokens whose text is not out yet
        self.reasoning: dict[str, Any] | None = None  # the reasoning item being streamed

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    def _index(self, item: dict[str, Any]) -> int:
        return self.output.index(item)

    def text(self, piece: str, logprobs: list[dict[str, Any]] | None = None) -> list[bytes]:
        """A text delta and its tokens' logprobs (those of tokens whose text is still held back, a
        stop string's start or part of a character, come with the next delta or the done event)."""
        self.pending += logprobs or []
        if not piece and self.message is not None:
            return []
        out = []
        if self.message is None:
            self.message = message_item(_ident("msg"), "", "in_progress")
            self.output.append(self.message)
            i = self._index(self.message)
            added = {**self.message, "content": []}
            out.append(self.event("response.output_item.added", output_index=i, item=added))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(
                self.event(
                    "response.content_part.added",
                    item_id=self.message["id"],
                    output_index=i,
                    content_index=0,
                    part=part,
                )
            )
        self.message["content"][0]["text"] += piece
        shown, self.pending = self.pending, []
        self.message["content"][0]["logprobs"] += shown
        out.append(
            self.event(
                "response.output_text.delta",
                item_id=self.message["id"],
                output_index=self._index(self.message),
                content_index=0,
                delta=piece,
                logprobs=shown,
            )
        )
        return out

    def thought(self, piece: str) -> list[bytes]:
        """A piece of the model's reasoning: its item (opened on the first) and a
        response.reasoning_text.delta."""
        out = []
        if self.reasoning is None:
            self.reasoning = reasoning_item(_ident("rs"), "", "in_progress")
            self.output.append(self.reasoning)
            i = self._index(self.reasoning)
            added = {**self.reasoning, "content": []}
            out.append(self.event("response.output_item.added", output_index=i, item=added))
            out.append(
                self.event(
                    "response.content_part.added",
                    item_id=self.reasoning["id"],
                    output_index=i,
                    content_index=0,
                    part={"type": "reasoning_text", "text": ""},
                )
            )
        self.reasoning["content"][0]["text"] += piece
        out.append(
            self.event(
                "response.reasoning_text.delta",
                item_id=self.reasoning["id"],
                output_index=self._index(self.reasoning),
                content_index=0,
                delta=piece,
            )
        )
        return out

    def call_piece(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[bytes]:
        out = []
        item = self.calls.get(index)
        if item is None:
            item = call_item(_ident("fc"), call_id or _ident("call"), name or "", "", "in_progress")
            self.calls[index] = item
            self.output.append(item)
            out.append(
                self.event("response.output_item.added", output_index=self._index(item), item=dict(item))
            )
        if arguments:
            item["arguments"] += arguments
            out.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self._index(item),
                    delta=arguments,
                )
            )
        return out

    def close(self, status: str) -> list[bytes]:
        """The done events of every open item, in output order."""
        out = []
        for item in self.output:
            i = self._index(item)
            if item["type"] == "reasoning":
                item["status"] = "completed"
                part = item["content"][0]
                ident = item["id"]
                out.append(
                    self.event(
                        "response.reasoning_text.done",
                        item_id=ident,
                        output_index=i,
                        content_index=0,
                        text=part["text"],
                    )
                )
                out.append(
                    self.event(
                        "response.content_part.done",
                        item_id=ident,
                        output_index=i,
                        content_index=0,
                        part=part,
                    )
                )
            elif item["type"] == "message":
                item["status"] = status
                part = item["content"][0]
                part["logprobs"] += self.pending
                self.pending = []
                ident = item["id"]
                out.append(
                    self.event(
                        "response.output_text.done",
                        item_id=ident,
                        output_index=i,
                        content_index=0,
                        text=part["text"],
                        logprobs=part["logprobs"],
                    )
                )
                out.append(
                    self.event(
                        "response.content_part.done",
                        item_id=ident,
                        output_index=i,
                        content_index=0,
                        part=part,
                    )
                )
            else:
                item["status"] = "completed"
                out.append(
                    self.event(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=i,
                        name=item["name"],
                        arguments=item["arguments"],
                    )
                )
            out.append(self.event("response.output_item.done", output_index=i, item=item))
        return out


async def response_events(
    items: AsyncIterator[Any], model: str, req: ResponsesRequest
) -> AsyncIterator[bytes]:
    """The Responses stream of `items` (text deltas or Delta pieces, then the GenerateResult):
    response.created and .in_progress, each output item's added / delta / done events, then
    response.completed (or .incomplete at max_output_tokens, .failed on an error)."""
    shape = ResponseShape(model, req)
    events = _Events(shape)
    yield events.event("response.created", response=shape.body("in_progress", []))
    yield events.event("response.in_progress", response=shape.body("in_progress", []))
    try:
        async for item in items:
            if isinstance(item, GenerateResult):
                status = status_of(item)
                for call in _tool_calls(item):  # calls the stream did not carry as pieces
                    if not any(c["call_id"] == call.id for c in events.calls.values()):
                        for data in events.call_piece(len(events.calls), call.id, call.name, call.arguments):
                            yield data
                if events.message is None and not events.calls:  # no text: the message is one item, empty
                    for data in events.text(""):
                        yield data
                for data in events.close(status):
                    yield data
                kind = "response.completed" if status == "completed" else "response.incomplete"
                yield events.event(kind, response=shape.body(status, events.output, item))
                return
            for data in _piece(events, item):
                yield data
    except AIError as exc:
        failed = shape.body("failed", events.output)
        failed["error"] = {"code": str(exc.code), "message": exc.detail}
        yield events.event("response.failed", response=failed)


def _piece(events: _Events, item: str | Delta) -> list[bytes]:
    if isinstance(item, str):
        return events.text(item) if item else []
    logprobs = output_logprobs(item.logprobs)
    out = events.thought(item.reasoning) if item.reasoning else []
    out += events.text(item.text, logprobs) if item.text or logprobs else []
    for call in item.tool_calls or []:
        out += events.call_piece(call.index, call.id, call.name, call.arguments)
    return out
