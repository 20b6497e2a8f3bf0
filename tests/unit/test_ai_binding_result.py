"""env.AI.run's answer reads as Cloudflare's Python Workers read the JS object Pyodide hands them
(their 09-workers-ai example reads `response.response`): attributes, keys and `to_py()` alike,
still JSON-serializable as it was."""

from __future__ import annotations

import asyncio
import json

from runtime.isolate.inside.channel import AIAnswer, AIBinding
from workers import Response


class FakeChannel:
    def __init__(self, answer):
        self.answer = answer

    async def call_ai(self, model, inputs, options, signal=None):
        return AIAnswer(self.answer, [("cf-ai-req-id", "req-1")])


def run(answer):
    return asyncio.run(AIBinding(FakeChannel(answer)).run("@cf/meta/llama-3.1-8b-instruct", {"prompt": "hi"}))


def test_the_answer_reads_by_attribute_by_key_and_as_plain_python():
    answer = {
        "response": "Hello",
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        "tool_calls": [{"name": "f", "arguments": {"x": 1}}],
    }
    out = run(answer)
    assert out.response == "Hello" and out["response"] == "Hello"
    assert out.usage.completion_tokens == 1 and out["usage"]["prompt_tokens"] == 3
    assert out.tool_calls[0].arguments.x == 1
    plain = out.to_py()
    assert plain == answer and type(plain) is dict and type(plain["usage"]) is dict
    assert json.loads(Response.json(out).body) == answer  # what a worker returns, unchanged


def test_a_stream_is_handed_over_as_it_is():
    async def chunks():
        yield b"data: {}\n\n"

    stream = chunks()
    assert run(stream) is stream
