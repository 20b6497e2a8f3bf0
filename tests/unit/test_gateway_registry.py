"""AI Gateway's gateways per account (runtime.ai.gateway_registry through runtime.ai.gateway.Gateways):
made on first use, declared in the config, or created through the API, each account's its own; a
created gateway's settings (retries, its log cap, collect_logs) applied to the calls through it and
kept across a restart; a declared one refused to change; a delete takes its logs and cached answers;
the API's fields read as Cloudflare's, each refusal naming its field; a failed call names its log."""

from __future__ import annotations

import pytest

from runtime.ai.gateway_options import GatewaySettings, RetryOptions
from runtime.ai.gateway_registry import GatewayDeclared, GatewayExists
from tests.unit.gateway_fakes import CountingAI, call, close_gateways, make_gateways, opts, run
from workers import AIError


@pytest.fixture
def gw(tmp_path):
    g = make_gateways(tmp_path, settings={"declared": GatewaySettings(cache_ttl=60)})
    yield g
    close_gateways(g)


def names(gw, account: str) -> list[str]:
    return sorted(g.id for g in run(gw.list_gateways(account, None, 1, 50))[0])


def test_gateways_come_from_first_use_the_config_and_the_api_each_accounts_own(gw):
    run(gw.run(call("a"), opts()))  # gateway "gw": made on its first call
    assert names(gw, "a") == ["declared", "gw"]
    gw.clock.now += 1
    run(gw.create_gateway("a", "made", GatewaySettings(cache_ttl=5)))
    assert names(gw, "a") == ["declared", "gw", "made"]
    assert names(gw, "b") == ["declared"]  # the config's gateway is every account's; the rest are not
    with pytest.raises(LookupError):
        run(gw.get_gateway("b", "made"))
    assert run(gw.get_gateway("a", "declared")).settings.cache_ttl == 60
    found, total = run(gw.list_gateways("a", "de", 1, 1))
    assert total == 2 and [g.id for g in found] == ["made"]  # newest first, one a page
    assert [g.id for g in run(gw.list_gateways("a", "de", 2, 1))[0]] == ["declared"]


def test_a_declared_gateway_is_the_files_and_an_existing_id_is_not_created_again(gw):
    with pytest.raises(GatewayDeclared, match=r"wrangler-like.toml \(\[edge.ai_gateways.declared\]\)"):
        run(gw.update_gateway("a", "declared", GatewaySettings()))
    with pytest.raises(GatewayDeclared):
        run(gw.delete_gateway("a", "declared"))
    with pytest.raises(GatewayExists):
        run(gw.create_gateway("a", "declared", GatewaySettings()))
    run(gw.create_gateway("a", "mine", GatewaySettings()))
    with pytest.raises(GatewayExists):
        run(gw.create_gateway("a", "mine", GatewaySettings()))
    run(gw.create_gateway("b", "mine", GatewaySettings()))  # another account's id is its own
    with pytest.raises(LookupError):
        run(gw.update_gateway("a", "nobody", GatewaySettings()))


def test_a_created_gateways_retries_and_log_cap_apply_and_outlive_a_restart(tmp_path):
    gw = make_gateways(tmp_path, ai=CountingAI(fail=[3040]))
    settings = GatewaySettings(retries=RetryOptions(2, 10, "constant"), log_rows=2)
    run(gw.create_gateway("a", "shop", settings))
    through = run(gw.run(call("a"), opts(id="shop")))  # the first attempt fails, the gateway retries
    assert gw.ai.calls == 2 and gw.sleep.waited == [0.01]
    for _ in range(3):
        run(gw.run(call("a"), opts(id="shop")))
    rows = run(gw.logs("a", "shop"))
    assert len(rows) == 2 and through.log_id not in [r["id"] for r in rows]  # its newest two kept
    created = run(gw.get_gateway("a", "shop")).created
    close_gateways(gw)
    again = make_gateways(tmp_path)
    try:
        kept = run(again.get_gateway("a", "shop"))
        assert kept.settings == settings and kept.created == created
    finally:
        close_gateways(again)


