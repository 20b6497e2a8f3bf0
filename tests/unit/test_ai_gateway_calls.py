"""env.AI.gateway(id)'s calls as the runtime answers them (runtime.host.worker_calls): each reaches
the account's gateways (runtime.ai.gateway.Gateways; a recording stand-in here), the universal run's
answer carries cf-ai-req-id, cf-aig-step and cf-aig-log-id, a missing log is AiGatewayLogNotFound,
bad arguments are refused naming the method, and every call counts against the request's budget.
Beside them, env.AI.run's tags and request id kept for the tail, and its prefix naming the model."""

from __future__ import annotations

import asyncio
import types

import pytest

from runtime.ai.gateway import GatewayAnswer, Gateways
from runtime.ai.service import Answer
from runtime.host import invocation
from runtime.host.invocation import Invocation
from runtime.host.worker_calls import WorkerCalls
from runtime.isolate import ipc
from workers import AIError


class RecordingGateways(Gateways):
    def __init__(self):
        self.seen: list[tuple] = []
        self.logs = {"log-1": {"id": "log-1", "model": "m"}}

    async def universal(self, call, gateway_id, steps):
        self.seen.append(("universal", call.account, gateway_id, steps, call.request_id))
        if steps[0].get("endpoint") == "fail":
            raise AIError(2003, "Rate limited")
        return GatewayAnswer(Answer(body={"result": {"response": "hi"}}), "log-2", step=len(steps) - 1)

    async def get_log(self, account, gateway_id, log_id):
        self.seen.append(("get_log", account, gateway_id, log_id))
        if log_id not in self.logs:
            raise AIError(404, f"log {log_id} not found")
        return self.logs[log_id]

    async def patch_log(self, account, gateway_id, log_id, patch):
        self.seen.append(("patch_log", account, gateway_id, log_id, patch))

    def url(self, account, gateway_id, provider, origin):
        return f"{origin}/gateway/{account}/{gateway_id}/{provider or 'universal'}"


def calls_with(gateways):
    ctx = Invocation(None, None, 0.0, origin="http://127.0.0.1:8787")
    services = types.SimpleNamespace(gateways=gateways)
    return WorkerCalls(types.SimpleNamespace(account="acct"), {1: ctx}, services), ctx


def test_a_universal_run_answers_with_the_step_and_log_headers():
    gateways = RecordingGateways()
    calls, ctx = calls_with(gateways)
    steps = [{"provider": "workers-ai", "endpoint": "a", "headers": {}, "query": {}}] * 2
    reply = asyncio.run(calls.ai_gateway_run(ipc.AIGatewayRun(7, 1, "gw", steps)))
    headers = dict(reply.headers)
    assert reply.call == 7 and reply.result == {"result": {"response": "hi"}}
    assert headers["cf-aig-step"] == "1" and headers["cf-aig-log-id"] == "log-2"
    assert gateways.seen == [("universal", "acct", "gw", steps, headers["cf-ai-req-id"])]
    assert ctx.binding_calls == 1
    one = asyncio.run(
        calls.ai_gateway_run(ipc.AIGatewayRun(8, 1, "gw", steps[0]))
    )  # one request: a list of one
    assert dict(one.headers)["cf-aig-step"] == "0"


def test_a_universal_run_refuses_what_is_not_a_request_and_passes_the_gateways_error_on():
    calls, _ = calls_with(RecordingGateways())
    bad = asyncio.run(calls.ai_gateway_run(ipc.AIGatewayRun(1, 1, "gw", [])))
    assert bad.error_code == 5004 and "{provider, endpoint, headers, query}" in bad.error_message
    failed = asyncio.run(calls.ai_gateway_run(ipc.AIGatewayRun(2, 1, "gw", [{"endpoint": "fail"}])))
    assert failed.error_code == 2003 and failed.error_message == "Rate limited"


def test_get_url_get_log_and_patch_log_reach_the_accounts_gateway():
    gateways = RecordingGateways()
    calls, _ = calls_with(gateways)
    url = asyncio.run(calls.ai_gateway(ipc.AIGatewayCall(1, 1, "gw", "getUrl", ["workers-ai"])))
    assert url.result == "http://127.0.0.1:8787/gateway/acct/gw/workers-ai"
    log = asyncio.run(calls.ai_gateway(ipc.AIGatewayCall(2, 1, "gw", "getLog", ["log-1"])))
    assert log.result == {"id": "log-1", "model": "m"}
    missing = asyncio.run(calls.ai_gateway(ipc.AIGatewayCall(3, 1, "gw", "getLog", ["nope"])))
    assert missing.error_type == "AiGatewayLogNotFound" and "nope" in missing.error_message
    patch = asyncio.run(
        calls.ai_gateway(ipc.AIGatewayCall(4, 1, "gw", "patchLog", ["log-1", {"feedback": 1}]))
    )
    assert patch.error_type is None
    assert gateways.seen[-1] == ("patch_log", "acct", "gw", "log-1", {"feedback": 1})


