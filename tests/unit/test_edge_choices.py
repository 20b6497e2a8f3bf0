"""The edge's stream and result for a request's n choices, from hand-built engine event streams:
deltas per choice, the choices assembled in index order, one failing choice among others, tool
calls parsed from the model's format (finish_reason "tool_calls"), logprobs riding with their
tokens; and n == 1 without tools streams exactly the engine's text, as before."""

from __future__ import annotations

import asyncio
import json

import pytest

from edge_sim.edge import Edge
from edge_sim.errors import EdgeError
from edge_sim.load import pop_load
from edge_sim.network import NetworkModel
from edge_sim.node import NodeBase
from edge_sim.request import Formats, GenerateRequest, GenerateResult
from edge_sim.topology import Topology
from engine import SamplingParams, SeqEvent
from engine.outputs import Logprobs, RequestMetrics, TokenLogprob
from engine.structured.choices import Delta
from engine.structured.tool_calls import KIMI_K2
from engine.structured.tool_types import ToolFunction

MODEL = "@edge/test/fake"
WEATHER = ToolFunction(
    name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}
)


class FakeNode(NodeBase):
    """A PoP node that answers every request with the events it was given."""

    def __init__(self, events: list[SeqEvent], tool_format: str = ""):
        self.pop = Topology.default().pop("ICN")
        self.events, self.tool_format = events, tool_format
        self.refused: dict[str, str] = {}
        self.up, self.in_flight = True, 0

    def models(self) -> list[str]:
        return [MODEL]

    def has_room(self) -> bool:
        return True

    def route_load(self, model: str):
        return pop_load(0.0, 0, 0.05, 0, 0, 8, 100, 0, 0.0)

    def formats(self, model: str) -> Formats:
        return Formats("bf16", "bf16", {}, self.tool_format)

    async def stream(self, req: GenerateRequest):
        for event in self.events:
            yield event

    def close(self) -> None:
        pass


def metrics(completion: int) -> RequestMetrics:
    return RequestMetrics(
        prompt_tokens=5,
        completion_tokens=completion,
        queue_ms=1.0,
        prefill_ms=2.0,
        decode_ms=3.0,
        ttft_ms=3.0,
        tpot_ms=1.0,
        finish_reason="stop",
        preemptions=0,
    )


def token(text: str, index: int = 0, logprobs: Logprobs | None = None) -> SeqEvent:
    return SeqEvent("r", 7, text, index=index, logprobs=logprobs)


def end(reason: str, index: int = 0, completion: int = 1, error: str | None = None) -> SeqEvent:
    return SeqEvent("r", None, "", reason, error=error, metrics=metrics(completion), index=index)


def run(
    events: list[SeqEvent], n: int = 1, tool_format: str = "", **req
) -> tuple[list[Delta], GenerateResult]:
    edge = Edge(Topology.default(), NetworkModel(), {"ICN": FakeNode(events, tool_format)})
    params = SamplingParams(n=n, **req.pop("params", {}))
    request = GenerateRequest(model=MODEL, messages=[{"role": "user", "content": "hi"}], params=params, **req)
    ingress, rtt = edge.ingress(edge.locate("Seoul"))

    async def drain():
        return [item async for item in edge.stream(request, ingress, rtt)]

    *deltas, result = asyncio.run(drain())
    assert all(isinstance(d, Delta) for d in deltas) and isinstance(result, GenerateResult)
    return deltas, result


def test_one_choice_without_tools_streams_the_engine_text_as_it_came():
    deltas, result = run(
        [token("Hel"), token(""), token("lo"), SeqEvent("r", 7, "!", "stop", metrics=metrics(4))]
    )
    assert [d.text for d in deltas] == ["Hel", "lo", "!"]  # an event without text makes no delta
    assert all(d.index == 0 and d.logprobs is None and d.tool_calls is None for d in deltas)
    assert (result.text, result.finish_reason, result.completion_tokens) == ("Hello!", "stop", 4)
    assert [(c.index, c.text, c.finish_reason) for c in result.choices] == [(0, "Hello!", "stop")]
    assert result.timing is not None and result.prompt_tokens == 5


