"""AI Gateway, locally (runtime.ai.gateway), against a counting stand-in for the AI service: a
repeated call is served from the cache without generating again (whole, and a stream replayed byte
for byte), cacheKey / skipCache / cacheTtl expiry, accounts never sharing a hit or a log, retries
with backoff on what is worth retrying, requestTimeoutMs, the universal run's fallback, and logs
read back and patched."""

from __future__ import annotations

import asyncio

import pytest

from edge_sim.topology import Topology
from runtime.ai.gateway import GatewayOptions, Gateways, RetryOptions, _delay_ms
from runtime.ai.service import AICall, Answer
from runtime.control.fair_pool import FairPool
from workers import AIError

MODEL = "@edge/moonshotai/kimi-k2-mini"
POP = Topology.default().pop("ICN")


class CountingAI:
    """Answers every call with its running count, streams three events; `fail` codes first."""

    def __init__(self, fail: list[int] | None = None, delay: float = 0.0):
        self.calls = 0
        self.fail = list(fail or [])
        self.delay = delay

    async def answer(self, call: AICall) -> Answer:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise AIError(self.fail.pop(0), "scripted failure")
        if isinstance(call.inputs, dict) and call.inputs.get("stream"):
            n = self.calls

            async def events():
                for i in range(3):
                    yield f'data: {{"response": "{n}.{i}"}}\n\n'.encode()
                yield b"data: [DONE]\n\n"

            return Answer(stream=events())
        return Answer(body={"response": f"answer {self.calls}", "model": call.model})


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gateways(tmp_path):
    pool = FairPool(2, name="test-gateway")
    ai, clock = CountingAI(), Clock()
    gw = Gateways(ai, pool, tmp_path, clock=clock)
    gw.clock = clock
    yield gw
    gw.close()
    pool.close()


def call(account="acct", inputs=None, model=MODEL) -> AICall:
    return AICall(model, inputs or {"prompt": "hi"}, account, None, POP, 5.0)


def opts(**kw) -> GatewayOptions:
    return GatewayOptions.parse({"id": "gw", **kw})


def run(coro):
    return asyncio.run(coro)


async def streamed(answer) -> bytes:
    return b"".join([chunk async for chunk in answer.answer.stream])


def test_a_repeated_call_is_served_from_the_cache_without_generating_again(gateways):
    first = run(gateways.run(call(), opts(cacheTtl=60)))
    again = run(gateways.run(call(), opts(cacheTtl=60)))
    assert gateways.ai.calls == 1
    assert (first.cache_status, again.cache_status) == ("MISS", "HIT")
    assert again.answer.body == first.answer.body == {"response": "answer 1", "model": MODEL}
    assert ("cf-aig-cache-status", "HIT") in again.headers and again.log_id != first.log_id
    # other inputs, skipCache, no cacheTtl: generated again
    run(gateways.run(call(inputs={"prompt": "other"}), opts(cacheTtl=60)))
    assert run(gateways.run(call(), opts(cacheTtl=60, skipCache=True))).cache_status == "MISS"
    assert run(gateways.run(call(), opts())).cache_status is None
    assert gateways.ai.calls == 4
    # a cacheKey names the entry whatever the inputs
    run(gateways.run(call(inputs={"prompt": "a"}), opts(cacheTtl=60, cacheKey="k")))
    hit = run(gateways.run(call(inputs={"prompt": "b"}), opts(cacheTtl=60, cacheKey="k")))
    assert hit.cache_status == "HIT" and gateways.ai.calls == 5


def test_an_entry_expires_after_its_ttl(gateways):
    run(gateways.run(call(), opts(cacheTtl=10)))
    gateways.clock.now += 9
    assert run(gateways.run(call(), opts(cacheTtl=10))).cache_status == "HIT"
    gateways.clock.now += 2
    assert run(gateways.run(call(), opts(cacheTtl=10))).cache_status == "MISS" and gateways.ai.calls == 2


def test_a_stream_is_replayed_as_the_same_event_stream(gateways):
    ask = {"prompt": "hi", "stream": True}
    first = run(gateways.run(call(inputs=ask), opts(cacheTtl=60)))
    body = run(streamed(first))
    again = run(gateways.run(call(inputs=ask), opts(cacheTtl=60)))
    assert again.cache_status == "HIT" and gateways.ai.calls == 1
    assert run(streamed(again)) == body and body.endswith(b"data: [DONE]\n\n")


