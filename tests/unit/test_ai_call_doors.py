"""Every AI door makes the one call object (runtime.ai.call.AICall), and each call records itself
once: env.AI.run (the isolate's AIRun message), through its AI Gateway option too, and
env.AI.gateway(id).run; POST /ai/run, whole and streamed; the OpenAI-compatible doors (chat,
completions, embeddings); the Responses API; AI Gateway's workers-ai and compat doors. The AI
service is the runtime's own on a tiny model; what it hands the rate limiter, the metrics and the
dashboard feed is kept, and must be the call's own record, once each."""

import asyncio
import textwrap
import types

import pytest
from starlette.testclient import TestClient

from runtime.ai.call import AICall
from runtime.app import Runtime, create_app
from runtime.control.config import parse_config
from runtime.host.invocation import Invocation
from runtime.host.worker_calls import WorkerCalls
from runtime.isolate import ipc
from tests.conftest import TINY_MODEL

MODEL = TINY_MODEL  # what the icn_edge fixture serves
ADMIN = {"authorization": "Bearer adm-token"}
ASK = {"prompt": "def fib(n):", "max_tokens": 2, "temperature": 0}
BASE = "/client/v4/accounts/doors"
GATEWAY = "/cdn-cgi/ai-gateway/v1/doors/gw"


class Kept:
    """The calls the AI service was handed and the records its readers read."""

    def __init__(self, rt: Runtime):
        self.calls: list[AICall] = []
        self.metrics, self.feed, self.charged = [], [], []
        answer, embed = rt.ai.answer, rt.ai.embed

        async def answered(call, *args, **kw):
            self.calls.append(call)
            return await answer(call, *args, **kw)

        async def embedded(call, *args, **kw):
            if not self.calls or self.calls[-1] is not call:  # OpenAI's embeddings: answer -> embed
                self.calls.append(call)
            return await embed(call, *args, **kw)

        rt.ai.answer, rt.ai.embed = answered, embedded
        metrics, feed, used = rt.metrics.ai_record, rt.feed.ai_record, rt.rate_limits.used
        rt.metrics.ai_record = lambda record: (self.metrics.append(record), metrics(record))
        rt.feed.ai_record = lambda record: (self.feed.append(record), feed(record))
        rt.rate_limits.used = lambda *args: (self.charged.append(args), used(*args))

    def one_recorded(self, generated: bool = True) -> AICall:
        """The one call made since the last look, its record handed once to each reader (the feed
        charts only what a generation answered); forgotten after."""
        (call,) = self.calls
        assert type(call) is AICall
        record = call.record
        assert [id(r) for r in self.metrics] == [id(record)] and [id(r) for r in self.feed] == [id(record)]
        tokens = record.prompt_tokens + record.completion_tokens
        assert self.charged == [(record.account, record.served, tokens)] and tokens > 0
        if generated:
            assert record.timing is not None and record.server_timing and record.quantization
        self.calls.clear(), self.metrics.clear(), self.feed.clear(), self.charged.clear()
        return call


@pytest.fixture
def runtime(tmp_path, icn_edge):
    (tmp_path / "worker.py").write_text("from workers import WorkerEntrypoint\n")
    config = parse_config(
        textwrap.dedent("""
        name = "doors"
        main = "worker.py"
        compatibility_date = "2026-11-01"
    """),
        base_dir=tmp_path,
    )
    rt = Runtime(config, icn_edge, admin_token="adm-token")
    rt.kept = Kept(rt)
    yield rt
    rt.gateways.close()
    rt.state.close()
    rt.bindings.close()


@pytest.fixture
def client(runtime):
    return TestClient(create_app(runtime))  # no lifespan: the dev worker's isolate never starts


