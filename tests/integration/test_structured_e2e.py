"""Issue 14's trials end to end, with the official `openai` client against a running `edge dev` on
both miniatures: JSON mode and strict-schema outputs parse and validate in 20 of 20 sampled trials
at temperature 1 (sent at once, so the engine batches them), a tool call round trip completes,
streamed tool-call deltas reassemble to the non-streamed call, logprobs agree with the returned
tokens, and n=4 returns four choices with the prompt computed once (counted at the PoP). Tool calls
have JSON mode's guarantees (sampled trials sent at once too): with tool_choice "required" a call
whose arguments validate in at least 48 of 50 (streamed too), never an invalid one; with 32 tokens
a valid call or finish_reason "length" and no call; with "auto" every call returned valid; the same
through Workers AI's /ai/run and a worker's env.AI.run."""

from __future__ import annotations

import json
import math
import re
import textwrap
from concurrent.futures import ThreadPoolExecutor

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
# a worker that hands its body to env.AI.run (the tool-call trials through a worker)
WORKER = """
from workers import AIError, Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        if request.method != "POST":
            return Response("")
        body = await request.json()
        try:
            return Response.json(await self.env.AI.run(body["model"], body["inputs"]))
        except AIError as exc:
            return Response.json({"error": str(exc)}, status=400)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("structured")
    (d / "worker.py").write_text(WORKER)
    names = ", ".join(f'"{m}"' for m in MODELS)
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "structured"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [ai]
        binding = "AI"
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

    def sample(trial):
        return server.client.chat.completions.create(
            model=model, messages=ASK, response_format=fmt, temperature=1.0, max_tokens=200, seed=trial
        )

    for trial, out in enumerate(_at_once(sample, [(trial,) for trial in range(TRIALS)])):
        choice = out.choices[0]
        assert choice.finish_reason == "stop", (trial, choice)
        validator.validate(json.loads(choice.message.content))


@pytest.mark.parametrize("model", MODELS)
def test_json_mode_outputs_are_json_objects_in_every_sampled_trial(server, model):
    def sample(trial):
        return server.client.chat.completions.create(
            model=model,
            messages=ASK,
            response_format={"type": "json_object"},
            temperature=1.0,
            max_tokens=400,
            seed=100 + trial,
        )

    by_budget = 0
    for trial, out in enumerate(_at_once(sample, [(trial,) for trial in range(TRIALS)])):
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
    # the tokens are the whole reply: GLM-4.5's reasoning block (empty, thinking off) and then the
    # content; an EOS adds no text
    reply = re.sub(r"^\n?<think>.*?</think>\n?", "", text, flags=re.S)
    assert choice.message.content and reply.startswith(choice.message.content)


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


# --- tool calls with JSON mode's guarantees ------------------------------------------------------------

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
GET_WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
SEOUL = [{"role": "user", "content": "Weather in Seoul?"}]
CALL_TRIALS = 50


def _valid_arguments(arguments) -> bool:
    """The schema's own check, by hand: a JSON object with `city` a string and no other key (the
    schema names no other: additionalProperties is false unless it says otherwise)."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return False
    return isinstance(args, dict) and set(args) == {"city"} and isinstance(args["city"], str)


def _streamed(server, **kw):
    """(finish_reason, [(name, arguments)], content) reassembled from the delta pieces."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in server.client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            content += choice.delta.content or ""
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = piece.id or call["id"]
                call["name"] += (piece.function.name or "") if piece.function else ""
                call["arguments"] += (piece.function.arguments or "") if piece.function else ""
    assert all(c["id"] for c in calls.values()) and sorted(calls) == list(range(len(calls)))
    return finish, [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)], content


def _trial(server, model, seed, max_tokens, tool_choice="required", stream=False):
    kw = dict(
        model=model, messages=SEOUL, tools=[GET_WEATHER], tool_choice=tool_choice,
        temperature=1.0, max_tokens=max_tokens, seed=seed,
    )  # fmt: skip
    if stream:
        return _streamed(server, **kw)
    choice = server.client.chat.completions.create(**kw).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.finish_reason, calls, choice.message.content


def _outcome(finish, calls) -> str:
    """ "call": finish_reason tool_calls and every call valid; "length": cut off and no call (an
    unfinished call dropped); anything else is a broken promise."""
    if finish == "tool_calls" and calls and all(n == "get_weather" and _valid_arguments(a) for n, a in calls):
        return "call"
    if finish == "length" and not calls:
        return "length"
    return f"broken: {finish} {calls!r:.300}"


def _at_once(fn, jobs):
    """fn(*job) for every job, sent together (the engine batches them), the results in the jobs' order."""
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:  # sent together: the engine batches them
        return list(pool.map(lambda job: fn(*job), jobs))