def test_n_choices_are_assembled_in_index_order():
    events = [
        token("b", 1),
        token("a", 0),
        token("bb", 1),
        end("length", 1, 2),
        token("aa", 0),
        end("stop", 0, 2),
    ]
    deltas, result = run(events, n=2)
    assert [(d.index, d.text) for d in deltas] == [(1, "b"), (0, "a"), (1, "bb"), (0, "aa")]
    assert [(c.index, c.text, c.finish_reason) for c in result.choices] == [
        (0, "aaa", "stop"),
        (1, "bbb", "length"),
    ]
    assert (result.text, result.finish_reason) == ("aaa", "stop")  # choice 0's
    assert result.completion_tokens == 4  # the sum, as OpenAI's usage counts it


def test_a_failed_choice_fails_alone():
    events = [
        token("x", 0),
        end("error", 0, 1, "JSON Mode couldn't be met: no way on"),
        token("y", 1),
        end("stop", 1),
    ]
    _, result = run(events, n=2)
    assert [c.finish_reason for c in result.choices] == ["error", "stop"]
    assert result.choices[1].text == "y"


def test_one_choice_that_fails_fails_the_request_with_the_engines_message():
    with pytest.raises(EdgeError, match="generation failed: JSON Mode couldn't be met: dead end") as info:
        run([token("{"), end("error", error="JSON Mode couldn't be met: dead end")])
    assert info.value.kind == "invalid_input"


def test_an_answer_that_stops_before_every_choice_ended_is_an_error():
    with pytest.raises(EdgeError, match="before every choice"):
        run([token("a", 0), end("stop", 0)], n=2)


def test_an_event_for_a_choice_never_asked_for_is_refused():
    with pytest.raises(EdgeError, match="choice 3"):
        run([token("a", 3), end("stop", 0)])


CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>'
)


def split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 4, 9])
def test_tool_calls_are_parsed_per_choice_and_finish_as_tool_calls(size):
    text = "Checking. " + CALL
    events = [token(piece, 0) for piece in split(text, size)] + [
        token("Just text.", 1),
        end("stop", 0),
        end("stop", 1),
    ]
    deltas, result = run(events, n=2, tool_format=KIMI_K2, tools=[WEATHER])
    streamed = "".join(d.text for d in deltas if d.index == 0)
    assert streamed == "Checking. " and "<|" not in "".join(d.text for d in deltas)
    pieces = [p for d in deltas if d.tool_calls for p in d.tool_calls]
    first = result.choices[0]
    assert first.finish_reason == "tool_calls" and first.text == "Checking. "
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert pieces[0].id == first.tool_calls[0].id and pieces[0].name == "get_weather"
    assert "".join(p.arguments for p in pieces) == first.tool_calls[0].arguments
    second = result.choices[1]
    assert (second.finish_reason, second.text, second.tool_calls) == ("stop", "Just text.", None)


def test_a_call_cut_off_by_max_tokens_keeps_length():
    _, result = run([token(CALL[:110]), end("length")], tool_format=KIMI_K2, tools=[WEATHER])
    # the unfinished call is dropped (as OpenAI drops it), never returned in part
    assert result.finish_reason == "length" and result.choices[0].tool_calls is None


def test_tool_choice_none_leaves_the_text_unparsed():
    _, result = run([token(CALL), end("stop")], tool_format=KIMI_K2, tools=[WEATHER], tool_choice="none")
    assert result.text == CALL and result.finish_reason == "stop" and result.choices[0].tool_calls is None


def lp(text: str, value: float) -> Logprobs:
    return Logprobs(
        TokenLogprob(text, value, list(text.encode())), [TokenLogprob(text, value, list(text.encode()))]
    )


def test_logprobs_ride_with_their_tokens_when_asked_for():
    events = [
        token("a", logprobs=lp("a", -0.5)),
        token("", logprobs=lp("\xe9", -1.0)),
        end("stop", completion=2),
    ]
    deltas, result = run(events, params={"logprobs": 1})
    assert [d.logprobs[0].chosen.logprob for d in deltas] == [-0.5, -1.0]  # a token without text yet too
    assert [x.chosen.token for x in result.choices[0].logprobs] == ["a", "\xe9"]
    _, unasked = run(events)
    assert unasked.choices[0].logprobs is None
