"""AI Gateway's HTTP door (runtime.routes.gateway) through the runtime's real app, on the tiny model:
a Workers AI call and an OpenAI-compatible one through a gateway, cached (a HIT generates nothing,
whole or streamed) with the cf-aig-* headers; an account's token acts only for its own account; the
logs read and patched over the REST API; the rate limit's 429; and `edge gateway logs`."""

from __future__ import annotations

import json
import textwrap
import types

import pytest
from starlette.testclient import TestClient

from runtime.app import Runtime, create_app
from runtime.control.config import parse_config
from tests.conftest import TINY_MODEL

ADMIN = {"authorization": "Bearer adm-token"}
ASK = {"prompt": "def fib(n):", "max_tokens": 2, "temperature": 0}


@pytest.fixture
def runtime(tmp_path, icn_edge):
    (tmp_path / "worker.py").write_text("from workers import WorkerEntrypoint\n")
    config = parse_config(
        textwrap.dedent("""
        name = "gateways"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge.ai_gateways.limited]
        rate_limit = 1
        rate_limit_period_s = 60
    """),
        base_dir=tmp_path,
    )
    rt = Runtime(config, icn_edge, admin_token="adm-token")
    rt.generations = 0
    generate, stream = rt.ai.generate, rt.ai.stream

    async def counted_generate(*args, **kw):
        rt.generations += 1
        return await generate(*args, **kw)

    def counted_stream(*args, **kw):
        rt.generations += 1
        return stream(*args, **kw)

    rt.ai.generate, rt.ai.stream = counted_generate, counted_stream
    yield rt
    rt.gateways.close()
    rt.state.close()
    rt.bindings.close()


@pytest.fixture
def client(runtime):
    return TestClient(create_app(runtime))