def test_an_update_applies_at_once_and_a_delete_takes_the_logs_and_cache(gw):
    run(gw.create_gateway("a", "shop", GatewaySettings(cache_ttl=60)))
    first = run(gw.run(call("a"), opts(id="shop")))
    assert run(gw.run(call("a"), opts(id="shop"))).cache_status == "HIT"
    run(gw.update_gateway("a", "shop", GatewaySettings(cache_ttl=60, collect_logs=False)))
    assert run(gw.run(call("a"), opts(id="shop"))).cache_status == "HIT"  # kept: not invalidated
    run(gw.update_gateway("a", "shop", GatewaySettings(cache_ttl=60, cache_invalidate_on_update=True)))
    assert run(gw.run(call("a"), opts(id="shop"))).cache_status == "MISS"
    assert len(run(gw.logs("a", "shop"))) == 3  # the call while collect_logs was off left no row
    gone = run(gw.delete_gateway("a", "shop"))
    assert gone.id == "shop" and run(gw.logs("a", "shop")) == []
    with pytest.raises(LookupError):
        run(gw.get_log("a", "shop", first.log_id))
    again = run(gw.run(call("a"), opts(id="shop")))  # made again on first use, with the defaults
    assert again.cache_status is None and run(gw.get_gateway("a", "shop")).settings == GatewaySettings()


def test_a_failed_call_names_the_log_row_that_kept_it(tmp_path):
    gw = make_gateways(tmp_path, ai=CountingAI(fail=[5007]))
    try:
        with pytest.raises(AIError) as err:
            run(gw.run(call("a"), opts()))
        row = run(gw.get_log("a", "gw", err.value.log_id))
        assert row["success"] is False and row["status_code"] == 400
    finally:
        close_gateways(gw)


def test_the_apis_fields_read_as_cloudflares_and_answer_back():
    body = {
        "cache_ttl": 30,
        "cache_invalidate_on_update": True,
        "collect_logs": False,
        "rate_limiting_interval": 10,
        "rate_limiting_limit": 5,
        "rate_limiting_technique": "fixed",
        "retry_max_attempts": 3,
        "retry_delay": 100,
        "retry_backoff": "exponential",
        "log_management": 500,
        "log_management_strategy": "STOP_INSERTING",
        "authentication": True,
        "logpush": False,
        "dlp": {"enabled": False, "policies": []},
        "workers_ai_billing_mode": "postpaid",
    }
    settings = GatewaySettings.from_api(body)
    assert settings.retries == RetryOptions(3, 100, "exponential") and settings.rate_limit_period_s == 10
    answered = settings.to_api()
    assert {k: answered[k] for k in body if k not in ("dlp",)} == {
        k: v for k, v in body.items() if k != "dlp"
    }
    assert GatewaySettings.from_json(settings.to_json()) == settings
    assert GatewaySettings.from_api({"rate_limiting_limit": 0}).rate_limit is None  # 0, as null: none


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cache_ttl": -1}, "cache_ttl"),
        ({"cache_ttl": "60"}, "cache_ttl"),
        ({"collect_logs": 1}, "collect_logs"),
        ({"rate_limiting_limit": 2_000_000}, "rate_limiting_limit"),
        ({"rate_limiting_interval": 0}, "rate_limiting_interval"),
        ({"rate_limiting_technique": "leaky"}, "rate_limiting_technique"),
        ({"retry_max_attempts": 6}, "retry_max_attempts"),
        ({"retry_backoff": "random"}, "retry_backoff"),
        ({"log_management": 10**9}, "log_management"),
        ({"log_management_strategy": "KEEP"}, "log_management_strategy"),
        ({"logpush": True}, "logpush"),
        ({"guardrails": {"prompt": {}, "response": {}}}, "guardrails"),
        ({"workers_ai_billing_mode": "unified"}, "workers_ai_billing_mode"),
        ({"stars": 5}, "stars"),
    ],
)
def test_a_field_that_does_not_read_is_refused_naming_it(body, field):
    with pytest.raises(AIError) as err:
        GatewaySettings.from_api(body)
    assert err.value.param == field and err.value.detail.startswith(f"{field}: ")


def test_an_account_holds_at_most_max_gateways_of_its_own(gw, monkeypatch):
    """A tenant naming ever new gateway ids (by call or by create) stops at the cap; another account,
    the declared gateway and the ones it has still serve; a delete makes room."""
    monkeypatch.setattr("runtime.ai.gateway_registry.MAX_GATEWAYS", 2)
    run(gw.run(call("a"), opts()))  # "gw", made on first use
    run(gw.create_gateway("a", "made", GatewaySettings()))
    with pytest.raises(AIError) as err:
        run(gw.run(call("a"), opts(id="third")))
    assert err.value.code == 5004 and "has 2 AI Gateways" in err.value.detail
    with pytest.raises(AIError):
        run(gw.create_gateway("a", "fourth", GatewaySettings()))
    run(gw.run(call("a"), opts()))  # the gateways it has still take calls
    run(gw.run(call("a"), opts(id="declared")))
    run(gw.run(call("b"), opts(id="third")))  # another account's room is its own
    run(gw.delete_gateway("a", "made"))
    run(gw.run(call("a"), opts(id="third")))
    assert names(gw, "a") == ["declared", "gw", "third"]
