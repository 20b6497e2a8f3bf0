"""AI Gateway's logs and rate limit (runtime.ai.gateway): a row per call with what Cloudflare's log
holds (model, provider, status, cached, tokens, duration, tags, metadata, event and request ids),
a stream's row completed when it ends; patchLog as Cloudflare takes it, anything else refused naming
the key; collectLog / collect_logs off skip the row; no account reads another's logs; a configured
gateway's rate limit answers 429 "Rate limited" per account, sliding or fixed."""

from __future__ import annotations

import pytest

from runtime.ai.gateway import GatewayOptions, GatewaySettings
from tests.unit.gateway_fakes import MODEL, call, close_gateways, make_gateways, opts, run, streamed
from workers import AIError


@pytest.fixture
def gw(tmp_path):
    gateways = make_gateways(tmp_path)
    yield gateways
    close_gateways(gateways)


def test_a_call_is_logged_with_what_cloudflares_log_holds(gw):
    out = run(
        gw.run(call(tags=("checkout",), request_id="r-1"), opts(metadata={"user": "ada"}, eventId="e-1"))
    )
    row = run(gw.get_log("acct", "gw", out.log_id))
    assert row["id"] == out.log_id and row["model"] == MODEL and row["provider"] == "workers-ai"
    assert (row["success"], row["status_code"], row["cached"]) == (True, 200, False)
    assert (row["tokens_in"], row["tokens_out"]) == (4, 1)
    assert row["tags"] == ["checkout"] and row["metadata"] == {"user": "ada"}
    assert (row["event_id"], row["request_id"], row["step"]) == ("e-1", "r-1", 0)
    assert row["duration"] >= 0 and row["created_at"] == gw.clock.now
    run(gw.run(call(), opts(cacheTtl=60)))  # a miss, then the hit
    hit = run(gw.run(call(), opts(cacheTtl=60)))
    assert run(gw.get_log("acct", "gw", hit.log_id))["cached"] is True


def test_a_failed_call_is_logged_with_its_error(gw):
    gw.ai.fail = [5004]
    with pytest.raises(AIError):
        run(gw.run(call(), opts()))
    (row,) = run(gw.logs("acct", "gw"))
    assert (row["success"], row["status_code"]) == (False, 400) and "scripted failure" in row["error"]


def test_a_streams_row_is_completed_when_it_ends(gw):
    through, _ = streamed(gw)
    row = run(gw.get_log("acct", "gw", through.log_id))
    assert (
        row["success"] is True and row["stream"] is True and (row["tokens_in"], row["tokens_out"]) == (4, 3)
    )
    gw.ai.fail_mid_stream = True
    through, _ = streamed(gw)
    row = run(gw.get_log("acct", "gw", through.log_id))
    assert row["success"] is False and "went down mid-answer" in row["error"]


def test_patch_log_takes_score_feedback_and_metadata(gw):
    out = run(gw.run(call(), opts()))
    run(gw.patch_log("acct", "gw", out.log_id, {"score": 90, "feedback": 1, "metadata": {"k": "v"}}))
    row = run(gw.get_log("acct", "gw", out.log_id))
    assert (row["score"], row["feedback"], row["metadata"]) == (90, 1, {"k": "v"})
    run(gw.patch_log("acct", "gw", out.log_id, {"feedback": "-1", "score": 12.5}))  # workerd's "-1" too
    row = run(gw.get_log("acct", "gw", out.log_id))
    assert (row["score"], row["feedback"], row["model"]) == (12.5, -1, MODEL)


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"score": 101}, "patchLog: score: a number from 0 to 100"),
        ({"score": True}, "patchLog: score"),
        ({"feedback": 2}, "patchLog: feedback: -1, 0 or 1"),
        ({"metadata": {str(i): i for i in range(6)}}, "patchLog: metadata: expected a dict of at most 5"),
        ({"metadata": {"k": {"deep": 1}}}, "patchLog: metadata.k: a value is a string"),
        ({"mood": 1}, "patchLog: mood: no such field"),
        ({}, "patchLog: give"),
    ],
)
def test_patch_log_refuses_what_cloudflare_does_not_take_naming_the_key(gw, patch, fragment):
    out = run(gw.run(call(), opts()))
    with pytest.raises(AIError, match=f"^5004: {fragment}"):
        run(gw.patch_log("acct", "gw", out.log_id, patch))


