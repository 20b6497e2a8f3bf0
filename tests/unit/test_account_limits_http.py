"""Accounts and their rate limits through the runtime's real HTTP app (the control endpoints, the
Workers AI REST and OpenAI APIs, /metrics) and env.AI.run's path, on a tiny model. The limiter's
clock is the test's, so nothing depends on speed: the window never slides unless the test moves it."""

import asyncio
import re
import textwrap
import types

import pytest
from starlette.testclient import TestClient

from runtime.app import Runtime, create_app
from runtime.control.config import parse_config
from runtime.host.invocation import Invocation
from runtime.host.worker_calls import WorkerCalls
from runtime.isolate import ipc
from tests.conftest import TINY_MODEL

MODEL = TINY_MODEL  # what the icn_edge fixture serves
ADMIN = {"authorization": "Bearer adm-token"}
ASK = {"prompt": "def fib(n):", "max_tokens": 2, "temperature": 0}


class Clock:
    now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def runtime(tmp_path, icn_edge):
    (tmp_path / "worker.py").write_text("from workers import WorkerEntrypoint\n")
    config = parse_config(
        textwrap.dedent("""
        name = "limits"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge.accounts.small]
        rpm = 3
        [edge.accounts.tokens]
        tpm = 1
    """),
        base_dir=tmp_path,
    )
    rt = Runtime(config, icn_edge, admin_token="adm-token")
    rt.rate_limits.limiter.clock = clock = Clock()
    rt.clock = clock
    yield rt
    rt.state.close()
    rt.bindings.close()


@pytest.fixture
def client(runtime):
    return TestClient(create_app(runtime))  # no lifespan: the dev worker's isolate never starts