@pytest.fixture
def token(client):
    r = client.post("/cdn-cgi/edge/accounts", json={"name": "doors"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return {"authorization": f"Bearer {r.json()['token']['token']}"}


def worker_calls(runtime, icn_edge):
    location = icn_edge.locate("Seoul")
    ctx = Invocation(location, icn_edge.ingress(location)[0], 0.0)
    services = types.SimpleNamespace(ai=runtime.ai, gateways=runtime.gateways)
    return WorkerCalls(types.SimpleNamespace(account="doors"), {1: ctx}, services), ctx


def test_env_ai_run_makes_the_call_and_the_tail_reads_its_record(runtime, icn_edge):
    calls, ctx = worker_calls(runtime, icn_edge)
    reply = asyncio.run(calls.ai(ipc.AIRun(1, 1, MODEL, dict(ASK), {"tags": ["t"]})))
    assert reply.error_code is None
    call = runtime.kept.one_recorded()
    assert call.record.request_id == dict(reply.headers)["cf-ai-req-id"] and call.account == "doors"
    # the tail event and the timing headers read the same record, not figures of their own
    assert ctx.ai_calls[0] is call.record and ctx.ai_answers[0] is call.record
    assert ctx.tail_event(types.SimpleNamespace(name="w", version=None), "ok", None, {}, 0.1)["ai"] == [
        {"model": MODEL, "requestId": call.record.request_id, "tags": ["t"]}
    ]
    assert dict(reply.headers)["server-timing"] == call.record.server_timing
    through = asyncio.run(calls.ai(ipc.AIRun(2, 1, MODEL, dict(ASK), {"gateway": {"id": "gw"}})))
    assert through.error_code is None
    gated = runtime.kept.one_recorded()
    assert (
        gated.record.gateway == "gw" and gated.record.gateway_log_id == dict(through.headers)["cf-aig-log-id"]
    )
    assert [id(r) for r in ctx.ai_calls] == [id(call.record), id(gated.record)]


def test_a_universal_gateway_run_records_the_step_that_answered(runtime, icn_edge):
    calls, ctx = worker_calls(runtime, icn_edge)
    step = {"provider": "workers-ai", "endpoint": MODEL, "headers": {}, "query": ASK}
    reply = asyncio.run(calls.ai_gateway_run(ipc.AIGatewayRun(1, 1, "gw", [step])))
    assert reply.error_code is None, reply.error_message
    answered = runtime.kept.one_recorded()  # the step's own call
    (listed,) = ctx.ai_calls  # the run the worker made, as the tail lists it
    assert (
        listed.tail_entry()["model"] == "gateway:gw"
        and listed.gateway_log_id == answered.record.gateway_log_id
    )
    assert [id(r) for r in ctx.ai_answers] == [id(answered.record)]


@pytest.mark.parametrize(
    ("path", "body", "generated"),
    [
        (f"{BASE}/ai/run/{MODEL}", ASK, True),
        (f"{BASE}/ai/run/{MODEL}", {**ASK, "stream": True}, True),
        (
            f"{BASE}/ai/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            True,
        ),
        (f"{BASE}/ai/v1/completions", {"model": MODEL, "prompt": "def f(", "max_tokens": 2}, True),
        (f"{BASE}/ai/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2}, True),
        (f"{BASE}/ai/v1/embeddings", {"model": "@cf/baai/bge-base-en-v1.5", "input": ["two words"]}, False),
        (f"{GATEWAY}/workers-ai/{MODEL}", ASK, True),
        (
            f"{GATEWAY}/compat/chat/completions",
            {
                "model": f"workers-ai/{MODEL}",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
            True,
        ),
    ],
    ids=["ai-run", "ai-run-stream", "chat", "completions", "responses", "embeddings", "gateway", "compat"],
)
def test_each_http_door_makes_the_call_and_records_it_once(client, runtime, token, path, body, generated):
    r = client.post(path, json=body, headers=token)
    assert r.status_code == 200, r.text
    call = runtime.kept.one_recorded(generated)
    assert call.account == "doors"
    if path.startswith(BASE) and generated and not body.get("stream"):  # a whole answer's latency
        assert r.headers["server-timing"] == call.record.server_timing
