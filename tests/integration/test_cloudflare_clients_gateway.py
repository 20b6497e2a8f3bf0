"""AI Gateway through Cloudflare's own `cloudflare` SDK, unmodified (sync and async), against a real
`edge dev`: the log list ends under the SDK's auto-pagination, each row once, filtered and ordered as
LogListParams says, its rows of the SDK's types (parsed with warnings as errors); a log read, edited,
and its request and response bodies; gateways listed, created, updated and deleted, a created one's
settings applied to the calls through it and kept across a restart, a declared one refused; the
gateway's URL per provider; another account's gateways out of reach; refusals as the SDK's
exceptions, each naming the parameter. One server for the module (restarted once, at the end)."""

from __future__ import annotations

import asyncio
import copy
import json
import textwrap
import warnings
from datetime import UTC, datetime, timedelta
from itertools import islice

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

cloudflare = pytest.importorskip("cloudflare")
pytestmark = pytest.mark.slow
MODEL = "@edge/moonshotai/kimi-k2-mini"
ACCOUNT = "local"
GW = "gw1"

WORKER = """
from workers import Response

async def on_fetch(request, env):
    return Response("ok")
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    d = tmp_path_factory.mktemp("cf-gateway")
    (d / "worker.py").write_text(textwrap.dedent(WORKER))
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "cf-gateway"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge]
        pops = ["ICN"]
        models = ["{MODEL}"]
        models_dir = "{REPO / "models"}"
        [edge.ai_gateways.declared]
        cache_ttl = 60
    """)
    )
    return d


@pytest.fixture(scope="module")
def srv(project):
    server = DevServer(project / "wrangler-like.toml", cwd=project)
    server.__enter__()
    server.token = (project / ".edge" / "api-token").read_text().strip()
    admin = (project / ".edge" / "admin-token").read_text().strip()
    server.other_token = server.create_account(admin)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(srv):
    return cloudflare.Cloudflare(api_token=srv.token, base_url=f"{srv.url}/client/v4", max_retries=0)


def door(srv, gateway=GW, account=ACCOUNT) -> str:
    return f"{srv.url}/cdn-cgi/ai-gateway/v1/{account}/{gateway}"


def call(srv, gateway=GW, body=None, headers=None, token=None) -> httpx.Response:
    """A Workers AI call through the gateway's door (two tokens at most: cheap)."""
    return httpx.post(
        f"{door(srv, gateway)}/workers-ai/{MODEL}",
        json=body or {"prompt": "hi", "max_tokens": 2},
        headers={"authorization": f"Bearer {token or srv.token}", **(headers or {})},
        timeout=120,
    )


@pytest.fixture(scope="module")
def logged(srv):
    """The calls logged in gateway gw1, by what they were: three with metadata (user u0..u2), one
    cache hit of the first, a stream, an OpenAI-compatible one, and one failing (no such model)."""
    calls = {}
    for i in range(3):
        body = {"prompt": f"hello {i}", "max_tokens": 2}
        meta = {"cf-aig-metadata": json.dumps({"user": f"u{i}", "n": i}), "cf-aig-cache-ttl": "60"}
        calls[f"u{i}"] = (body, call(srv, body=body, headers=meta))
    calls["hit"] = (calls["u0"][0], call(srv, body=calls["u0"][0], headers={"cf-aig-cache-ttl": "60"}))
    stream = {"prompt": "stream", "max_tokens": 2, "stream": True}
    calls["stream"] = (stream, call(srv, body=stream))
    chat = {"model": f"workers-ai/{MODEL}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    compat = httpx.post(
        f"{door(srv)}/compat/chat/completions",
        json=chat,
        headers={"authorization": f"Bearer {srv.token}"},
        timeout=120,
    )
    calls["compat"] = (chat, compat)
    bad = {"prompt": "x", "max_tokens": 2}
    failed = httpx.post(
        f"{door(srv)}/workers-ai/@cf/nobody/no-such-model",
        json=bad,
        headers={"authorization": f"Bearer {srv.token}"},
        timeout=120,
    )
    calls["failed"] = (bad, failed)
    assert calls["hit"][1].headers["cf-aig-cache-status"] == "HIT"
    assert failed.status_code == 400 and all(
        r.status_code == 200 for k, (_, r) in calls.items() if k != "failed"
    )
    return {name: (body, r.headers["cf-aig-log-id"], r) for name, (body, r) in calls.items()}


