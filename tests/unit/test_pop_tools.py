"""Tools at the PoP (rendered in the model's own format, the reply constrained to it) and the
new request fields over the remote node's msgspec wire (tools, guide, logprobs, n; a SeqEvent's
index and logprobs)."""

from __future__ import annotations

import asyncio

import httpx
import msgspec
import pytest

from edge_sim import remote as wire
from edge_sim.errors import EdgeError
from edge_sim.remote import RemotePopNode, create_pop_app
from edge_sim.request import GenerateRequest
from engine import SamplingParams, SeqEvent
from engine.outputs import Logprobs, TokenLogprob
from engine.structured.guide import Guide
from engine.structured.tool_calls import KIMI_K2
from engine.structured.tool_types import ToolFunction
from tests.conftest import TINY_MODEL
from tests.unit.test_tool_calls import ROUND_TRIP, WEATHER

MODEL = TINY_MODEL  # what the fra_node fixture serves
TOKEN = "node-token"


def request(**fields) -> GenerateRequest:
    params = fields.pop("params", SamplingParams(max_tokens=3, temperature=0))
    return GenerateRequest(model=MODEL, messages=fields.pop("messages", ROUND_TRIP), params=params, **fields)


def test_the_pop_renders_a_tool_round_trip_in_the_models_format(fra_node):
    engine = fra_node.engines[MODEL]
    assert fra_node.formats(MODEL).tool_format == KIMI_K2  # the tiny model is a deepseek_v3
    prompt = engine.tokenizer.decode(fra_node._prompt_ids(engine, request(tools=[WEATHER])))
    assert '"name": "get_weather"' in prompt  # declared
    assert "functions.get_weather:0<|tool_call_argument_begin|>" in prompt  # the call
    assert "## Return of functions.get_weather:0\nsunny" in prompt  # its result
    bare = engine.tokenizer.decode(fra_node._prompt_ids(engine, request(tools=[WEATHER], tool_choice="none")))
    assert '"name": "get_weather"' not in bare and "functions.get_weather:0" in bare


def test_the_pop_guides_the_reply_by_the_tools_and_prefers_them(fra_node):
    engine = fra_node.engines[MODEL]
    assert fra_node._params(engine, request()).guide is None
    json_mode = SamplingParams(max_tokens=3, guide=Guide(kind="json"))
    params = fra_node._params(engine, request(tools=[WEATHER], tool_choice="required", params=json_mode))
    assert params.guide.kind == "lark" and "functions.get_weather:" in params.guide.grammar
    assert (
        fra_node._params(engine, request(tools=[WEATHER], tool_choice="none", params=json_mode)).guide.kind
        == "json"
    )


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"tools": [ToolFunction(name="bad name")]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "rm_rf"}, "tool_choice"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, r"messages\[0\]"),
    ],
)
def test_bad_tools_are_refused_before_anything_is_queued(fra_node, fields, match):
    async def go():
        async for _ in fra_node.stream(request(**fields)):
            pass

    with pytest.raises(EdgeError, match=match) as info:
        asyncio.run(go())
    assert info.value.kind == "invalid_input" and fra_node.in_flight == 0


def test_tools_need_messages(fra_node):
    req = GenerateRequest(model=MODEL, prompt="hi", params=SamplingParams(max_tokens=2), tools=[WEATHER])
    with pytest.raises(EdgeError, match="tools"):
        asyncio.run(fra_node.generate(req))


def test_the_new_fields_cross_the_wire_unchanged():
    req = request(
        tools=[WEATHER],
        tool_choice="get_weather",
        parallel_tool_calls=False,
        params=SamplingParams(max_tokens=4, n=3, logprobs=2, guide=Guide(kind="regex", pattern="[a-z]+")),
    )
    assert wire._decode_request(wire._encode(req)) == req
    top = TokenLogprob("a", -0.25, [97])
    event = SeqEvent("r", 7, "a", index=2, logprobs=Logprobs(top, [top]))
    frame = wire._frame(wire.Frame("event", event=event))
    assert wire._decode_frame(frame[wire._HEADER.size :]).event == event


def test_a_remote_node_answers_with_tools_as_the_local_one_does(fra_node):
    async def scenario():
        remote = RemotePopNode(fra_node.pop, "http://fra.node", token=TOKEN)
        remote._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_pop_app(fra_node, TOKEN)),
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        try:
            assert await remote.refresh()
            assert remote.formats(MODEL) == fra_node.formats(MODEL)  # the tool format included
            req = request(tools=[WEATHER], params=SamplingParams(max_tokens=3, temperature=0, logprobs=1))
            over_wire, local = await remote.generate(req), await fra_node.generate(req)
            return over_wire, local
        finally:
            await remote._client.aclose()

    over_wire, local = asyncio.run(scenario())
    strip = (
        "queue_ms",
        "prefill_ms",
        "decode_ms",
        "timing",
        "choices",
        "cached_tokens",
    )  # a cache hit the 2nd time
    assert msgspec.structs.replace(over_wire, **{k: None for k in strip}) == msgspec.structs.replace(
        local, **{k: None for k in strip}
    )
    assert [(c.text, c.finish_reason) for c in over_wire.choices] == [
        (c.text, c.finish_reason) for c in local.choices
    ]
    assert len(over_wire.choices) == 1 and over_wire.completion_tokens == 3
