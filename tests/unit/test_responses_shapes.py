"""The Response object and its event stream for answers with tool calls (the engine's Delta
pieces), checked against the official client's own types with validation on."""

import asyncio
import json

import pytest

from edge_sim.request import Formats, GenerateResult
from engine.structured.choices import Choice, Delta
from engine.structured.tool_types import ToolCall, ToolCallDelta
from runtime.ai.responses_inputs import decode_request
from runtime.ai.responses_shapes import response_events, response_object

types = pytest.importorskip("openai.types.responses")
pydantic = pytest.importorskip("pydantic")

CALL = ToolCall(id="call_1", name="lookup", arguments='{"q": 1}')


def result(text: str, calls: list[ToolCall] | None, finish: str = "tool_calls") -> GenerateResult:
    choice = Choice(text=text, finish_reason=finish, completion_tokens=7, tool_calls=calls)
    return GenerateResult(
        text=text,
        finish_reason=finish,
        prompt_tokens=11,
        completion_tokens=7,
        queue_ms=0.0,
        prefill_ms=1.0,
        decode_ms=2.0,
        pop="ICN",
        model="@edge/test/tiny",
        formats=Formats("bf16", "auto", {}),
        choices=[choice],
    )


REQ = decode_request(
    {"input": "x", "tools": [{"type": "function", "name": "lookup"}], "tool_choice": "required"}
)


def test_a_call_only_answer_is_one_function_call_item():
    body = response_object("@edge/test/tiny", REQ, result("", [CALL]))
    parsed = types.Response.model_validate(body)
    [item] = parsed.output
    assert item.type == "function_call" and item.call_id == "call_1" and item.arguments == '{"q": 1}'
    assert (
        parsed.status == "completed" and parsed.tool_choice == "required" and parsed.usage.total_tokens == 18
    )


async def collect(items):
    async def gen():
        for item in items:
            yield item

    return [chunk async for chunk in response_events(gen(), "@edge/test/tiny", REQ)]


def test_streamed_call_pieces_reassemble_to_the_call():
    pieces = [
        Delta(text="Looking"),
        Delta(tool_calls=[ToolCallDelta(index=0, id="call_1", name="lookup")]),
        Delta(tool_calls=[ToolCallDelta(index=0, arguments='{"q": ')]),
        Delta(tool_calls=[ToolCallDelta(index=0, arguments="1}")]),
        result("Looking", [CALL]),
    ]
    chunks = asyncio.run(collect(pieces))
    adapter = pydantic.TypeAdapter(types.ResponseStreamEvent)
    events = [adapter.validate_python(json.loads(c.decode().split("data: ", 1)[1])) for c in chunks]
    kinds = [e.type for e in events]
    assert kinds.count("response.function_call_arguments.delta") == 2
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments == CALL.arguments
    final = events[-1]
    assert final.type == "response.completed"
    assert [o.type for o in final.response.output] == ["message", "function_call"]
    assert (
        final.response.output[1].call_id == "call_1" and final.response.output[0].content[0].text == "Looking"
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
