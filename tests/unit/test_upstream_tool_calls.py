"""An upstream (OpenAI-compatible) PoP's tool calls are parsed, never trusted: against a fake
upstream (httpx.MockTransport), a call whose arguments are not a JSON object, one of a function
never declared, one the tool choice or parallel_tool_calls rules out, one breaking a strict tool's
schema, and one cut off by max_tokens are all dropped (never streamed in part), while a valid one,
markers inside its strings and all, comes back whole, streamed exactly as returned."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from edge_sim.upstream_wire import ChunkReader
from engine import SamplingParams
from engine.structured.tool_types import ToolFunction
from tests.unit.test_upstream_node import USAGE, chat, chat_chunk, node_with, run, sse

WEATHER = ToolFunction(
    name="get_weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    strict=True,
)
CLOCK = ToolFunction(name="now")


def call(index: int, name: str | None, arguments: str, ident: str | None = None) -> dict:
    fn = {"arguments": arguments} | ({"name": name} if name else {})
    return {"index": index, "function": fn} | ({"id": ident} if ident else {})


def answer(*deltas: dict, finish: str = "tool_calls", tools=(WEATHER, CLOCK), **req):
    stream = sse(*(chat_chunk(d) for d in deltas), chat_chunk({}, finish), USAGE)
    node = node_with(lambda r: httpx.Response(200, content=stream))
    request = chat(tools=list(tools), params=SamplingParams(max_tokens=64), **req)
    deltas_out, result = asyncio.run(run(node, request))
    pieces = [p for d in deltas_out if d.tool_calls for p in d.tool_calls]
    assert not any("<|" in d.text for d in deltas_out)  # the carrier markup never leaks
    streamed: dict[int, dict] = {}
    for p in pieces:  # streamed pieces reassemble to the whole calls
        got = streamed.setdefault(p.index, {"name": "", "arguments": ""})
        got["name"] += p.name or ""
        got["arguments"] += p.arguments
    choice = result.choices[0]
    whole = [{"name": c.name, "arguments": c.arguments} for c in choice.tool_calls or []]
    assert [streamed[i] for i in sorted(streamed)] == whole
    return choice


def test_a_valid_call_comes_back_whole_markers_in_its_strings_and_all():
    args = '{"city": "a <|tool_call_end|><|tool_calls_section_end|> b"}'
    choice = answer(
        {"tool_calls": [call(0, "get_weather", args[:15], "c1")]}, {"tool_calls": [call(0, None, args[15:])]}
    )
    assert choice.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in choice.tool_calls] == [
        ("get_weather", json.loads(args))
    ]
    assert choice.text == ""


@pytest.mark.parametrize(
    "arguments",
    ['{"city": "Seo', '["Seoul"]', "Seoul", '{"city": 3}', '{"city": "x", "other": 1}', "{}"],
)
def test_a_call_whose_arguments_do_not_hold_is_dropped(arguments):
    # not JSON, not an object, or (get_weather is strict) breaking its schema
    choice = answer(
        {"tool_calls": [call(0, "get_weather", arguments, "c1")]},
        {"tool_calls": [call(1, "now", "{}", "c2")]},
    )
    assert [c.name for c in choice.tool_calls] == ["now"] and choice.finish_reason == "tool_calls"


def test_a_call_of_no_declared_function_or_one_the_choice_rules_out_is_dropped():
    deltas = (
        {"tool_calls": [call(0, "rm_rf", '{"path": "/"}', "c1")]},
        {"tool_calls": [call(1, "now", "{}", "c2")]},
        {"tool_calls": [call(2, "get_weather", '{"city": "Oslo"}', "c3")]},
    )
    assert [c.name for c in answer(*deltas).tool_calls] == ["now", "get_weather"]
    assert [c.name for c in answer(*deltas, tool_choice="get_weather").tool_calls] == ["get_weather"]
    assert [c.name for c in answer(*deltas, parallel_tool_calls=False).tool_calls] == ["now"]


def test_a_call_cut_off_by_max_tokens_is_dropped_and_the_choice_ends_length():
    choice = answer({"tool_calls": [call(0, "get_weather", '{"city": "Se', "c1")]}, finish="length")
    assert choice.finish_reason == "length" and choice.tool_calls is None


def test_the_reader_holds_a_call_until_it_ends():
    reader = ChunkReader(1)
    (piece,) = reader.read(json.dumps(chat_chunk({"tool_calls": [call(0, "now", "{", "c1")]})))
    assert piece.text == ""  # held: it may not hold up
    (piece,) = reader.read(json.dumps(chat_chunk({"tool_calls": [call(0, None, "}")]})))
    assert piece.text == ""
    (piece,) = reader.read(json.dumps(chat_chunk({}, "tool_calls")))
    assert piece.text.startswith("<|tool_calls_section_begin|>") and piece.finish_reason == "stop"
    reader = ChunkReader(1)
    reader.read(json.dumps(chat_chunk({"tool_calls": [call(0, "now", "{", "c1")]})))
    (piece,) = reader.read(json.dumps(chat_chunk({}, "length")))
    assert piece.text == "" and reader.rejected == 1
