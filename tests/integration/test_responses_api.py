"""The Responses API against a real `edge dev` with the official openai client: text input, items
with instructions, streaming events, refused parameters, and Cloudflare's {instructions, input}
shape through a worker's env.AI.run."""

import textwrap

import httpx
import pytest

from runtime.bench.devserver import write_project
from tests.integration.dev_server import DevServer

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow
MODEL = "@edge/moonshotai/kimi-k2-mini"
WORKER = """
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        inputs = {"instructions": "Be brief.", "input": "hi", "max_output_tokens": 4}
        out = await self.env.AI.run("@MODEL@", inputs)
        return Response.json(out)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("responses")
    write_project(d, "responses", worker=textwrap.dedent(WORKER).replace("@MODEL@", MODEL))
    with DevServer(d / "wrangler-like.toml", cwd=d) as srv:
        token = (d / ".edge" / "api-token").read_text().strip()
        srv.client = openai.OpenAI(base_url=f"{srv.url}/client/v4/accounts/local/ai/v1", api_key=token)
        yield srv


def test_text_and_items_inputs(server):
    client = server.client
    r = client.responses.create(model=MODEL, input="def fib(n):", max_output_tokens=6, temperature=0)
    assert r.object == "response" and r.output[0].type == "message" and r.output_text
    assert r.usage.output_tokens <= 6 and r.status in ("completed", "incomplete")
    items = client.responses.create(
        model=MODEL,
        instructions="You are terse.",
        input=[
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
            {"role": "developer", "content": "Again."},
        ],
        max_output_tokens=4,
        temperature=0,
    )
    assert items.instructions == "You are terse." and items.usage.input_tokens > r.usage.input_tokens


def test_streamed_events_equal_the_whole_answer(server):
    client = server.client
    whole = client.responses.create(model=MODEL, input="import os", max_output_tokens=8, temperature=0)
    events = list(
        client.responses.create(
            model=MODEL, input="import os", max_output_tokens=8, temperature=0, stream=True
        )
    )
    assert events[0].type == "response.created" and events[-1].type in (
        "response.completed",
        "response.incomplete",
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text


def test_top_logprobs_come_with_the_text_whole_and_streamed(server):
    kw = dict(model=MODEL, input="import os", max_output_tokens=6, temperature=0, top_logprobs=2)
    whole = server.client.responses.create(**kw, include=["message.output_text.logprobs"])
    steps = whole.output[0].content[0].logprobs
    assert len(steps) == whole.usage.output_tokens and all(len(s.top_logprobs) == 2 for s in steps)
    assert "".join(s.token for s in steps) == whole.output_text
    assert all(s.top_logprobs[0].token == s.token for s in steps)  # greedy: each chose the likeliest
    assert all(s.top_logprobs[0].logprob >= s.top_logprobs[1].logprob for s in steps)
    events = list(server.client.responses.create(**kw, stream=True))
    streamed = [s for e in events if e.type == "response.output_text.delta" for s in e.logprobs]
    assert [s.token for s in streamed] == [s.token for s in steps]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [s.logprob for s in done.logprobs] == [s.logprob for s in steps]
    with pytest.raises(openai.BadRequestError) as info:
        server.client.responses.create(model=MODEL, input="x", top_logprobs=21)
    assert info.value.body["param"] == "top_logprobs"


def test_refused_parameters(server):
    for kw, param in [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"reasoning": {"effort": "low", "summary": "auto"}}, "reasoning.summary"),
    ]:
        with pytest.raises(openai.BadRequestError) as info:
            server.client.responses.create(model=MODEL, input="x", **kw)
        assert info.value.body["param"] == param


def test_cloudflare_shape_through_env_ai_run(server):
    out = httpx.get(server.url + "/", timeout=60).json()
    assert out["object"] == "response" and out["output"][0]["content"][0]["text"] == out["output_text"]
    assert out["usage"]["output_tokens"] <= 4
