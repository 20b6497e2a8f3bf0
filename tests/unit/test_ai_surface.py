"""The AI APIs' input surface, over HTTP on the tiny model: every refused parameter gets its 400
naming it (OpenAI's error.param; Workers AI's 5004 with the name first), unknown fields are
refused in both APIs and in env.AI.run's path (AIService.prepare), and what is accepted reaches
the typed request as the PoP needs it."""

import textwrap

import pytest
from starlette.testclient import TestClient

from engine.structured.guide import Guide
from runtime.ai.catalog import accepted_inputs
from runtime.ai.params import json_mode_failure
from runtime.ai.refusals import REFUSED, InputError
from runtime.app import Runtime, create_app
from runtime.control.config import parse_config
from tests.conftest import TINY_MODEL
from workers import AIError

ADMIN = {"authorization": "Bearer adm-token"}
A = "/client/v4/accounts/acme"
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory, icn_edge):
    d = tmp_path_factory.mktemp("surface")
    (d / "worker.py").write_text("from workers import WorkerEntrypoint\n")
    config = parse_config(
        textwrap.dedent("""
        name = "surface"
        main = "worker.py"
        compatibility_date = "2026-11-01"
    """),
        base_dir=d,
    )
    rt = Runtime(config, icn_edge, admin_token="adm-token")
    yield rt
    rt.state.close()
    rt.bindings.close()


