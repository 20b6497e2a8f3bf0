"""A thinking model's reasoning, from scripted model output (the shipped miniatures do not think):
the streaming parser for both families with markers split at every place, the edge's choices
(thinking on and off, cut by max_tokens, a tool call after the reasoning parsed and one written
inside it not), and the answers' shapes whole and streamed, which must join to the same text."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from edge_sim.edge import Edge
from edge_sim.network import NetworkModel
from edge_sim.request import Formats, GenerateRequest, GenerateResult
from edge_sim.topology import Topology
from engine import SamplingParams
from engine.structured.choices import Delta
from engine.structured.reasoning_parser import MARKERS, ReasoningParser, thinks
from engine.structured.tool_calls import GLM45, KIMI_K2
from engine.structured.tool_types import ToolFunction
from runtime.ai.shapes import openai_events, shape_result, workers_ai_events
from tests.unit.test_edge_choices import MODEL, FakeNode, end, token

WEATHER = ToolFunction(
    name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}
)
KIMI_CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>'
)
GLM_CALL = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>"
CALLS = {KIMI_K2: KIMI_CALL, GLM45: GLM_CALL}


def random_split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def parse(family: str, pieces: list[str]) -> tuple[str, str]:
    parser = ReasoningParser(family)
    thought = content = ""
    for piece in pieces:
        r, c = parser.feed(piece)
        thought, content = thought + r, content + c
    r, c = parser.flush()
    return thought + r, content + c


@pytest.mark.parametrize("family", sorted(MARKERS))
def test_reasoning_and_content_separate_however_the_deltas_fall(family):
    rng = random.Random()
    opened, closed = MARKERS[family]
    reply = f"\n{opened}The user wants 2+2. That is 4; a < b holds.{closed}\n\nIt is 4."
    for _ in range(200):
        pieces = random_split(reply, rng)
        assert parse(family, pieces) == ("The user wants 2+2. That is 4; a < b holds.", "It is 4.")
    # every single-character split too, and no marker text leaks into either side
    assert parse(family, list(reply)) == ("The user wants 2+2. That is 4; a < b holds.", "It is 4.")


@pytest.mark.parametrize("family", sorted(MARKERS))
def test_a_reply_without_the_block_is_all_content_and_a_block_cut_off_is_all_reasoning(family):
    opened, closed = MARKERS[family]
    assert parse(family, ["  Just ", "an answer."]) == ("", "  Just an answer.")
    assert parse(family, [opened[:3]]) == ("", opened[:3])  # it ended inside what looked like a marker
    assert parse(family, [opened, "still thinking", closed[:2]]) == ("still thinking" + closed[:2], "")
    assert parse(family, ["<thought>", "x"]) == ("", "<thought>x")


def test_a_model_thinks_when_its_vocabulary_writes_its_familys_markers():
    assert thinks(GLM45, {"<think>", "</think>", "a"}) == GLM45
    assert thinks(KIMI_K2, {"<think>"}) == ""
    assert thinks("", {"<think>", "</think>"}) == ""


class ThinkingNode(FakeNode):
    def __init__(self, events, tool_format: str, reasoning_format: str):
        super().__init__(events, tool_format)
        self.reasoning_format = reasoning_format

    def formats(self, model: str) -> Formats:
        return Formats("bf16", "bf16", {}, self.tool_format, self.reasoning_format)


def run(family: str, text: str, *, thinking=None, reason="stop", chunk=5, **req):
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    events = [token(p) for p in pieces] + [end(reason, completion=len(pieces))]
    node = ThinkingNode(events, family, family)
    edge = Edge(Topology.default(), NetworkModel(), {"ICN": node})
    request = GenerateRequest(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        params=SamplingParams(),
        thinking=thinking,
        **req,
    )
    ingress, rtt = edge.ingress(edge.locate("Seoul"))

    async def drain():
        return [item async for item in edge.stream(request, ingress, rtt)]

    *deltas, result = asyncio.run(drain())
    assert isinstance(result, GenerateResult) and all(isinstance(d, Delta) for d in deltas)
    return deltas, result


@pytest.mark.parametrize("family", [GLM45, KIMI_K2])
def test_the_edge_streams_reasoning_apart_and_the_pieces_join_to_the_whole(family):
    deltas, result = run(family, "<think>Weather needs a city.</think>\n\nOslo is cold.")
    choice = result.choices[0]
    assert (choice.reasoning, choice.text) == ("Weather needs a city.", "Oslo is cold.")
    assert "".join(d.reasoning for d in deltas) == choice.reasoning
    assert "".join(d.text for d in deltas) == choice.text
    # thinking turned off: the template wrote the empty block itself; the reply is not parsed
    _, off = run(family, "<think>x</think>y", thinking=False)
    assert (off.choices[0].reasoning, off.text) == ("", "<think>x</think>y")
    # cut by max_tokens inside the block: all of it is reasoning, no content
    _, cut = run(family, "<think>Let me think about this", reason="length")
    assert (cut.choices[0].reasoning, cut.text, cut.finish_reason) == (
        "Let me think about this",
        "",
        "length",
    )


@pytest.mark.parametrize("family", [GLM45, KIMI_K2])
def test_a_tool_call_after_the_reasoning_parses_and_one_inside_it_does_not(family):
    call = CALLS[family]
    _, result = run(family, f"<think>I should call get_weather.</think>\n{call}", tools=[WEATHER])
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.reasoning == "I should call get_weather."
    assert [(c.name, json.loads(c.arguments)) for c in choice.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    # the same markup written while thinking is thought, not a call
    _, inside = run(family, f"<think>Maybe {call} later.</think>Not now.", tools=[WEATHER])
    choice = inside.choices[0]
    assert choice.tool_calls is None and choice.finish_reason == "stop"
    assert choice.reasoning == f"Maybe {call} later." and choice.text == "Not now."


def collect(stream) -> list[dict]:
    async def drain():
        return [chunk async for chunk in stream]

    events = [c.decode()[len("data: ") :].strip() for c in asyncio.run(drain())]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_chat_completions_carry_reasoning_content_and_reasoning_whole_and_streamed():
    deltas, result = run(GLM45, "<think>Two and two.</think>\n\nFour.")
    whole = shape_result("chat-completions", MODEL, result)["choices"][0]["message"]
    assert whole["content"] == "Four."
    assert whole["reasoning_content"] == whole["reasoning"] == "Two and two."

    async def items():
        for d in [*deltas, result]:
            yield d

    chunks = collect(openai_events(items(), MODEL, chat=True))
    streamed = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in streamed) == "Four."
    assert "".join(d.get("reasoning_content", "") for d in streamed) == "Two and two."
    assert "".join(d.get("reasoning", "") for d in streamed) == "Two and two."
    # Workers AI's text-generation shape keeps it beside the response, whole and streamed
    assert shape_result("text-generation", MODEL, result)["reasoning_content"] == "Two and two."
    events = collect(workers_ai_events(items(), MODEL, chat=False))
    assert "".join(e.get("reasoning_content", "") for e in events) == "Two and two."
    assert "".join(e["response"] for e in events) == "Four."
    # an answer with no reasoning carries neither field
    _, plain = run(GLM45, "Four.")
    message = shape_result("chat-completions", MODEL, plain)["choices"][0]["message"]
    assert "reasoning" not in message and "reasoning_content" not in message


def test_the_responses_api_gives_a_reasoning_item_whole_and_streamed_in_openais_types():
    types = pytest.importorskip("openai.types.responses")
    pydantic = pytest.importorskip("pydantic")
    from runtime.ai.responses_inputs import decode_request
    from runtime.ai.responses_shapes import response_events, response_object

    req = decode_request({"input": "2+2?", "reasoning": {"effort": "high"}})
    deltas, result = run(KIMI_K2, "<think>Two and two make four.</think>\n\nFour.", chunk=3)
    whole = types.Response.model_validate(response_object(MODEL, req, result))
    thought, message = whole.output
    assert thought.type == "reasoning" and thought.content[0].text == "Two and two make four."
    assert message.type == "message" and whole.output_text == "Four."
    assert whole.reasoning.effort == "high"
    # the tokens that came while it thought: all but the answer's (each scripted token is 3 characters)
    details = whole.usage.output_tokens_details
    assert 0 < details.reasoning_tokens < whole.usage.output_tokens

    async def items():
        for d in [*deltas, result]:
            yield d

    async def drain():
        return [chunk async for chunk in response_events(items(), MODEL, req)]

    adapter = pydantic.TypeAdapter(types.ResponseStreamEvent)
    events = [
        adapter.validate_python(json.loads(c.decode().split("data: ", 1)[1])) for c in asyncio.run(drain())
    ]
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert streamed == done.text == "Two and two make four."
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"] and final.output_text == "Four."


def test_an_upstreams_reasoning_deltas_come_back_as_reasoning_and_its_switch_goes_up():
    import httpx

    from tests.unit.test_upstream_node import USAGE, chat, chat_chunk, node_with, sse
    from tests.unit.test_upstream_node import run as run_upstream

    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        stream = sse(
            chat_chunk({"reasoning_content": "Think "}),
            chat_chunk({"reasoning": "harder."}),  # vLLM's 2026 name
            chat_chunk({"content": "Done."}),
            chat_chunk({}, "stop"),
            USAGE,
        )
        return httpx.Response(200, content=stream)

    node = node_with(handler)
    deltas, result = asyncio.run(run_upstream(node, chat(thinking=True, params=SamplingParams(max_tokens=8))))
    choice = result.choices[0]
    assert (choice.reasoning, choice.text) == ("Think harder.", "Done.")
    assert "".join(d.reasoning for d in deltas) == "Think harder." and "<think>" not in "".join(
        d.text for d in deltas
    )
    assert seen[0]["chat_template_kwargs"] == {"enable_thinking": True, "thinking": True}