def token_for(client, name):
    r = client.post(f"/cdn-cgi/edge/accounts/{name}/tokens", json={"name": "test"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return {"authorization": f"Bearer {r.json()['token']}"}


def run(client, account, headers, body=ASK):
    return client.post(f"/client/v4/accounts/{account}/ai/run/{MODEL}", json=body, headers=headers)


def test_an_account_over_its_rpm_gets_429_while_another_is_served(client, runtime):
    small = token_for(client, "small")  # rpm = 3, from the config
    created = client.post("/cdn-cgi/edge/accounts", json={"name": "big"}, headers=ADMIN)
    assert created.status_code == 201 and created.json()["account"]["rpm"] == 300
    big = {"authorization": f"Bearer {created.json()['token']['token']}"}
    answers = []
    for _ in range(6):
        answers.append(run(client, "small", small).status_code)
        assert run(client, "big", big).status_code == 200  # never affected by small's limit
    assert answers == [200, 200, 200, 429, 429, 429]
    r = run(client, "small", small)
    assert r.status_code == 429 and re.fullmatch(r"[1-9]\d*", r.headers["retry-after"])
    assert int(r.headers["retry-after"]) == 60  # the clock never moved: the first leaves in a minute
    error = r.json()["errors"][0]
    assert r.json()["success"] is False and error["code"] == 3036
    message = error["message"]
    assert message.startswith("Account limited: account 'small' has used 3 of its 3 requests per minute")
    assert f"model {MODEL!r}" in message and "retry in 60 s" in message
    runtime.clock.now += 60  # the window slides past the first three
    assert run(client, "small", small).status_code == 200


def test_the_openai_api_answers_its_own_429_shape(client, runtime):
    small = token_for(client, "small")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    url = "/client/v4/accounts/small/ai/v1/chat/completions"
    statuses = [client.post(url, json=chat, headers=small).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    r = client.post(
        "/client/v4/accounts/small/ai/v1/completions", json={"model": MODEL, "prompt": "x"}, headers=small
    )
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    error = r.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert "account 'small'" in error["message"]


def test_env_ai_run_raises_3036_for_a_limited_account(runtime, icn_edge):
    location = icn_edge.locate("Seoul")
    ctx = Invocation(location, icn_edge.ingress(location)[0], 0.0)
    services = types.SimpleNamespace(ai=runtime.ai, metrics=runtime.metrics, batches=None)
    calls = WorkerCalls(types.SimpleNamespace(account="small"), {1: ctx}, services)
    replies = [asyncio.run(calls.ai(ipc.AIRun(i, 1, MODEL, dict(ASK)))) for i in range(4)]
    assert [r.error_code for r in replies] == [None, None, None, 3036]
    assert "Account limited: account 'small'" in replies[3].error_message
    stream = asyncio.run(calls.ai(ipc.AIRun(9, 1, MODEL, {**ASK, "stream": True})))
    assert stream.error_code == 3036  # refused before any stream starts


def test_tpm_is_counted_from_the_usage_of_each_result(client, runtime):
    headers = token_for(client, "tokens")  # tpm = 1: one request may start, its tokens put it over
    first = run(client, "tokens", headers)
    assert first.status_code == 200
    used = first.json()["result"]["usage"]["total_tokens"]
    window = runtime.rate_limits.limiter._windows[("tokens", MODEL)]
    assert window.token_sum == used > 1
    r = run(client, "tokens", headers)
    assert r.status_code == 429 and r.json()["errors"][0]["code"] == 3036
    assert f"has used {used} of its 1 tokens per minute" in r.json()["errors"][0]["message"]
    # raise the limit: the stream's tokens are counted once it ends
    assert (
        client.patch("/cdn-cgi/edge/accounts/tokens", json={"tpm": 10_000}, headers=ADMIN).status_code == 200
    )
    streamed = run(client, "tokens", headers, {**ASK, "stream": True})
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
    assert window.token_sum > used


def test_metrics_count_refusals_by_account_model_and_limit(client, runtime):
    small = token_for(client, "small")
    for _ in range(5):
        run(client, "small", small)  # 3 served, 2 refused
    admin_view = client.get("/cdn-cgi/edge/metrics", headers=ADMIN).text
    series = f'edge_ai_account_rate_limited_total{{account="small",limit="rpm",model="{MODEL}"}} 2.0'
    assert series in admin_view
    public = client.get("/cdn-cgi/edge/metrics").text
    assert f'edge_ai_rate_limited_total{{limit="rpm",model="{MODEL}"}} 2.0' in public
    assert "small" not in public  # the open view names no account


def test_the_control_endpoints_need_the_admin_token_and_say_what_to_change(client):
    assert client.get("/cdn-cgi/edge/accounts").status_code == 401
    assert (
        client.post(
            "/cdn-cgi/edge/accounts", json={"name": "x"}, headers={"authorization": "Bearer no"}
        ).status_code
        == 403
    )

    def error(r, status):
        assert r.status_code == status, r.text
        return r.json()["error"]["message"]

    post = lambda body: client.post("/cdn-cgi/edge/accounts", json=body, headers=ADMIN)  # noqa: E731
    assert "1-63 characters" in error(post({"name": "Bad Name"}), 400)
    assert error(post({"name": "x", "rpm": 0}), 400).startswith("rpm: 0; expected a whole number")
    assert "kv_share" in error(post({"name": "x", "kv_share": 2}), 400)
    assert "unknown setting colour" in error(post({"name": "x", "colour": 1}), 400)
    assert "name" in error(post({"rpm": 3}), 400)
    assert "edge accounts update small" in error(post({"name": "small"}), 409)
    bad_json = client.post("/cdn-cgi/edge/accounts", content=b"{", headers=ADMIN)
    assert "not valid JSON" in error(bad_json, 400)
    assert "no account 'nobody'" in error(
        client.patch("/cdn-cgi/edge/accounts/nobody", json={}, headers=ADMIN), 404
    )
    assert error(client.post("/cdn-cgi/edge/accounts/nobody/tokens", headers=ADMIN), 404)
    revoke = client.delete("/cdn-cgi/edge/accounts/small/tokens/nope", headers=ADMIN)
    assert "no token named 'nope'" in error(revoke, 404)
    assert client.delete("/cdn-cgi/edge/accounts/small/tokens/nope").status_code == 401


def test_accounts_are_listed_with_token_names_never_tokens(client):
    made = client.post(
        "/cdn-cgi/edge/accounts", json={"name": "acme", "tpm": 500, "weight": 2}, headers=ADMIN
    )
    token = made.json()["token"]["token"]
    second = client.post("/cdn-cgi/edge/accounts/acme/tokens", headers=ADMIN).json()
    listed = client.get("/cdn-cgi/edge/accounts", headers=ADMIN)
    assert token not in listed.text and second["token"] not in listed.text
    acme = next(a for a in listed.json()["accounts"] if a["id"] == "acme")
    assert (acme["rpm"], acme["tpm"], acme["weight"], acme["kv_share"]) == (300, 500, 2.0, 1.0)
    assert [t["name"] for t in acme["tokens"]] == ["default", second["name"]]
    small = next(a for a in listed.json()["accounts"] if a["id"] == "small")
    assert small["rpm"] == 3  # applied from the config at start
    r = client.delete(f"/cdn-cgi/edge/accounts/acme/tokens/{second['name']}", headers=ADMIN)
    assert r.status_code == 200 and r.json()["revoked"] == 1
    models = client.get(
        "/client/v4/accounts/acme/ai/v1/models", headers={"authorization": f"Bearer {second['token']}"}
    )
    assert models.status_code == 401  # the revoked token opens nothing
    assert (
        client.get(
            "/client/v4/accounts/acme/ai/v1/models", headers={"authorization": f"Bearer {token}"}
        ).status_code
        == 200
    )
