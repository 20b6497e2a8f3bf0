"""Prefix-cache hits reach the answers: `usage.prompt_tokens_details.cached_tokens` in the OpenAI
shapes (HTTP) and in the Workers AI result (HTTP and the binding's service), per account."""

import asyncio
import types

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from runtime.ai.service import AIService
from runtime.control.metrics import Metrics
from runtime.routes.ai_rest import AIApi
from tests.conftest import TINY_MODEL

MODEL = TINY_MODEL  # what the icn_edge fixture serves
PROMPT = "def fibonacci(n):\n    " + "# a long shared system prompt, line by line\n    " * 12


class _Api(AIApi):
    """The AI API with the account taken from a test header (what authentication would give)."""

    def authenticate(self, request):
        return request.headers["x-test-account"]


@pytest.fixture(scope="module")
def client(icn_edge):
    service = AIService(icn_edge)

    def locate(request):
        ingress, rtt = icn_edge.ingress(icn_edge.locate("Seoul"))
        return types.SimpleNamespace(ingress=ingress, client_rtt_ms=rtt)

    host = types.SimpleNamespace(
        ai=service, metrics=Metrics(), locate=locate, catalog_view=lambda: [], batches=None
    )
    return TestClient(Starlette(routes=_Api(host).routes()))


def post(client, path, account, body):
    r = client.post(f"/client/v4/accounts/{account}{path}", json=body, headers={"x-test-account": account})
    assert r.status_code == 200, r.text
    return r.json()


def cached(usage) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_openai_usage_reports_cached_prompt_tokens_per_account(client):
    for path, body in (
        ("/ai/v1/completions", {"model": MODEL, "prompt": PROMPT + "return", "max_tokens": 2}),
        ("/ai/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}),
    ):
        body = {"max_tokens": 2, "temperature": 0, **body}
        first = post(client, path, "acct-a", body)["usage"]
        again = post(client, path, "acct-a", body)["usage"]
        other = post(client, path, "acct-b", body)["usage"]
        assert cached(first) == 0 and first["prompt_tokens"] > 32
        assert 0 < cached(again) < again["prompt_tokens"] == first["prompt_tokens"]
        assert cached(other) == 0  # the same prompt from another account: its own computation


def test_workers_ai_result_usage_carries_cached_tokens(client, icn_edge):
    body = {"prompt": PROMPT + "pass", "max_tokens": 2, "temperature": 0}
    first = post(client, f"/ai/run/{MODEL}", "acct-c", body)["result"]
    again = post(client, f"/ai/run/{MODEL}", "acct-c", body)["result"]
    assert first["timing"]["cached_tokens"] == cached(first["usage"]) == 0
    assert again["timing"]["cached_tokens"] == cached(again["usage"]) > 0  # in the latency account too
    first, again = first["usage"], again["usage"]
    # the binding's path (env.AI.run) shapes the same result
    service = AIService(icn_edge)
    ingress, rtt = icn_edge.ingress(icn_edge.locate("Seoul"))
    result, _ = asyncio.run(service.run(MODEL, body, ingress=ingress, client_rtt_ms=rtt, account="acct-c"))
    assert cached(result["usage"]) == cached(again)
    result, _ = asyncio.run(service.run(MODEL, body, ingress=ingress, client_rtt_ms=rtt, account="acct-d"))
    assert cached(result["usage"]) == 0
