"""The upstream PoP node against a fake OpenAI server (httpx.MockTransport): the body it sends,
the stream read back through the edge's own choice assembler (text, logprobs, tool calls), error
mapping, fair order between tenants before forwarding, and the config's checks."""

import asyncio
import json

import httpx
import msgspec
import pytest

from edge_sim.errors import EdgeError, PopDown
from edge_sim.request import GenerateRequest, GenerateResult
from edge_sim.topology import PoP, Topology, TopologyError
from edge_sim.upstream import UpstreamPopNode
from edge_sim.upstream_config import UpstreamConfig, UpstreamModel
from engine import SamplingParams
from engine.structured.tool_types import ToolFunction

MODEL = "@edge/moonshotai/kimi-k2-mini"


def pop(**upstream) -> PoP:
    cfg = {
        "backend": "openai",
        "base_url": "http://upstream.test:8000",
        "models": [UpstreamModel(name=MODEL, upstream_model="moonshotai/Kimi-K2-Instruct", weights="fp8")],
    } | upstream
    return PoP(
        "FRA",
        "Frankfurt",
        "DE",
        "EU",
        50.11,
        8.68,
        "Europe/Berlin",
        {"H200": 8},
        upstream=UpstreamConfig(**cfg),
    )


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def chat_chunk(delta: dict, finish=None, index=0, logprobs=None) -> dict:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    return {"choices": [choice]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}


def node_with(handler, **upstream) -> UpstreamPopNode:
    node = UpstreamPopNode(pop(**upstream), transport=httpx.MockTransport(handler))
    node.reachable = True
    return node


def chat(tenant="local", **kw) -> GenerateRequest:
    params = kw.pop("params", SamplingParams(max_tokens=4))
    return GenerateRequest(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], params=params, tenant=tenant, **kw
    )


async def run(node: UpstreamPopNode, req: GenerateRequest):
    formats = node.formats(req.model)
    choices = req.assembler(formats)
    deltas = [d async for e in node.stream(req) if (d := choices.push(e)) is not None]
    return deltas, GenerateResult.assembled(choices, node.code, req.model, node.formats(req.model))


def test_the_body_carries_our_parameters_and_the_answer_comes_back_with_usage():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content), request.headers.get("authorization")))
        return httpx.Response(
            200, content=sse(chat_chunk({"content": "he"}), chat_chunk({"content": "y"}, "stop"), USAGE)
        )

    params = SamplingParams(max_tokens=4, temperature=0.0, top_k=5, seed=3, stop=["\n"])
    _, result = asyncio.run(run(node_with(handler), chat(params=params)))
    path, body, auth = seen[0]
    assert path == "/v1/chat/completions" and auth is None
    assert body["model"] == "moonshotai/Kimi-K2-Instruct" and body["stream"] is True
    assert (body["max_tokens"], body["temperature"], body["top_k"], body["seed"], body["stop"]) == (
        4,
        0.0,
        5,
        3,
        ["\n"],
    )
    assert "min_p" not in body and "cache_salt" not in body  # defaults and unsupported extensions stay out
    assert result.text == "hey" and result.finish_reason == "stop"
    assert (result.prompt_tokens, result.completion_tokens) == (7, 2)
    assert result.formats.weights == "fp8" and result.pop == "FRA"


def test_upstream_tool_calls_and_logprobs_reach_the_edge_as_its_own():
    lp = {
        "content": [
            {
                "token": "x",
                "logprob": -0.5,
                "bytes": [120],
                "top_logprobs": [{"token": "x", "logprob": -0.5, "bytes": [120]}],
            }
        ]
    }
    stream = sse(
        chat_chunk({"content": "x"}, logprobs=lp),
        chat_chunk(
            {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get", "arguments": '{"a"'}}]}
        ),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chat_chunk({}, "tool_calls"),
        USAGE,
    )
    node = node_with(lambda r: httpx.Response(200, content=stream))
    tools = [
        ToolFunction(name="get", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})
    ]
    req = chat(tools=tools, params=SamplingParams(max_tokens=8, logprobs=1))
    deltas, result = asyncio.run(run(node, req))
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.text == "x"
    assert [(c.name, json.loads(c.arguments)) for c in choice.tool_calls] == [("get", {"a": 1})]
    assert choice.logprobs[0].chosen.token == "x" and choice.logprobs[0].chosen.logprob == -0.5
    assert any(d.tool_calls for d in deltas) and not any("<|" in d.text for d in deltas)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_input"), (404, "model_not_found"), (429, "no_capacity"), (503, "no_capacity")],
)
def test_upstream_errors_map_to_the_edges_kinds(status, kind):
    body = {"error": {"message": "max_tokens is too large", "type": "BadRequestError", "code": status}}
    node = node_with(lambda r: httpx.Response(status, json=body))
    with pytest.raises(EdgeError) as err:
        asyncio.run(run(node, chat()))
    assert err.value.kind == kind and err.value.message == "upstream: max_tokens is too large"