@pytest.fixture(scope="module")
def client(runtime):
    client = TestClient(create_app(runtime))  # no lifespan: the dev worker's isolate never starts
    r = client.post("/cdn-cgi/edge/accounts", json={"name": "acme"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    client.headers["authorization"] = f"Bearer {r.json()['token']['token']}"
    return client


def openai_refusal(r):
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 5004
    return error["param"], error["message"]


def workers_refusal(r):
    assert r.status_code == 400, r.text
    error = r.json()["errors"][0]
    assert error["code"] == 5004
    return error["message"]


REFUSED_CHAT = [
    ("audio", {"voice": "alloy", "format": "wav"}, "text only"),
    ("modalities", ["text", "audio"], "text only"),
    ("prediction", {"type": "content", "content": "x"}, "predicted outputs"),
    ("web_search_options", {}, "no web search"),
    ("functions", [{"name": "f"}], "send 'tools'"),
    ("function_call", "auto", "send 'tool_choice'"),
    ("lora", "adapter-1", "LoRA"),
    ("store", True, "not stored"),
    ("service_tier", "flex", "one tier"),
    ("logit_bias", {"x50": -100}, "token ids"),
    ("logit_bias", {str(i): 1 for i in range(301)}, "at most 300"),
    ("n", 9, "[1, 8]"),
    ("top_logprobs", 21, "[0, 20]"),
    ("top_logprobs", 3, "needs logprobs"),
    ("reasoning_effort", "extreme", "invalid enum value"),
    ("chat_template_kwargs.enable_thinking", {"enable_thinking": "yes"}, "expected"),
    ("tool_choice", "required", "needs tools"),
    ("metadata", {f"k{i}": "v" for i in range(17)}, "at most 16 keys"),
    ("stop", ["a", "b", "c", "d", "e"], "at most 4"),
    ("surprise", 1, "unknown parameter"),
    ("max_tokenz", 5, "did you mean 'max_tokens'"),
]


@pytest.mark.parametrize(
    ("param", "value", "why"), REFUSED_CHAT, ids=[f"{p}={v!r}"[:40] for p, v, _ in REFUSED_CHAT]
)
def test_openai_chat_refuses_each_unserved_parameter_by_name(client, param, value, why):
    field = param.split(".")[0]
    body = {"model": TINY_MODEL, "messages": USER, field: value}
    got, message = openai_refusal(client.post(f"{A}/ai/v1/chat/completions", json=body))
    assert got == param and why in message and message.startswith(f"{param}: ")


@pytest.mark.parametrize(
    ("param", "value", "why"), REFUSED_CHAT, ids=[f"{p}={v!r}"[:40] for p, v, _ in REFUSED_CHAT]
)
def test_workers_ai_refuses_the_same_by_name_with_5004(client, param, value, why):
    field = param.split(".")[0]
    message = workers_refusal(client.post(f"{A}/ai/run/{TINY_MODEL}", json={"messages": USER, field: value}))
    assert message.startswith(f"{param}: ") and why in message


@pytest.mark.parametrize(
    ("body", "param", "why"),
    [
        ({"echo": True}, "echo", "never repeats"),
        ({"suffix": "end"}, "suffix", "insertion"),
        ({"best_of": 3}, "best_of", "use n"),
        ({"logprobs": 6}, "logprobs", "[0, 5]"),
        ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
        ({"messages": USER}, "messages", "unknown parameter"),
    ],
)
def test_openai_completions_refuse_what_they_do_not_serve(client, body, param, why):
    r = client.post(f"{A}/ai/v1/completions", json={"model": TINY_MODEL, "prompt": "def", **body})
    got, message = openai_refusal(r)
    assert got == param and why in message


@pytest.mark.parametrize(
    ("messages", "param", "why"),
    [
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages.0.content.0",
            "no images",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages.0.content.0", "needs its 'text'"),
        ([{"role": "user", "content": "a", "extra": 1}], "messages.0", "unknown field `extra`"),
        ([{"role": "tool", "content": "sunny"}], "messages.0.tool_call_id", "tool_call_id"),
        ([{"role": "user", "content": None}], "messages.0.content", "is required"),
        ([{"role": "robot", "content": "a"}], "messages.0.role", "invalid enum value 'robot'"),
        ([], "messages", "must not be empty"),
    ],
)
def test_bad_messages_are_refused_where_they_are_wrong(client, messages, param, why):
    r = client.post(f"{A}/ai/v1/chat/completions", json={"model": TINY_MODEL, "messages": messages})
    got, message = openai_refusal(r)
    assert got == param and why in message


def test_response_format_with_tools_and_json_mode_streaming_are_refused(client):
    both = {
        "model": TINY_MODEL,
        "messages": USER,
        "tools": [TOOL],
        "response_format": {"type": "json_object"},
    }
    param, message = openai_refusal(client.post(f"{A}/ai/v1/chat/completions", json=both))
    assert param == "response_format" and "tools" in message
    streamed = {"messages": USER, "response_format": {"type": "json_object"}, "stream": True}
    message = workers_refusal(client.post(f"{A}/ai/run/{TINY_MODEL}", json=streamed))
    assert "JSON Mode is not supported with streaming" in message
    named = {"model": TINY_MODEL, "messages": USER, "tools": [TOOL]}
    named["tool_choice"] = {"type": "function", "function": {"name": "elsewhere"}}
    param, message = openai_refusal(client.post(f"{A}/ai/v1/chat/completions", json=named))
    assert param == "tool_choice" and "'elsewhere'" in message


def test_env_ai_run_refuses_unknown_and_unserved_inputs(runtime):
    with pytest.raises(InputError, match=r"^5004: surprise: unknown parameter"):
        runtime.ai.prepare(TINY_MODEL, {"prompt": "x", "surprise": 1}, "local")
    with pytest.raises(InputError, match=r"^5004: lora: no LoRA adapters"):
        runtime.ai.prepare(TINY_MODEL, {"prompt": "x", "lora": "a"}, "local")
    with pytest.raises(InputError, match=r"^5004: raw: raw takes a prompt"):
        runtime.ai.prepare(TINY_MODEL, {"messages": USER, "raw": True}, "local")
    with pytest.raises(InputError, match=r"^5004: model: names '@cf/other'"):
        runtime.ai.prepare(TINY_MODEL, {"prompt": "x", "model": "@cf/other"}, "local")
    req, _ = runtime.ai.prepare(
        TINY_MODEL, {"prompt": "x", "raw": True, "audio": None, "model": TINY_MODEL}, "local"
    )
    assert req.prompt == "x" and req.messages is None


def test_every_refused_name_says_what_to_do():
    listed = accepted_inputs()  # what each catalog entry shows under "inputs"
    assert {"guided_json", "tools", "response_format", "raw"} <= set(listed["parameters"])
    assert set(listed["refused"]) == set(REFUSED) and not set(listed["parameters"]) & {"lora", "audio"}
    for name, (refused, why) in REFUSED.items():
        assert refused(object()) or name in ("store", "modalities"), name
        assert not refused(None), name  # a null is never refused
        assert len(why) > 20 and ("send" in why or "remove" in why), name


def test_the_tool_round_trip_content_parts_and_developer_reach_the_request(runtime):
    messages = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "and kind"}],
        },
        {"role": "user", "content": "weather in Seoul?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    flat_tool = {"name": "get_weather", "description": "the weather", "parameters": {"type": "object"}}
    inputs = {
        "messages": messages,
        "tools": [flat_tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    req, _ = runtime.ai.prepare(TINY_MODEL, inputs, "local")
    assert req.messages[0] == {"role": "system", "content": "be brief\nand kind"}
    assert (
        req.messages[2]["content"] is None
        and req.messages[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    )
    assert req.messages[3] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert [t.name for t in req.tools] == ["get_weather"] and req.tools[0].description == "the weather"
    assert req.tool_choice == "required" and req.parallel_tool_calls is False


def test_structured_output_logprobs_and_n_reach_the_sampling_params(runtime, client):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}}
    chat = {"messages": USER, "response_format": fmt, "max_completion_tokens": 7, "max_tokens": 3}
    req, _ = runtime.ai.prepare(TINY_MODEL, chat, "local")
    assert req.params.guide == Guide(kind="json_schema", schema=schema) and req.params.max_tokens == 7
    bare = {"messages": USER, "response_format": {"type": "json_schema", "json_schema": schema}}
    assert (
        runtime.ai.prepare(TINY_MODEL, bare, "local")[0].params.guide.schema == schema
    )  # Workers AI's shape
    guided = runtime.ai.prepare(TINY_MODEL, {"prompt": "x", "guided_json": schema}, "local")[0]
    assert guided.params.guide == Guide(kind="json_schema", schema=schema)
    json_mode = runtime.ai.prepare(
        TINY_MODEL, {"prompt": "x", "response_format": {"type": "json_object"}}, "local"
    )
    assert json_mode[0].params.guide == Guide(kind="json")
    assert runtime.ai.prepare(TINY_MODEL, {"prompt": "x"}, "local")[0].params.guide is None


def test_accepted_openai_fields_do_not_fail_the_call(client):
    body = {
        "model": TINY_MODEL,
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        "max_completion_tokens": 2,
        "seed": 7,
        "user": "u-1",
        "metadata": {"team": "edge"},
        "store": False,
        "service_tier": "auto",
        "logit_bias": {},
        "reasoning_effort": "none",
        "chat_template_kwargs": {"enable_thinking": False},
        "temperature": 0,
    }
    r = client.post(f"{A}/ai/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert (
        r.json()["choices"][0]["message"]["role"] == "assistant"
        and r.json()["usage"]["completion_tokens"] <= 2
    )


def test_thinking_switches_are_taken_by_a_model_that_does_not_think_and_must_agree(client):
    for switches in (
        {"reasoning_effort": "high"},
        {"chat_template_kwargs": {"enable_thinking": True}},
        {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": True}},
    ):
        body = {"model": TINY_MODEL, "messages": USER, "max_tokens": 2, **switches}
        r = client.post(f"{A}/ai/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert (
            "reasoning_content" not in message and "reasoning" not in message
        )  # the miniature does not think
    body = {
        "model": TINY_MODEL,
        "messages": USER,
        "reasoning_effort": "high",
        "chat_template_kwargs": {"enable_thinking": False},
    }
    got, message = openai_refusal(client.post(f"{A}/ai/v1/chat/completions", json=body))
    assert (
        got == "reasoning_effort" and "disagrees with chat_template_kwargs.enable_thinking=false" in message
    )


def test_models_retrieve_and_embeddings_answer_in_openai_shape(client):
    model = client.get(f"{A}/ai/v1/models/{TINY_MODEL}")  # a name with slashes: @edge/.../...
    assert model.status_code == 200 and model.json()["id"] == TINY_MODEL and model.json()["object"] == "model"
    missing = client.get(f"{A}/ai/v1/models/@edge/none")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    emb = client.post(f"{A}/ai/v1/embeddings", json={"model": TINY_MODEL, "input": "x"})
    assert emb.status_code == 404 and emb.json()["error"]["code"] == "model_not_found"
    assert "is a text generation model; the embedding models are @cf/baai/" in emb.json()["error"]["message"]
    bge = client.post(
        f"{A}/ai/v1/embeddings", json={"model": "@cf/baai/bge-small-en-v1.5", "input": ["x", "y"]}
    )
    assert bge.status_code == 200 and [len(d["embedding"]) for d in bge.json()["data"]] == [384, 384]
    run = client.post(f"{A}/ai/run/@cf/baai/bge-m3", json={"text": "x"})
    assert run.status_code == 200 and run.json()["result"]["shape"] == [1, 1024]


def test_a_guided_generation_that_fails_says_json_mode_could_not_be_met(runtime):
    guided, _ = runtime.ai.prepare(TINY_MODEL, {"prompt": "x", "guided_json": {"type": "object"}}, "local")
    plain, _ = runtime.ai.prepare(TINY_MODEL, {"prompt": "x"}, "local")
    failed = AIError(5004, "generation failed: the grammar allows no token")
    assert str(json_mode_failure(guided, failed)).startswith(
        "5004: JSON Mode couldn't be met: generation failed"
    )
    assert json_mode_failure(plain, failed) is failed
    assert json_mode_failure(guided, AIError(3040, "busy")).code == 3040
