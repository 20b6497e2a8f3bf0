"""Issue 14's trials end to end, with the official `openai` client against a running `edge dev` on
both miniatures: JSON mode and strict-schema outputs parse and validate in 20 of 20 sampled trials
at temperature 1, a tool call round trip completes, streamed tool-call deltas reassemble to the
non-streamed call, logprobs agree with the returned tokens, and n=4 returns four choices with the
prompt computed once (counted at the PoP)."""

from __future__ import annotations

import json
import math
import textwrap

import httpx
import jsonschema_rs  # schemathesis brings it (the test extra)
import openai
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow
MODELS = ["@edge/moonshotai/kimi-k2-mini", "@edge/zai-org/glm-4.5-mini"]
TRIALS = 20

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["city", "unit", "days", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris? Answer in JSON."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("structured")
    (d / "worker.py").write_text(
        "from workers import Response\n\nasync def on_fetch(r, env):\n    return Response('')\n"
    )
    names = ", ".join(f'"{m}"' for m in MODELS)
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "structured"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge]
        pops = ["ICN"]
        models = [{names}]
        models_dir = "{REPO / "models"}"
    """)
    )
    with DevServer(d / "wrangler-like.toml", cwd=d) as srv:
        srv.token = (d / ".edge" / "api-token").read_text().strip()
        srv.admin = (d / ".edge" / "admin-token").read_text().strip()
        srv.client = openai.OpenAI(
            base_url=f"{srv.url}/client/v4/accounts/local/ai/v1", api_key=srv.token, max_retries=0
        )
        yield srv


@pytest.mark.parametrize("model", MODELS)
def test_strict_schema_outputs_validate_in_every_sampled_trial(server, model):
    validator = jsonschema_rs.validator_for(SCHEMA)
    fmt = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": SCHEMA, "strict": True}}
    for trial in range(TRIALS):
        out = server.client.chat.completions.create(
            model=model, messages=ASK, response_format=fmt, temperature=1.0, max_tokens=200, seed=trial
        )
        choice = out.choices[0]
        assert choice.finish_reason == "stop", (trial, choice)
        validator.validate(json.loads(choice.message.content))


@pytest.mark.parametrize("model", MODELS)
def test_json_mode_outputs_are_json_objects_in_every_sampled_trial(server, model):
    by_budget = 0
    for trial in range(TRIALS):
        out = server.client.chat.completions.create(
            model=model,
            messages=ASK,
            response_format={"type": "json_object"},
            temperature=1.0,
            max_tokens=400,
            seed=100 + trial,
        )
        choice = out.choices[0]
        # a wandering answer is closed by the budget: whole JSON still, its finish "length"
        assert choice.finish_reason in ("stop", "length"), (trial, choice)
        assert isinstance(json.loads(choice.message.content), dict), (trial, choice)
        assert out.usage.completion_tokens <= 400
        by_budget += choice.finish_reason == "length"
    assert by_budget < TRIALS  # most end by themselves: the closing is a net, not the answer


def _call(out):
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    return call


@pytest.mark.parametrize("model", MODELS)
def test_a_tool_call_round_trip_completes(server, model):
    first = server.client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
        temperature=1.0, max_tokens=120, seed=7,
    )  # fmt: skip
    call = _call(first)
    assert call.function.name == "get_weather"
    jsonschema_rs.validator_for(WEATHER["function"]["parameters"]).validate(
        json.loads(call.function.arguments)
    )
    follow = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    answer = dict(model=model, tools=[WEATHER], tool_choice="none", max_tokens=12, temperature=0)
    second = server.client.chat.completions.create(messages=follow, **answer)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].finish_reason in ("stop", "length")
    # the call and its result were rendered into the prompt: it is longer than the question alone
    alone = server.client.chat.completions.create(messages=ASK, **answer)
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 8


@pytest.mark.parametrize("model", MODELS)
def test_streamed_tool_call_deltas_reassemble_to_the_whole_call(server, model):
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(model=model, messages=ASK, tools=[WEATHER], tool_choice=named, temperature=0, max_tokens=120)
    whole = _call(server.client.chat.completions.create(**kw))
    calls: dict[int, dict] = {}
    finish = None
    for chunk in server.client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            assert not choice.delta.content, choice.delta  # no markup leaks into the content
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = piece.id or call["id"]
                call["name"] += (piece.function.name or "") if piece.function else ""
                call["arguments"] += (piece.function.arguments or "") if piece.function else ""
    assert finish == "tool_calls"
    assert list(calls) == [0] and calls[0]["id"]
    assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == (
        whole.function.name,
        json.loads(whole.function.arguments),
    )


@pytest.mark.parametrize("model", MODELS)
def test_logprobs_agree_with_the_returned_tokens(server, model):
    out = server.client.chat.completions.create(
        model=model, messages=ASK, logprobs=True, top_logprobs=3, temperature=0, max_tokens=12
    )
    choice = out.choices[0]
    tokens = choice.logprobs.content
    assert len(tokens) == out.usage.completion_tokens
    for t in tokens:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-5)  # greedy took the likeliest
        assert sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1 + 1e-5
    text = b"".join(bytes(t.bytes) for t in tokens).decode("utf-8", "replace")
    assert choice.message.content and text.startswith(choice.message.content)  # an EOS adds no text


def _prompt_tokens_computed(server, model: str) -> int:
    auth = {"authorization": f"Bearer {server.admin}"}
    pops = httpx.get(f"{server.url}/cdn-cgi/edge/pops", headers=auth, timeout=30).json()
    return sum(p["models"][model]["prompt_tokens"] for p in pops["pops"] if model in p.get("models", {}))


@pytest.mark.parametrize("model", MODELS)
def test_n_four_returns_four_choices_and_computes_the_prompt_once(server, model):
    long_ask = [{"role": "user", "content": "Tell me about the weather in Paris. " * 12}]
    before = _prompt_tokens_computed(server, model)
    out = server.client.chat.completions.create(
        model=model, messages=long_ask, n=4, temperature=1.0, max_tokens=8, seed=3
    )
    computed = _prompt_tokens_computed(server, model) - before
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert 4 <= out.usage.completion_tokens <= 4 * 8  # usage counts every choice's tokens
    prompt = out.usage.prompt_tokens
    # the prompt once, plus each of the three others' partial last block (under 16 tokens each)
    assert prompt <= computed < prompt + 3 * 16, (computed, prompt)