def test_collect_log_false_and_a_gateway_without_logs_keep_no_row(tmp_path):
    gw = make_gateways(tmp_path, settings={"quiet": GatewaySettings(collect_logs=False)})
    try:
        skipped = run(gw.run(call(), opts(collectLog=False)))
        with pytest.raises(LookupError):
            run(gw.get_log("acct", "gw", skipped.log_id))
        quiet = run(gw.run(call(), GatewayOptions.parse({"id": "quiet"})))
        assert run(gw.logs("acct", "quiet")) == []
        with pytest.raises(LookupError):
            run(gw.get_log("acct", "quiet", quiet.log_id))
        # the call's own collectLog wins over the gateway's setting
        kept = run(gw.run(call(), GatewayOptions.parse({"id": "quiet", "collectLog": True})))
        assert [r["id"] for r in run(gw.logs("acct", "quiet"))] == [kept.log_id]
    finally:
        close_gateways(gw)


def test_no_account_reads_or_patches_another_accounts_log_under_the_same_gateway_id(gw):
    mine = run(gw.run(call("a"), opts()))
    run(gw.run(call("b"), opts()))
    with pytest.raises(LookupError):
        run(gw.get_log("b", "gw", mine.log_id))
    with pytest.raises(LookupError):
        run(gw.patch_log("b", "gw", mine.log_id, {"score": 1}))
    assert [r["id"] for r in run(gw.logs("a", "gw"))] == [mine.log_id]
    assert mine.log_id not in [r["id"] for r in run(gw.logs("b", "gw"))]


def test_logs_are_listed_newest_first_up_to_the_limit(gw):
    ids = []
    for _ in range(4):
        gw.clock.now += 1
        ids.append(run(gw.run(call(), opts())).log_id)
    assert [r["id"] for r in run(gw.logs("acct", "gw", 3))] == ids[::-1][:3]


def test_a_gateways_rate_limit_answers_429_rate_limited_per_account(tmp_path):
    settings = {"shop": GatewaySettings(rate_limit=2, rate_limit_period_s=10)}
    gw = make_gateways(tmp_path, settings=settings)
    shop = GatewayOptions.parse({"id": "shop"})
    try:
        run(gw.run(call("a"), shop))
        gw.clock.now += 4
        run(gw.run(call("a"), shop))
        with pytest.raises(AIError) as limited:
            run(gw.run(call("a"), shop))
        assert limited.value.code == 2003 and limited.value.retry_after == 6
        assert str(limited.value).startswith("2003: Rate limited: gateway 'shop' takes 2 requests per 10 s")
        (row, *_) = run(gw.logs("a", "shop"))
        assert (row["status_code"], row["success"]) == (429, False)  # the refusal is logged
        assert gw.ai.calls == 2  # the refused call never reached the model
        run(gw.run(call("b"), shop))  # another account has its own window
        gw.clock.now += 6  # sliding: the first request left the window
        run(gw.run(call("a"), shop))
        for _ in range(4):  # a gateway not configured has no limit
            run(gw.run(call("a"), opts()))
    finally:
        close_gateways(gw)


def test_a_fixed_window_resets_when_the_period_turns(tmp_path):
    settings = {"shop": GatewaySettings(rate_limit=1, rate_limit_period_s=10, rate_limit_technique="fixed")}
    gw = make_gateways(tmp_path, settings=settings)
    shop = GatewayOptions.parse({"id": "shop"})
    try:
        gw.clock.now = 1000.0 + 8  # 8 s into a period
        run(gw.run(call(), shop))
        with pytest.raises(AIError) as limited:
            run(gw.run(call(), shop))
        assert limited.value.retry_after == 2
        gw.clock.now += 2  # a new period: a sliding window would still refuse
        run(gw.run(call(), shop))
    finally:
        close_gateways(gw)