def token_for(client, name):
    r = client.post("/cdn-cgi/edge/accounts", json={"name": name}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return {"authorization": f"Bearer {r.json()['token']['token']}"}


def door(account, gateway="gw"):
    return f"/cdn-cgi/ai-gateway/v1/{account}/{gateway}"


def test_a_workers_ai_call_through_the_gateway_is_cached_and_logged(client, runtime):
    me = token_for(client, "shop")
    headers = {**me, "cf-aig-cache-ttl": "60", "cf-aig-metadata": '{"user": "ada"}'}
    base = runtime.gateways.url("shop", "gw", "workers-ai", "http://testserver")  # getUrl's answer
    assert base == "http://testserver/cdn-cgi/ai-gateway/v1/shop/gw/workers-ai"
    first = client.post(f"{base}/{TINY_MODEL}", json=ASK, headers=headers)
    assert first.status_code == 200, first.text
    assert first.headers["cf-aig-cache-status"] == "MISS" and runtime.generations == 1
    again = client.post(f"{door('shop')}/workers-ai/{TINY_MODEL}", json=ASK, headers=headers)
    assert again.headers["cf-aig-cache-status"] == "HIT" and runtime.generations == 1
    assert again.json()["result"] == first.json()["result"] and again.json()["success"] is True
    log_id = again.headers["cf-aig-log-id"]
    logs = "/client/v4/accounts/shop/ai-gateway/gateways/gw/logs"
    row = client.get(f"{logs}/{log_id}", headers=me).json()["result"]
    assert row["cached"] is True and row["model"] == TINY_MODEL and row["metadata"] == '{"user": "ada"}'
    assert row["request_id"] == again.headers["cf-ai-req-id"]
    patched = client.patch(f"{logs}/{log_id}", json={"score": 80, "feedback": 1}, headers=me)
    assert patched.status_code == 200 and patched.json()["result"]["score"] == 80
    refused = client.patch(f"{logs}/{log_id}", json={"stars": 5}, headers=me)
    assert refused.status_code == 400 and "stars" in refused.json()["errors"][0]["message"]
    listed = client.get(logs, params={"per_page": 5}, headers=me).json()["result"]
    assert [r["id"] for r in listed][0] == log_id and len(listed) == 2


def test_a_stream_through_the_gateway_is_replayed_on_a_hit(client, runtime):
    me = token_for(client, "shop")
    headers = {**me, "cf-aig-cache-ttl": "60"}
    url = f"{door('shop')}/workers-ai/{TINY_MODEL}"
    first = client.post(url, json={**ASK, "stream": True}, headers=headers)
    assert first.headers["cf-aig-cache-status"] == "MISS" and first.text.endswith("data: [DONE]\n\n")
    again = client.post(url, json={**ASK, "stream": True}, headers=headers)
    assert again.headers["cf-aig-cache-status"] == "HIT" and again.text == first.text
    assert runtime.generations == 1


def test_the_openai_compatible_door_answers_in_openais_shape_through_the_cache(client, runtime):
    me = token_for(client, "shop")
    body = {
        "model": f"workers-ai/{TINY_MODEL}",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    url = f"{door('shop')}/compat/chat/completions"
    first = client.post(url, json=body, headers={**me, "cf-aig-cache-ttl": "60"})
    assert first.status_code == 200, first.text
    assert first.json()["object"] == "chat.completion" and first.headers["cf-aig-cache-status"] == "MISS"
    again = client.post(url, json=body, headers={**me, "cf-aig-cache-ttl": "60"})
    assert again.headers["cf-aig-cache-status"] == "HIT" and again.json() == first.json()
    assert runtime.generations == 1
    elsewhere = client.post(url, json={**body, "model": "openai/gpt-4o"}, headers=me)
    assert elsewhere.status_code == 400 and "cannot be reached from this edge" in elsewhere.text


def test_a_token_acts_only_for_its_own_accounts_gateway(client, runtime):
    mine, theirs = token_for(client, "shop"), token_for(client, "other")
    url = f"{door('shop')}/workers-ai/{TINY_MODEL}"
    made = client.post(url, json=ASK, headers={**mine, "cf-aig-cache-ttl": "60"})
    assert client.post(url, json=ASK, headers=theirs).status_code == 403
    assert client.post(url, json=ASK).status_code == 401
    log = f"/client/v4/accounts/shop/ai-gateway/gateways/gw/logs/{made.headers['cf-aig-log-id']}"
    assert client.get(log, headers=theirs).status_code == 403
    # under its own account, the same gateway id holds neither the entry nor the log
    own = client.post(
        f"{door('other')}/workers-ai/{TINY_MODEL}", json=ASK, headers={**theirs, "cf-aig-cache-ttl": "60"}
    )
    assert own.headers["cf-aig-cache-status"] == "MISS" and runtime.generations == 2
    log = f"/client/v4/accounts/other/ai-gateway/gateways/gw/logs/{made.headers['cf-aig-log-id']}"
    assert client.get(log, headers=theirs).status_code == 404


def test_over_a_gateways_rate_limit_the_door_answers_429_with_retry_after(client, runtime):
    me = token_for(client, "shop")
    url = f"{door('shop', 'limited')}/workers-ai/{TINY_MODEL}"
    assert client.post(url, json=ASK, headers=me).status_code == 200
    limited = client.post(url, json=ASK, headers=me)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    error = limited.json()["errors"][0]
    assert error["code"] == 2003 and error["message"].startswith("Rate limited")


def test_bad_headers_are_refused_naming_them(client):
    me = token_for(client, "shop")
    r = client.post(
        f"{door('shop')}/workers-ai/{TINY_MODEL}", json=ASK, headers={**me, "cf-aig-cache-ttl": "soon"}
    )
    assert r.status_code == 400 and "cf-aig-cache-ttl" in r.text


def test_edge_gateway_logs_lists_them(client, runtime, monkeypatch, capsys, tmp_path):
    import httpx

    from runtime.cli.gateway import cmd_gateway

    me = token_for(client, "shop")
    made = client.post(f"{door('shop')}/workers-ai/{TINY_MODEL}", json=ASK, headers=me)
    monkeypatch.setenv("EDGE_API_TOKEN", me["authorization"].removeprefix("Bearer "))

    def through_app(method, url, **kw):  # the CLI's HTTP calls, answered by the app in-process
        kw.pop("timeout", None)
        return client.request(method, httpx.URL(url).raw_path.decode(), **kw)

    monkeypatch.setattr(httpx, "request", through_app)
    (tmp_path / "wrangler.toml").write_text(
        'name = "gateways"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n'
    )
    args = types.SimpleNamespace(
        gateway="gw",
        account="shop",
        limit=10,
        json=True,
        config=str(tmp_path / "wrangler.toml"),
        url="http://127.0.0.1:8787",
    )
    assert cmd_gateway(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [made.headers["cf-aig-log-id"]]
    args.json = False
    assert cmd_gateway(args) == 0
    out = capsys.readouterr().out
    assert made.headers["cf-aig-log-id"] in out and TINY_MODEL in out and " ok " in out
    args.account = "other"  # a token of shop's cannot list another account's gateway
    assert cmd_gateway(args) == 2
    assert "another account" in capsys.readouterr().err


def test_edge_tail_names_the_gateway_log_and_cache_of_an_ai_call():
    from runtime.cli.control import _pretty

    event = {
        "outcome": "ok",
        "eventTimestamp": 0,
        "event": {"request": {"method": "GET", "url": "http://x/"}, "response": {"status": 200}},
        "ai": [
            {
                "model": TINY_MODEL,
                "requestId": "r",
                "gateway": "gw",
                "gatewayLogId": "abc",
                "cacheStatus": "HIT",
            }
        ],
    }
    assert f"  (ai) {TINY_MODEL} via gateway gw: log abc, cache HIT" in _pretty(event).splitlines()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('rate_limit_technique = "leaky"', r"edge\.ai_gateways\.shop\.rate_limit_technique: give"),
        ('cache_ttl = "soon"', r"edge\.ai_gateways\.shop.*cache_ttl"),
        ("collect_log = false", r"edge\.ai_gateways\.shop.*collect_log"),
    ],
)
def test_a_gateways_config_is_typed_and_checked_naming_the_key(table, message):
    from runtime.control.config import ConfigError

    good = 'name = "w"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n'
    with pytest.raises(ConfigError, match=message):
        parse_config(good + "[edge.ai_gateways.shop]\n" + table + "\n")
    fixed = parse_config(good + '[edge.ai_gateways.shop]\nrate_limit = 5\nrate_limit_technique = "fixed"\n')
    assert fixed.edge.ai_gateways["shop"].rate_limit_technique == "fixed"