def test_accounts_never_share_a_hit_or_a_log(gateways):
    mine = run(gateways.run(call("a"), opts(cacheTtl=60)))
    theirs = run(gateways.run(call("b"), opts(cacheTtl=60)))
    assert theirs.cache_status == "MISS" and gateways.ai.calls == 2
    assert run(gateways.get_log("a", "gw", mine.log_id))["id"] == mine.log_id
    with pytest.raises(LookupError):
        run(gateways.get_log("b", "gw", mine.log_id))
    with pytest.raises(LookupError):
        run(gateways.patch_log("b", "gw", mine.log_id, {"score": 1}))


def test_retries_back_off_on_what_is_worth_retrying_and_not_on_bad_input(tmp_path):
    pool = FairPool(1, name="test-gateway")
    ai = CountingAI(fail=[3040, 3007])
    gw = Gateways(ai, pool, tmp_path)
    out = run(gw.run(call(), opts(retries={"maxAttempts": 3, "retryDelayMs": 1, "backoff": "exponential"})))
    assert out.answer.body["response"] == "answer 3" and ai.calls == 3
    ai.fail = [5004]
    with pytest.raises(AIError, match="^5004"):
        run(gw.run(call(), opts(retries={"maxAttempts": 3})))
    assert ai.calls == 4  # a bad input is not retried
    ai.fail = [3040, 3040]
    with pytest.raises(AIError, match="^3040"):
        run(gw.run(call(), opts(retries={"maxAttempts": 2})))
    retry = RetryOptions(max_attempts=4, retry_delay_ms=100, backoff="linear")
    assert [_delay_ms(retry, a) for a in (1, 2, 3)] == [100, 200, 300]
    retry = RetryOptions(max_attempts=4, retry_delay_ms=100, backoff="exponential")
    assert [_delay_ms(retry, a) for a in (1, 2, 3)] == [100, 200, 400]
    gw.close()
    pool.close()


def test_request_timeout_bounds_each_attempt(tmp_path):
    pool = FairPool(1, name="test-gateway")
    gw = Gateways(CountingAI(delay=1.0), pool, tmp_path)
    with pytest.raises(AIError, match="^3007: the gateway's requestTimeoutMs \\(20 ms\\)"):
        run(gw.run(call(), opts(requestTimeoutMs=20)))
    gw.close()
    pool.close()


def test_the_universal_run_answers_from_the_first_step_that_can(gateways):
    steps = [
        {"provider": "openai", "endpoint": "chat/completions", "headers": {}, "query": {}},
        {"provider": "workers-ai", "endpoint": "", "query": {}},
        {
            "provider": "workers-ai",
            "endpoint": MODEL,
            "headers": {"cf-aig-cache-ttl": "60"},
            "query": {"prompt": "x"},
        },
    ]
    out = run(gateways.universal(call(), "gw", steps))
    assert out.step == 2 and ("cf-aig-step", "2") in out.headers and out.answer.body["response"] == "answer 1"
    assert run(gateways.get_log("acct", "gw", out.log_id))["step"] == 2  # the log says which step answered
    assert run(gateways.universal(call(), "gw", steps)).cache_status == "HIT"  # the step's own cache header
    with pytest.raises(AIError) as failed:
        run(gateways.universal(call(), "gw", steps[:2]))
    assert "step 0: 3040: provider 'openai' cannot be reached" in str(failed.value) and "step 1:" in str(
        failed.value
    )