def ids(rows) -> list[str]:
    return [r.id for r in rows]


def test_the_sdks_auto_pagination_lists_every_row_once_and_ends(client, logged):
    # islice: a list that never ends (page ignored) would repeat rows instead of hanging the test
    rows = list(islice(client.ai_gateway.logs.list(GW, account_id=ACCOUNT, per_page=2), 50))
    assert sorted(ids(rows)) == sorted(log_id for _, log_id, _ in logged.values())
    assert ids(rows)[0] == logged["failed"][1]  # newest first
    first = client.ai_gateway.logs.with_raw_response.list(GW, account_id=ACCOUNT, per_page=3).json()
    assert first["result_info"] == {"page": 1, "per_page": 3, "count": 3, "total_count": len(logged)}
    default = client.ai_gateway.logs.list(GW, account_id=ACCOUNT)
    assert len(default.result) == len(logged) and default.result_info.per_page == 20
    past = client.ai_gateway.logs.list(GW, account_id=ACCOUNT, page=9, per_page=2)
    assert past.result == [] and not past.has_next_page()
    oldest = list(
        islice(client.ai_gateway.logs.list(GW, account_id=ACCOUNT, direction="asc", per_page=4), 50)
    )
    assert ids(oldest) == ids(rows)[::-1]


def test_a_rows_fields_are_of_the_sdks_types_and_parse_without_a_warning(client, logged):
    from cloudflare.types.ai_gateway import LogListResponse

    raw = client.ai_gateway.logs.with_raw_response.list(GW, account_id=ACCOUNT, per_page=50).json()["result"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        page = client.ai_gateway.logs.list(GW, account_id=ACCOUNT, per_page=50)
        for row in page.result:
            row.to_dict(), row.to_json()  # pydantic's serializer warns of a field not of its type
        for entry in raw:
            LogListResponse.model_validate(entry).to_dict()
    by_id = {r.id: r for r in page.result}
    for entry in raw:
        assert type(entry["duration"]) is int and type(entry["status_code"]) is int
        assert type(entry["step"]) is int and isinstance(entry["cost"], float)
        assert datetime.fromisoformat(entry["created_at"]).tzinfo is not None
        assert entry["metadata"] is None or isinstance(entry["metadata"], str)
    u1 = by_id[logged["u1"][1]]
    assert isinstance(u1.created_at, datetime) and isinstance(u1.duration, int)
    assert json.loads(u1.metadata) == {"user": "u1", "n": 1} and 1 <= u1.tokens_out <= 2
    assert by_id[logged["hit"][1]].cached is True and by_id[logged["failed"][1]].status_code == 400
    assert by_id[logged["stream"][1]].response_content_type == "text/event-stream"


def flt(key: str, operator: str, *value) -> dict:
    """One of LogListParams' `filters`."""
    return {"key": key, "operator": operator, "value": list(value)}


GENERATED = ["u0", "u1", "u2", "stream", "compat"]  # the calls a model answered (not cached, not failed)
FILTERS = [
    ("success false", {"success": False}, ["failed"]),
    ("cached", {"cached": True}, ["hit"]),
    ("model", {"model": "@cf/nobody/no-such-model"}, ["failed"]),
    ("provider", {"provider": "elsewhere"}, []),
    ("search in metadata", {"search": '"u2"'}, ["u2"]),
    ("min_tokens_in", {"min_tokens_in": 1, "success": True, "cached": False}, GENERATED),
    ("max_total_tokens", {"max_total_tokens": 0}, ["failed"]),
    ("min_duration", {"min_duration": 0, "max_cost": 0}, None),
    ("response_content_type", {"response_content_type": "text/event-stream"}, ["stream"]),
    ("filters eq, values any", {"filters": [flt("metadata.value", "eq", "u0", "u2")]}, ["u0", "u2"]),
    ("filters neq", {"filters": [flt("success", "neq", True)]}, ["failed"]),
    ("filters contains", {"filters": [flt("model", "contains", "no-such")]}, ["failed"]),
    ("filters metadata.key", {"filters": [flt("metadata.key", "eq", "n")]}, ["u0", "u1", "u2"]),
    ("filters compatibilityMode", {"filters": [flt("compatibilityMode", "eq", True)]}, ["compat"]),
    (
        "filters gt and lt",
        {"filters": [flt("tokens_out", "gt", 0), flt("tokens_in", "lt", 10_000)], "cached": False},
        GENERATED,
    ),
    ("filters id", {"filters": [flt("id", "eq", "@u1")]}, ["u1"]),
    ("filters event_id null", {"filters": [flt("event_id", "eq", None)]}, None),
]


@pytest.mark.parametrize(("params", "want"), [f[1:] for f in FILTERS], ids=[f[0] for f in FILTERS])
def test_each_filter_selects_its_rows_in_sql(client, logged, params, want):
    params = copy.deepcopy(params)
    for f in params.get("filters", []):  # "@name": the log id of the fixture's call of that name
        f["value"] = [logged[v[1:]][1] if isinstance(v, str) and v.startswith("@") else v for v in f["value"]]
    rows = list(islice(client.ai_gateway.logs.list(GW, account_id=ACCOUNT, per_page=3, **params), 50))
    want_ids = [log_id for _, log_id, _ in logged.values()] if want is None else [logged[w][1] for w in want]
    assert sorted(ids(rows)) == sorted(want_ids)


def test_dates_order_and_meta_info(client, logged):
    now = datetime.now(UTC)
    listed = lambda **kw: list(islice(client.ai_gateway.logs.list(GW, account_id=ACCOUNT, **kw), 50))  # noqa: E731
    assert len(listed(start_date=now - timedelta(hours=1), end_date=now + timedelta(minutes=5))) == len(
        logged
    )
    assert (
        listed(start_date=now + timedelta(minutes=5)) == []
        and listed(end_date=now - timedelta(hours=1)) == []
    )
    by_model = listed(order_by="model", order_by_direction="asc", per_page=2)
    assert [r.model for r in by_model] == sorted(r.model for r in by_model)
    assert by_model[0].model == "@cf/nobody/no-such-model"
    same_model = [r.id for r in by_model if r.model == MODEL]
    assert same_model == sorted(same_model)  # ties in the order: by id, the same way
    info = client.ai_gateway.logs.with_raw_response.list(GW, account_id=ACCOUNT, meta_info=True).json()
    info = info["result_info"]
    assert 1 <= info["min_tokens_out"] <= info["max_tokens_out"] <= 2 and info["min_cost"] == 0
    assert info["total_count"] == len(logged) and isinstance(info["max_duration"], int)


BAD = [
    ({"order_by": "bogus"}, "order_by"),
    ({"per_page": 0}, "per_page"),
    ({"per_page": 51}, "per_page"),
    ({"page": 0}, "page"),
    ({"order_by_direction": "sideways"}, "order_by_direction"),
    ({"start_date": "yesterday"}, "start_date"),
    ({"min_cost": "cheap"}, "min_cost"),
    ({"feedback": 7}, "feedback"),
    ({"filters": [{"key": "bogus", "operator": "eq", "value": ["x"]}]}, "filters.0.key"),
    ({"filters": [{"key": "model", "operator": "lt", "value": ["x"]}]}, "filters.0.operator"),
    ({"filters": [{"key": "cost", "operator": "gt", "value": [1, 2]}]}, "filters.0.value"),
    ({"extra_query": {"surprise": "1"}}, "surprise"),
]


@pytest.mark.parametrize(("params", "name"), BAD, ids=[n for _, n in BAD])
def test_a_value_that_does_not_read_is_a_400_naming_the_parameter(client, logged, params, name):
    with pytest.raises(cloudflare.BadRequestError) as err:
        client.ai_gateway.logs.list(GW, account_id=ACCOUNT, **params)
    (error,) = err.value.body["errors"]
    assert error["code"] == 10014 and error["message"].startswith(f"{name}: ")


def test_a_log_is_read_edited_and_its_bodies_answered(client, logged):
    body, log_id, answered = logged["u1"]
    got = client.ai_gateway.logs.get(log_id, account_id=ACCOUNT, gateway_id=GW)
    assert got.id == log_id and got.request_size == len(answered.request.content)
    assert got.request_head_complete is True and json.loads(got.request_head) == body
    client.ai_gateway.logs.edit(
        log_id, account_id=ACCOUNT, gateway_id=GW, score=90, feedback=1, metadata={"k": "v"}
    )
    again = client.ai_gateway.logs.get(log_id, account_id=ACCOUNT, gateway_id=GW)
    assert json.loads(again.metadata) == {"k": "v"} and again.to_dict()["score"] == 90
    assert ids(client.ai_gateway.logs.list(GW, account_id=ACCOUNT, feedback=1).result) == [log_id]
    # what was sent and what was answered, as they were
    assert client.ai_gateway.logs.request(log_id, account_id=ACCOUNT, gateway_id=GW) == body
    assert (
        client.ai_gateway.logs.response(log_id, account_id=ACCOUNT, gateway_id=GW)
        == answered.json()["result"]
    )
    chat, compat_id, compat = logged["compat"]
    assert client.ai_gateway.logs.request(compat_id, account_id=ACCOUNT, gateway_id=GW) == chat
    assert client.ai_gateway.logs.response(compat_id, account_id=ACCOUNT, gateway_id=GW) == compat.json()
    _, stream_id, streamed = logged["stream"]  # a stream's answer: the events as they streamed
    assert client.ai_gateway.logs.response(stream_id, account_id=ACCOUNT, gateway_id=GW) == streamed.text
    _, failed_id, failed = logged["failed"]
    assert client.ai_gateway.logs.response(failed_id, account_id=ACCOUNT, gateway_id=GW) == failed.json()
    with pytest.raises(cloudflare.NotFoundError):
        client.ai_gateway.logs.get("no-such-log", account_id=ACCOUNT, gateway_id=GW)
    with pytest.raises(cloudflare.BadRequestError) as err:
        client.ai_gateway.logs.edit(log_id, account_id=ACCOUNT, gateway_id=GW, score=101)
    assert "score" in err.value.body["errors"][0]["message"]


def settings(**kw):
    """create / update's required fields (the SDK requires them), then `kw`."""
    base = {
        "cache_invalidate_on_update": False,
        "cache_ttl": None,
        "collect_logs": True,
        "rate_limiting_interval": None,
        "rate_limiting_limit": None,
    }
    return {**base, **kw}


def test_a_created_gateways_settings_apply_to_the_calls_through_it(client, srv, logged):
    made = client.ai_gateway.create(
        account_id=ACCOUNT,
        id="made",
        **settings(cache_ttl=60, rate_limiting_interval=60, rate_limiting_limit=3),
    )
    assert (made.id, made.cache_ttl, made.rate_limiting_limit, made.rate_limiting_interval) == (
        "made",
        60,
        3,
        60,
    )
    assert isinstance(made.created_at, datetime) and made.collect_logs is True
    first, second = call(srv, "made"), call(srv, "made")
    assert first.headers["cf-aig-cache-status"] == "MISS" and second.headers["cf-aig-cache-status"] == "HIT"
    call(srv, "made", body={"prompt": "other", "max_tokens": 2})
    limited = call(srv, "made", body={"prompt": "fourth", "max_tokens": 2})
    assert limited.status_code == 429 and limited.json()["errors"][0]["code"] == 2003
    assert len(client.ai_gateway.logs.list("made", account_id=ACCOUNT).result) == 4  # the refusal too

    quiet = client.ai_gateway.update(
        "made",
        account_id=ACCOUNT,
        **settings(cache_ttl=60, collect_logs=False, cache_invalidate_on_update=True),
    )
    assert (
        quiet.collect_logs is False
        and quiet.rate_limiting_limit is None
        and quiet.modified_at >= made.modified_at
    )
    after = call(srv, "made")  # no limit now, the cache dropped by the update, nothing logged
    assert after.status_code == 200 and after.headers["cf-aig-cache-status"] == "MISS"
    assert len(client.ai_gateway.logs.list("made", account_id=ACCOUNT).result) == 4
    assert client.ai_gateway.get("made", account_id=ACCOUNT).collect_logs is False

    with pytest.raises(cloudflare.ConflictError):
        client.ai_gateway.create(account_id=ACCOUNT, id="made", **settings())
    with pytest.raises(cloudflare.BadRequestError) as err:
        client.ai_gateway.create(account_id=ACCOUNT, id="x", **settings(rate_limiting_technique="leaky"))
    assert err.value.body["errors"][0]["message"].startswith("rate_limiting_technique: ")
    with pytest.raises(cloudflare.BadRequestError) as err:
        client.ai_gateway.create(account_id=ACCOUNT, id="y", **settings(logpush=True))
    assert err.value.body["errors"][0]["message"].startswith("logpush: ")


def test_the_list_holds_gateways_made_on_first_use_declared_and_created(client, srv, logged):
    listed = {g.id: g for g in client.ai_gateway.list(account_id=ACCOUNT, per_page=1)}
    assert {GW, "declared", "made"} <= set(listed) and listed["declared"].cache_ttl == 60
    assert ids(client.ai_gateway.list(account_id=ACCOUNT, search="decl")) == ["declared"]
    assert client.ai_gateway.get(GW, account_id=ACCOUNT).collect_logs is True  # made by its first call
    for change in (
        lambda: client.ai_gateway.update("declared", account_id=ACCOUNT, **settings()),
        lambda: client.ai_gateway.delete("declared", account_id=ACCOUNT),
        lambda: client.ai_gateway.create(account_id=ACCOUNT, id="declared", **settings()),
    ):
        with pytest.raises(cloudflare.ConflictError) as err:
            change()
        assert "wrangler-like.toml" in err.value.body["errors"][0]["message"]


def test_another_accounts_gateways_are_never_listed_or_reached(client, srv, logged):
    theirs = cloudflare.Cloudflare(api_token=srv.other_token, base_url=f"{srv.url}/client/v4", max_retries=0)
    assert {g.id for g in theirs.ai_gateway.list(account_id="other")} == {"declared"}
    with pytest.raises(cloudflare.NotFoundError):
        theirs.ai_gateway.get("made", account_id="other")
    assert theirs.ai_gateway.logs.list(GW, account_id="other").result == []
    with pytest.raises(cloudflare.NotFoundError):
        theirs.ai_gateway.logs.get(logged["u0"][1], account_id="other", gateway_id=GW)
    for reach in (
        lambda: theirs.ai_gateway.get(GW, account_id=ACCOUNT),
        lambda: theirs.ai_gateway.logs.list(GW, account_id=ACCOUNT),
        lambda: theirs.ai_gateway.logs.request(logged["u0"][1], account_id=ACCOUNT, gateway_id=GW),
        lambda: theirs.ai_gateway.delete("made", account_id=ACCOUNT),
    ):
        with pytest.raises(cloudflare.PermissionDeniedError):
            reach()
    nobody = cloudflare.Cloudflare(api_token="not-a-token", base_url=f"{srv.url}/client/v4", max_retries=0)
    with pytest.raises(cloudflare.AuthenticationError):
        nobody.ai_gateway.list(account_id=ACCOUNT)


def test_a_gateways_url_is_its_door_for_the_provider(client, srv, logged):
    for provider in ("workers-ai", "compat"):
        url = client.ai_gateway.urls.get(provider, gateway_id=GW, account_id=ACCOUNT)
        assert url == f"{door(srv)}/{provider}"
    assert (
        httpx.post(  # the URL answers: a call through it is logged in the gateway
            f"{client.ai_gateway.urls.get('workers-ai', gateway_id='urls', account_id=ACCOUNT)}/{MODEL}",
            json={"prompt": "u", "max_tokens": 2},
            headers={"authorization": f"Bearer {srv.token}"},
            timeout=120,
        ).status_code
        == 200
    )
    assert len(client.ai_gateway.logs.list("urls", account_id=ACCOUNT).result) == 1
    with pytest.raises(cloudflare.BadRequestError) as err:
        client.ai_gateway.urls.get("openai", gateway_id=GW, account_id=ACCOUNT)
    message = err.value.body["errors"][0]["message"]
    assert "'openai'" in message and "workers-ai" in message and "compat" in message


def test_the_async_client_pages_reads_and_changes_the_same(srv, logged):
    async def go():
        aclient = cloudflare.AsyncCloudflare(
            api_token=srv.token, base_url=f"{srv.url}/client/v4", max_retries=0
        )
        rows = []
        async for row in aclient.ai_gateway.logs.list(GW, account_id=ACCOUNT, per_page=2):
            rows.append(row)
            if len(rows) > 50:  # a list that never ends repeats its rows: the test fails, not hangs
                break
        made = await aclient.ai_gateway.create(account_id=ACCOUNT, id="async-made", **settings(cache_ttl=5))
        got = await aclient.ai_gateway.get("async-made", account_id=ACCOUNT)
        url = await aclient.ai_gateway.urls.get("compat", gateway_id=GW, account_id=ACCOUNT)
        body = await aclient.ai_gateway.logs.request(logged["u2"][1], account_id=ACCOUNT, gateway_id=GW)
        gone = await aclient.ai_gateway.delete("async-made", account_id=ACCOUNT)
        try:
            await aclient.ai_gateway.get("async-made", account_id=ACCOUNT)
        except cloudflare.NotFoundError:
            missing = True
        return rows, made, got, url, body, gone, missing

    rows, made, got, url, body, gone, missing = asyncio.run(go())
    assert sorted(ids(rows)) == sorted(log_id for _, log_id, _ in logged.values())
    assert made.cache_ttl == got.cache_ttl == gone.cache_ttl == 5 and missing
    assert url == f"{door(srv)}/compat" and body == logged["u2"][0]


def test_gateways_and_logs_survive_a_restart_and_a_delete_takes_its_logs(client, srv, project, logged):
    """Last: it restarts the module's server (on the same port, so the clients still reach it)."""
    kept = client.ai_gateway.create(
        account_id=ACCOUNT,
        id="kept",
        **settings(cache_ttl=30, rate_limiting_limit=9, rate_limiting_interval=60),
    )
    srv.stop()
    again = DevServer(project / "wrangler-like.toml", cwd=project, port=srv.port)
    with again:
        got = client.ai_gateway.get("kept", account_id=ACCOUNT)
        assert (got.cache_ttl, got.rate_limiting_limit, got.created_at) == (30, 9, kept.created_at)
        rows = list(islice(client.ai_gateway.logs.list(GW, account_id=ACCOUNT, per_page=50), 50))
        assert len(rows) == len(logged)
        assert (
            client.ai_gateway.logs.request(logged["u0"][1], account_id=ACCOUNT, gateway_id=GW)
            == logged["u0"][0]
        )
        gone = client.ai_gateway.delete(GW, account_id=ACCOUNT)
        assert gone.id == GW
        with pytest.raises(cloudflare.NotFoundError):
            client.ai_gateway.get(GW, account_id=ACCOUNT)
        assert client.ai_gateway.logs.list(GW, account_id=ACCOUNT).result == []
        with pytest.raises(cloudflare.NotFoundError):
            client.ai_gateway.delete(GW, account_id=ACCOUNT)
