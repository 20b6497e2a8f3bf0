"""POST /v1/responses and the Responses shape through /ai/run, parsed by the official openai
client over the app in-process (the tiny model on the CPU)."""

import json

import pytest
from starlette.testclient import TestClient

from runtime.app import Runtime, create_app
from runtime.control.config import parse_config
from tests.conftest import TINY_MODEL

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(tmp_path_factory, icn_edge):
    tmp = tmp_path_factory.mktemp("responses")
    (tmp / "worker.py").write_text("from workers import WorkerEntrypoint\n")
    config = parse_config('name = "r"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n', base_dir=tmp)
    rt = Runtime(config, icn_edge)
    token = rt.state.create_token("local")
    http = TestClient(create_app(rt))
    client = openai.OpenAI(
        base_url="http://testserver/client/v4/accounts/local/ai/v1", api_key=token, http_client=http
    )
    yield client, http, token
    rt.state.close()
    rt.bindings.close()


def test_text_input_returns_a_response_the_client_parses(served):
    client, _, _ = served
    r = client.responses.create(model=TINY_MODEL, input="def fib(n):", max_output_tokens=5, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == TINY_MODEL
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [message] = r.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and r.output_text == message.content[0].text
    assert r.usage.output_tokens == 5 and r.usage.total_tokens == r.usage.input_tokens + 5
    assert 0 <= r.usage.input_tokens_details.cached_tokens <= r.usage.input_tokens
    extra = r.model_extra
    assert extra["timing"]["pop"] == "ICN" and extra["served_by"]["model"] == TINY_MODEL


def test_items_and_instructions_reach_the_prompt(served):
    client, _, _ = served
    plain = client.responses.create(model=TINY_MODEL, input="hello", max_output_tokens=3, temperature=0)
    items = client.responses.create(
        model=TINY_MODEL,
        instructions="You are terse.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        max_output_tokens=3,
        temperature=0,
        metadata={"k": "v"},
    )
    assert items.instructions == "You are terse." and items.metadata == {"k": "v"}
    assert items.usage.input_tokens > plain.usage.input_tokens  # the system message was rendered


def test_stream_events_reassemble_to_the_answer(served):
    client, _, _ = served
    whole = client.responses.create(model=TINY_MODEL, input="import os", max_output_tokens=6, temperature=0)
    stream = client.responses.create(
        model=TINY_MODEL, input="import os", max_output_tokens=6, temperature=0, stream=True
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == 6
    assert final.id == events[0].response.id and final.output[0].id == events[2].item.id


def test_the_stream_helper_accumulates_the_output(served):
    client, _, _ = served
    with client.responses.stream(model=TINY_MODEL, input="x = ", max_output_tokens=4, temperature=0) as s:
        events = list(s)
    # cut at max_output_tokens, the stream ends with response.incomplete (as OpenAI's does), which
    # the helper passes through with the output it accumulated from the deltas
    last = events[-1]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert last.type == "response.incomplete" and last.response.usage.output_tokens == 4
    assert last.response.output[0].content[0].text == deltas == last.response.output_text


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"previous_response_id": "resp_x"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high", "summary": "auto"}}, "reasoning.summary"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"extra_body": {"nope": 1}}, "nope"),
    ],
)
def test_refused_parameters_get_a_400_naming_them(served, kw, param):
    client, _, _ = served
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=TINY_MODEL, input="x", max_output_tokens=2, **kw)
    assert info.value.body["param"] == param and info.value.status_code == 400


def test_unknown_model_and_bad_token(served):
    client, http, _ = served
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="@edge/none", input="x")
    r = http.post("/client/v4/accounts/local/ai/v1/responses", json={"model": TINY_MODEL, "input": "x"})
    assert r.status_code == 401


def test_cloudflare_shape_through_ai_run(served):
    _, http, token = served
    auth = {"authorization": f"Bearer {token}"}
    url = f"/client/v4/accounts/local/ai/run/{TINY_MODEL}"
    body = {"instructions": "be brief", "input": "hi", "max_output_tokens": 3, "temperature": 0}
    r = http.post(url, json=body, headers=auth)
    result = r.json()["result"]
    assert r.status_code == 200 and result["object"] == "response"
    assert result["output"][0]["content"][0]["text"] == result["output_text"]
    assert "server-timing" in r.headers
    streamed = http.post(url, json={**body, "stream": True}, headers=auth)
    datas = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert datas[0]["type"] == "response.created" and datas[-1]["type"] in (
        "response.completed",
        "response.incomplete",
    )
    bad = http.post(url, json={"input": "hi", "store": True}, headers=auth)
    assert bad.status_code == 400 and "store" in bad.json()["errors"][0]["message"]