def test_logs_read_back_patch_as_cloudflare_takes_them_and_collect_log_false_skips(gateways):
    out = run(
        gateways.run(
            call(), opts(metadata={"user": "ada"}, eventId="e-1"), tags=("checkout",), request_id="r-1"
        )
    )
    row = run(gateways.get_log("acct", "gw", out.log_id))
    assert row["model"] == MODEL and row["success"] is True and row["tags"] == ["checkout"]
    assert row["metadata"] == {"user": "ada"} and row["event_id"] == "e-1" and row["request_id"] == "r-1"
    run(gateways.patch_log("acct", "gw", out.log_id, {"score": 90, "feedback": 1, "metadata": {"k": "v"}}))
    row = run(gateways.get_log("acct", "gw", out.log_id))
    assert (row["score"], row["feedback"], row["metadata"]) == (90, 1, {"k": "v"})
    for bad, fragment in (({"score": 101}, "score"), ({"feedback": 2}, "feedback"), ({"mood": 1}, "mood")):
        with pytest.raises(AIError, match=fragment):
            run(gateways.patch_log("acct", "gw", out.log_id, bad))
    skipped = run(gateways.run(call(), opts(collectLog=False)))
    with pytest.raises(LookupError):
        run(gateways.get_log("acct", "gw", skipped.log_id))
    assert [r["id"] for r in run(gateways.logs("acct", "gw"))] == [out.log_id]


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"id": "bad id"}, "gateway.id: name the gateway"),
        ({"id": "gw", "cacheTTL": 5}, "gateway.cacheTTL: no such option"),
        ({"id": "gw", "cacheTtl": -1}, "gateway.cacheTtl: expected an integer"),
        ({"id": "gw", "retries": {"maxAttempts": 9}}, "gateway.retries.maxAttempts"),
        ({"id": "gw", "retries": {"backoff": "random"}}, "gateway.retries.backoff"),
        ({"id": "gw", "skipCache": "yes"}, "gateway.skipCache: expected true or false"),
    ],
)
def test_gateway_options_are_checked_naming_the_key(options, fragment):
    with pytest.raises(AIError, match=f"^5004: env.AI.run options: {fragment}"):
        GatewayOptions.parse(options)


def test_a_configured_gateway_caches_by_default_and_rate_limits_each_account(tmp_path):
    from runtime.ai.gateway import GatewaySettings

    pool, clock = FairPool(1, name="test-gateway"), Clock()
    ai = CountingAI()
    settings = {
        "shop": GatewaySettings(cache_ttl=30, collect_logs=False, rate_limit=2, rate_limit_period_s=10)
    }
    gw = Gateways(ai, pool, tmp_path, clock=clock, settings=settings)
    shop = GatewayOptions.parse({"id": "shop"})
    first = run(gw.run(call("a"), shop))
    assert run(gw.run(call("a"), shop)).cache_status == "HIT" and ai.calls == 1  # its cache_ttl
    with pytest.raises(LookupError):
        run(gw.get_log("a", "shop", first.log_id))  # collect_logs = false
    with pytest.raises(AIError) as limited:
        run(gw.run(call("a"), shop))
    assert limited.value.code == 2003 and limited.value.retry_after == 10
    assert "Rate limited: gateway 'shop' takes 2 requests per 10 s" in str(limited.value)
    assert run(gw.run(call("b"), shop)).cache_status == "MISS"  # another account has its own window
    clock.now += 10
    assert run(gw.run(call("a"), shop)).cache_status == "HIT"  # the window moved on; the entry is fresh
    clock.now += 30
    assert run(gw.run(call("a"), shop)).cache_status == "MISS"  # and now it expired
    other = GatewayOptions.parse({"id": "other"})  # not configured: no cache unless asked, no limit
    for _ in range(4):
        assert run(gw.run(call("a"), other)).cache_status is None
    gw.close()
    pool.close()


def test_an_account_cannot_fill_the_disk_through_gateways_it_makes(tmp_path, monkeypatch):
    from runtime.ai import gateway_store
    from runtime.ai.gateway_store import GatewayStore

    monkeypatch.setattr(gateway_store, "ACCOUNT_CACHE_BYTES", 3000)
    monkeypatch.setattr(gateway_store, "ACCOUNT_LOG_ROWS", 5)
    clock = Clock()
    store = GatewayStore(tmp_path / "gw.db", clock)
    for i in range(10):  # ten gateways of its own, 1000 bytes each
        clock.now += 1
        assert store.cache("a", f"g{i}", "k", "json", b"x" * 1000, 60 + i)
        store.log("a", f"g{i}", {"id": f"log{i}"})
    assert store.cache("b", "g0", "k", "json", b"y" * 1000, 60)  # another account is untouched
    kept = [i for i in range(10) if store.cached("a", f"g{i}", "k") is not None]
    assert kept == [7, 8, 9]  # the latest to expire, within 3000 bytes
    assert store.cached("b", "g0", "k") == ("json", b"y" * 1000)
    assert [i for i in range(10) if store.get_log("a", f"g{i}", f"log{i}")] == [5, 6, 7, 8, 9]
    assert not store.cache("a", "g", "big", "json", b"z" * (gateway_store.CACHE_ENTRY_BYTES + 1), 60)
    store.close()
