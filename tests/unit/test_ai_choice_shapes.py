"""Shaping n choices, tool calls, logprobs and include_usage from hand-built results and Delta
streams (runtime.ai.shapes), as OpenAI and Workers AI answer them."""

import asyncio
import json

import pytest

from edge_sim.accounting import LatencyAccount
from edge_sim.request import Formats, GenerateResult
from engine.outputs import Logprobs, TokenLogprob
from engine.structured.choices import Choice, Delta
from engine.structured.tool_types import ToolCall, ToolCallDelta
from runtime.ai.shapes import openai_events, shape_result, text_completion, workers_ai_events
from workers import AIError

MODEL = "@edge/test/tiny"
A, B = TokenLogprob("a", -0.1, [97]), TokenLogprob("b", -2.3, [98])
STEP = Logprobs(chosen=A, top=[A, B])
CALL = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Seoul"}')


def result(choices=(), text="hi", finish="stop"):
    return GenerateResult(
        text=text,
        finish_reason=finish,
        prompt_tokens=3,
        completion_tokens=4,
        queue_ms=0,
        prefill_ms=1,
        decode_ms=2,
        pop="ICN",
        model=MODEL,
        formats=Formats("bf16", "auto", {}),
        timing=LatencyAccount(
            client_rtt_ms=1,
            backbone_rtt_ms=0,
            ingress="ICN",
            pop="ICN",
            queue_ms=0,
            prefill_ms=1,
            decode_ms=2,
        ),
        choices=list(choices),
    )


def test_a_result_without_choices_is_one_choice_of_its_text():
    body = shape_result("chat-completions", MODEL, result())
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]


def test_n_choices_tool_calls_and_chat_logprobs():
    two = [
        Choice(index=1, text="", finish_reason="tool_calls", completion_tokens=2, tool_calls=[CALL]),
        Choice(index=0, text="a", finish_reason="length", completion_tokens=2, logprobs=[STEP]),
    ]
    choices = shape_result("chat-completions", MODEL, result(two))["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[0]["logprobs"] == {
        "content": [
            {
                "token": "a",
                "logprob": -0.1,
                "bytes": [97],
                "top_logprobs": [
                    {"token": "a", "logprob": -0.1, "bytes": [97]},
                    {"token": "b", "logprob": -2.3, "bytes": [98]},
                ],
            }
        ]
    }
    assert choices[0]["finish_reason"] == "length"
    called = choices[1]
    assert called["finish_reason"] == "tool_calls" and called["message"]["content"] is None
    assert called["message"]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'},
        }
    ]
    workers = shape_result("text-generation", MODEL, result([two[0]]))
    assert workers["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": {"city": "Seoul"}}]
    assert workers["finish_reason"] == "tool_calls"


def test_completion_logprobs_in_openai_legacy_shape():
    steps = [STEP, Logprobs(chosen=B, top=[A])]
    body = text_completion(
        MODEL, result([Choice(text="ab", finish_reason="stop", completion_tokens=2, logprobs=steps)])
    )
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["a", "b"],
        "token_logprobs": [-0.1, -2.3],
        "top_logprobs": [{"a": -0.1, "b": -2.3}, {"a": -0.1}],
        "text_offset": [0, 1],
    }


async def _items(*items):
    for item in items:
        yield item


def events(stream) -> list:
    async def collect():
        return [chunk async for chunk in stream]

    out = []
    for chunk in asyncio.run(collect()):
        payload = chunk.decode().removeprefix("data: ").strip()
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_streamed_choices_tool_call_pieces_logprobs_and_the_usage_chunk():
    final = result(
        [
            Choice(index=0, text="a", finish_reason="stop", completion_tokens=1, logprobs=[STEP]),
            Choice(index=1, text="", finish_reason="tool_calls", completion_tokens=3, tool_calls=[CALL]),
        ]
    )
    items = _items(
        Delta(text="a", index=0, logprobs=[STEP]),
        Delta(index=1, tool_calls=[ToolCallDelta(index=0, id="call_1", name="get_weather")]),
        Delta(index=1, tool_calls=[ToolCallDelta(index=0, arguments='{"city": "Seoul"}')]),
        final,
    )
    got = events(openai_events(items, MODEL, True, include_usage=True, n=2))
    assert got[-1] == "[DONE]"
    chunks = got[:-1]
    assert all("usage" in c for c in chunks) and all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert [c["index"] for c in chunks[0]["choices"]] == [0, 1]  # each choice's role first
    assert chunks[1]["choices"][0]["logprobs"]["content"][0]["token"] == "a"
    first, rest = (
        chunks[2]["choices"][0]["delta"]["tool_calls"],
        chunks[3]["choices"][0]["delta"]["tool_calls"],
    )
    assert first == [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    ]
    assert rest == [{"index": 0, "function": {"arguments": '{"city": "Seoul"}'}}]
    ends = {c["index"]: c["finish_reason"] for c in chunks[4]["choices"]}
    assert ends == {0: "stop", 1: "tool_calls"}


def test_without_include_usage_the_last_chunk_carries_it_as_before():
    got = events(openai_events(_items("h", "i", result()), MODEL, True))
    assert all("usage" not in c for c in got[:-2])
    assert got[-2]["choices"][0]["finish_reason"] == "stop" and got[-2]["usage"]["total_tokens"] == 7
    text = events(openai_events(_items(Delta(text="ab", logprobs=[STEP, STEP]), result()), MODEL, False))
    assert text[0]["choices"][0]["text"] == "ab" and text[0]["choices"][0]["logprobs"]["text_offset"] == [
        0,
        1,
    ]


def test_workers_ai_stream_reads_deltas_and_ends_with_the_tool_calls():
    final = result([Choice(text="", finish_reason="tool_calls", completion_tokens=4, tool_calls=[CALL])])
    got = events(workers_ai_events(_items(Delta(text="x"), "y", final), MODEL, chat=False))
    assert got[0] == {"response": "x"} and got[1] == {"response": "y"}
    assert got[2]["tool_calls"][0]["arguments"] == {"city": "Seoul"} and got[-1] == "[DONE]"


def test_json_mode_answers_the_parsed_value_in_workers_ai_shape_only():
    """Cloudflare's JSON Mode: `response` is the object; the chat shape keeps a string; an answer
    that is not whole JSON is "JSON Mode couldn't be met", never a string passed off as one."""
    text = '{"name": "India", "capital": "New Delhi"}'
    workers = shape_result("text-generation", MODEL, result(text=text), json_mode=True)
    assert workers["response"] == {"name": "India", "capital": "New Delhi"}
    assert shape_result("text-generation", MODEL, result(text=text))["response"] == text
    chat = shape_result("chat-completions", MODEL, result(text=text), json_mode=True)
    assert chat["choices"][0]["message"]["content"] == text
    with pytest.raises(AIError) as err:
        shape_result("text-generation", MODEL, result(text='{"name": "Ind'), json_mode=True)
    assert err.value.code == 5004 and err.value.detail.startswith("JSON Mode couldn't be met")