@pytest.mark.parametrize("model", MODELS)
def test_required_tool_calls_validate_in_48_of_50_sampled_trials_streamed_or_not(server, model):
    jobs = [
        (server, model, seed, 256, "required", stream)
        for stream in (False, True)
        for seed in range(CALL_TRIALS)
    ]
    results = _at_once(_trial, jobs)
    for stream in (False, True):
        outcomes = [_outcome(f, c) for (f, c, _), job in zip(results, jobs, strict=True) if job[5] == stream]
        assert not [o for o in outcomes if o.startswith("broken")], outcomes  # never an invalid call
        assert outcomes.count("call") >= 48, (stream, outcomes)
    for _, _, content in results:
        assert not content, content  # nothing but the calls (no markup leaks into the content)


@pytest.mark.parametrize("model", MODELS)
def test_a_tight_budget_gives_a_valid_call_or_length_and_no_call(server, model):
    jobs = [(server, model, seed, 32, "required", seed % 2 == 1) for seed in range(CALL_TRIALS)]
    outcomes = [_outcome(f, c) for f, c, _ in _at_once(_trial, jobs)]
    assert set(outcomes) <= {"call", "length"}, outcomes


@pytest.mark.parametrize("model", MODELS)
def test_auto_returns_only_valid_calls(server, model):
    jobs = [(server, model, seed, 64, "auto", seed % 2 == 1) for seed in range(20)]
    for finish, calls, _ in _at_once(_trial, jobs):
        if calls or finish == "tool_calls":
            assert _outcome(finish, calls) == "call", (finish, calls)
        else:
            assert finish in ("stop", "length")


def _workers_ai(server, model, seed, max_tokens, via_worker):
    """A Workers AI call (its own tools shape), through /ai/run or a worker's env.AI.run:
    (finish_reason, [(name, arguments)]) in whichever schema the model answers."""
    inputs = {
        "messages": SEOUL,
        "tools": [{"name": "get_weather", "description": "The weather in a city", "parameters": CITY}],
        "tool_choice": "required",
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
    }
    if via_worker:
        r = httpx.post(server.url + "/", json={"model": model, "inputs": inputs}, timeout=300)
        out = r.json()
    else:
        auth = {"authorization": f"Bearer {server.token}"}
        url = f"{server.url}/client/v4/accounts/local/ai/run/{model}"
        r = httpx.post(url, json=inputs, headers=auth, timeout=300)
        out = r.json()["result"]
    assert r.status_code == 200, r.text
    if "choices" in out:  # a chat-completions model (GLM-4.5's catalog entry)
        choice = out["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        return choice["finish_reason"], [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    calls = out.get("tool_calls") or []  # text-generation: arguments as an object, as Cloudflare's
    assert all(isinstance(c["arguments"], dict) for c in calls), calls
    return out["finish_reason"], [(c["name"], c["arguments"]) for c in calls]


@pytest.mark.parametrize("model", MODELS)
def test_workers_ai_run_and_env_ai_run_keep_the_same_guarantees(server, model):
    jobs = [(server, model, seed, budget, seed % 2 == 1) for budget in (256, 32) for seed in range(8)]
    outcomes = [_outcome(*result) for result in _at_once(_workers_ai, jobs)]
    assert set(outcomes) <= {"call", "length"}, outcomes
    assert outcomes[:8].count("call") >= 7, outcomes  # (256 tokens: room for the call)