def test_a_timeout_is_a_timeout_and_a_refused_connection_hands_the_request_back():
    def timing_out(request):
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(EdgeError) as err:
        asyncio.run(run(node_with(timing_out), chat()))
    assert err.value.kind == "timeout"

    def refusing(request):
        raise httpx.ConnectError("refused", request=request)

    node = node_with(refusing)
    with pytest.raises(PopDown):
        asyncio.run(run(node, chat()))
    assert not node.up  # marked down: the router skips it until a health check answers


def test_cache_salt_is_the_tenants_server_side_salt_only_when_the_upstream_takes_it():
    salts = []

    def handler(request):
        salts.append(json.loads(request.content).get("cache_salt"))
        return httpx.Response(200, content=sse(chat_chunk({"content": "a"}, "stop"), USAGE))

    node = node_with(handler, cache_salt=True)
    for tenant in ("alice", "bob", "alice"):
        asyncio.run(run(node, chat(tenant=tenant)))
    assert salts[0] == salts[2] != salts[1] and all(len(s) == 64 and "alice" not in s for s in salts)
    other = node_with(handler, cache_salt=True)  # another node's secret: another salt
    asyncio.run(run(other, chat(tenant="alice")))
    assert salts[3] != salts[0]
    plain = node_with(handler)
    asyncio.run(run(plain, chat(tenant="alice")))
    assert salts[4] is None


def test_two_tenants_are_interleaved_fairly_before_forwarding():
    """One slot at a slow upstream: a burst of 6 from a, then 2 from b; b's do not wait for a's burst."""
    order = []

    async def handler(request):
        order.append(json.loads(request.content)["cache_salt"])
        await asyncio.sleep(0.01)
        return httpx.Response(200, content=sse(chat_chunk({"content": "a"}, "stop"), USAGE))

    async def scenario():
        node = node_with(handler, cache_salt=True, max_concurrent=1)
        salt = {t: node.cache_salt(t) for t in ("a", "b")}
        burst = [asyncio.create_task(run(node, chat(tenant="a"))) for _ in range(6)]
        await asyncio.sleep(0)  # the burst is queued first
        late = [asyncio.create_task(run(node, chat(tenant="b"))) for _ in range(2)]
        await asyncio.gather(*burst, *late)
        return [next(t for t, s in salt.items() if s == got) for got in order]

    tenants = asyncio.run(scenario())
    assert sorted(tenants) == ["a"] * 6 + ["b"] * 2
    assert max(i for i, t in enumerate(tenants) if t == "b") <= 4, tenants  # first come would be 7


def test_a_node_going_down_hands_its_queued_requests_back_and_cuts_the_started_one():
    async def scenario():
        gate = asyncio.Event()

        async def body():
            yield b"data: " + json.dumps(chat_chunk({"content": "a"})).encode() + b"\n\n"
            await gate.wait()
            yield sse(chat_chunk({"content": "b"}, "stop"), USAGE)

        async def handler(request):
            return httpx.Response(200, content=body())

        node = node_with(handler, max_concurrent=1)
        started, first = [], asyncio.Event()

        async def consume():
            async for event in node.stream(chat()):
                started.append(event)
                first.set()

        running = asyncio.create_task(consume())
        queued = asyncio.create_task(run(node, chat(tenant="b")))
        await asyncio.wait_for(first.wait(), 5)
        assert node.status().queue_depth == 1
        assert await node.take_down() == 1
        with pytest.raises(PopDown):
            await queued  # never forwarded: the edge re-routes it
        gate.set()
        with pytest.raises(EdgeError) as cut:
            await running  # forwarded and started: it ends with an error, as at an in-process PoP
        assert cut.value.kind == "no_capacity" and len(started) == 1

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"base_url": "ftp://x"}, "upstream.base_url must be an http"),
        ({"base_url": "http://x:8000/v1"}, "the part before /v1"),
        ({"api_key_env": "sk-123"}, "names an environment variable"),
        ({"api_key_env": "EDGE_TEST_UNSET_KEY"}, "is not set"),
        ({"models": []}, "name 1 to"),
        ({"max_concurrent": 0}, "max_concurrent"),
    ],
)
def test_bad_upstream_config_is_refused_naming_the_key(change, message):
    with pytest.raises(TopologyError, match=message):
        Topology([pop(**change)])


def test_the_config_is_read_from_a_topology_entry():
    entry = {
        "code": "FRA", "city": "Frankfurt", "country": "DE", "continent": "EU", "lat": 50.1, "lon": 8.7,
        "timezone": "Europe/Berlin", "gpus": {"H200": 8},
        "upstream": {
            "backend": "openai", "base_url": "http://h:8000",
            "models": [{"name": MODEL, "upstream_model": "m", "weights": "int4"}],
        },
    }  # fmt: skip
    fra = msgspec.convert(entry, PoP)
    assert fra.upstream.model(MODEL).kv_cache == "auto"
    with pytest.raises(msgspec.ValidationError, match="backend"):
        msgspec.convert(entry | {"upstream": entry["upstream"] | {"backend": "grpc"}}, PoP)
    with pytest.raises(TopologyError, match="not both"):
        Topology([msgspec.structs.replace(fra, url="http://n:9000")])
    assert UpstreamPopNode(fra).status().backend == "openai"