def test_wrong_arguments_are_refused_naming_the_method_and_what_it_takes():
    calls, _ = calls_with(RecordingGateways())
    reply = asyncio.run(calls.ai_gateway(ipc.AIGatewayCall(1, 1, "gw", "patchLog", ["log-1"])))
    assert reply.error_type == "TypeError" and "patchLog: takes a log id" in reply.error_message
    reply = asyncio.run(calls.ai_gateway(ipc.AIGatewayCall(2, 1, "gw", "deleteLog", ["log-1"])))
    assert reply.error_type == "TypeError" and "deleteLog: no such method" in reply.error_message


def test_gateway_calls_count_against_the_requests_budget(monkeypatch):
    monkeypatch.setattr(invocation, "BINDING_CALLS", 2)
    calls, _ = calls_with(RecordingGateways())
    replies = [
        asyncio.run(calls.ai_gateway(ipc.AIGatewayCall(i, 1, "gw", "getLog", ["log-1"]))) for i in range(3)
    ]
    assert [r.error_type for r in replies] == [None, None, "Error"]
    assert "at most 2" in replies[2].error_message
    run = asyncio.run(calls.ai_gateway_run(ipc.AIGatewayRun(9, 1, "gw", [{"endpoint": "a"}])))
    assert run.error_code == 3040


def test_without_gateways_a_call_says_ai_gateway_is_not_available():
    calls, _ = calls_with(None)
    reply = asyncio.run(calls.ai_gateway(ipc.AIGatewayCall(1, 1, "gw", "getUrl", [])))
    assert "AI Gateway is not available" in reply.error_message


class RecordingAI:
    def __init__(self):
        self.models: list[str] = []

    async def answer(self, call):
        self.models.append(call.model)
        return Answer(body={"result": {"response": "ok"}})


def test_a_runs_tags_and_request_id_are_kept_for_the_tail_and_its_prefix_names_the_model():
    ai = RecordingAI()
    ctx = Invocation(None, None, 0.0)
    calls = WorkerCalls(types.SimpleNamespace(account="acct"), {1: ctx}, types.SimpleNamespace(ai=ai))
    options = {"tags": ["checkout", "eu"], "prefix": "my-org"}
    reply = asyncio.run(calls.ai(ipc.AIRun(1, 1, "@cf/meta/m", {"prompt": "x"}, options)))
    request_id = dict(reply.headers)["cf-ai-req-id"]
    assert reply.result == {"result": {"response": "ok"}} and ai.models == ["my-org:@cf/meta/m"]
    spec = types.SimpleNamespace(name="w", version=None)
    event = ctx.tail_event(spec, "ok", None, {}, 0.01)
    assert event["ai"] == [{"model": "@cf/meta/m", "requestId": request_id, "tags": ["checkout", "eu"]}]


def test_the_isolates_gateway_run_sends_workerds_header_strings_and_answers_a_response():
    from runtime.isolate.inside.ai_gateway import AIGateway
    from runtime.isolate.inside.channel import AIAnswer

    sent = []

    class Channel:
        async def ai_exchange(self, what, message, signal=None):
            sent.append(message(5, 1))
            return AIAnswer({"result": {"response": "hi"}}, [("cf-ai-req-id", "r"), ("cf-aig-log-id", "l")])

    binding = types.SimpleNamespace(_channel=Channel(), note_answer=lambda headers: sent.append(headers))
    step = {
        "provider": "workers-ai",
        "endpoint": "m",
        "headers": {"cf-aig-cache-ttl": 60, "x": True},
        "query": {},
    }
    response = asyncio.run(AIGateway(binding, "gw").run(step))
    message = sent[0]
    assert isinstance(message, ipc.AIGatewayRun) and message.gateway == "gw"
    assert message.data == [{**step, "headers": {"cf-aig-cache-ttl": "60", "x": "true"}}]
    assert (
        response.headers.get("cf-aig-log-id") == "l"
        and response.headers.get("content-type") == "application/json"
    )
    assert asyncio.run(response.json()) == {"result": {"response": "hi"}}
    with pytest.raises(TypeError, match="options are not served here"):
        asyncio.run(AIGateway(binding, "gw").run(step, {"gateway": {"skipCache": True}}))
