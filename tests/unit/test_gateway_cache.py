"""AI Gateway's cache (runtime.ai.gateway): a repeated call is answered from the cache without a
second generation, whole or streamed (a stream replayed as the same event stream); cacheKey,
skipCache and cacheTtl expiry (on the test's clock); errors and cut streams never cached; one
account never served another's entry, even under the same gateway id; what is stored is bounded."""

from __future__ import annotations

import pytest

from runtime.ai import gateway_store
from runtime.ai.gateway_store import GatewayStore
from tests.unit.gateway_fakes import (
    Clock,
    call,
    close_gateways,
    make_gateways,
    opts,
    run,
    streamed,
)
from workers import AIError


@pytest.fixture
def gw(tmp_path):
    gateways = make_gateways(tmp_path)
    yield gateways
    close_gateways(gateways)


def test_a_repeated_call_is_answered_from_the_cache_without_generating_again(gw):
    first = run(gw.run(call(), opts(cacheTtl=60)))
    again = run(gw.run(call(), opts(cacheTtl=60)))
    assert gw.ai.calls == 1
    assert (first.cache_status, again.cache_status) == ("MISS", "HIT")
    assert (
        again.answer.body
        == first.answer.body
        == {
            "response": "answer 1",
            "usage": {"prompt_tokens": 4, "completion_tokens": 1},
        }
    )
    assert ("cf-aig-cache-status", "HIT") in again.headers
    assert ("cf-aig-cache-status", "MISS") in first.headers
    assert again.log_id != first.log_id and ("cf-aig-log-id", again.log_id) in again.headers


def test_other_inputs_another_model_or_no_ttl_generate_again(gw):
    run(gw.run(call(), opts(cacheTtl=60)))
    assert run(gw.run(call(inputs={"prompt": "other"}), opts(cacheTtl=60))).cache_status == "MISS"
    assert run(gw.run(call(model="@edge/zai-org/glm-4.5-mini"), opts(cacheTtl=60))).cache_status == "MISS"
    assert run(gw.run(call(), opts())).cache_status is None  # no cacheTtl: not cacheable at all
    assert gw.ai.calls == 4
    # the same inputs in another key order are the same call (canonical JSON)
    run(gw.run(call(inputs={"prompt": "x", "max_tokens": 3}), opts(cacheTtl=60)))
    again = run(gw.run(call(inputs={"max_tokens": 3, "prompt": "x"}), opts(cacheTtl=60)))
    assert again.cache_status == "HIT" and gw.ai.calls == 5


def test_skip_cache_neither_reads_nor_writes_the_entry(gw):
    run(gw.run(call(), opts(cacheTtl=60)))
    fresh = run(gw.run(call(), opts(cacheTtl=60, skipCache=True)))
    assert fresh.cache_status == "MISS" and fresh.answer.body["response"] == "answer 2"
    # the entry is still the first answer: skipCache did not overwrite it
    assert run(gw.run(call(), opts(cacheTtl=60))).answer.body["response"] == "answer 1"
    assert gw.ai.calls == 2


def test_a_cache_key_names_the_entry_whatever_the_inputs(gw):
    run(gw.run(call(inputs={"prompt": "a"}), opts(cacheTtl=60, cacheKey="k")))
    hit = run(gw.run(call(inputs={"prompt": "b"}), opts(cacheTtl=60, cacheKey="k")))
    assert hit.cache_status == "HIT" and hit.answer.body["response"] == "answer 1" and gw.ai.calls == 1
    other = run(gw.run(call(inputs={"prompt": "a"}), opts(cacheTtl=60, cacheKey="k2")))
    assert other.cache_status == "MISS" and gw.ai.calls == 2


def test_a_cache_key_never_answers_a_stream_with_a_body_nor_one_door_with_the_others_shape(gw):
    run(gw.run(call(), opts(cacheTtl=60, cacheKey="k")))
    through, body = streamed(gw, cacheTtl=60, cacheKey="k")
    assert through.cache_status == "MISS" and body.startswith(b"data: ")
    openai = run(gw.run(call(), opts(cacheTtl=60, cacheKey="k"), shape="openai"))
    assert openai.cache_status == "MISS" and gw.ai.calls == 3


def test_an_entry_expires_after_its_ttl_on_the_gateways_clock(gw):
    run(gw.run(call(), opts(cacheTtl=10)))
    gw.clock.now += 9
    assert run(gw.run(call(), opts(cacheTtl=10))).cache_status == "HIT"
    gw.clock.now += 2
    assert run(gw.run(call(), opts(cacheTtl=10))).cache_status == "MISS" and gw.ai.calls == 2


def test_a_stream_is_replayed_as_the_same_event_stream_without_generating_again(gw):
    first, body = streamed(gw, cacheTtl=60)
    again, replayed = streamed(gw, cacheTtl=60)
    assert (first.cache_status, again.cache_status) == ("MISS", "HIT") and gw.ai.calls == 1
    assert replayed == body and body.startswith(b'data: {"response": "1.0"}') and body.endswith(b"[DONE]\n\n")
    assert ("cf-aig-cache-status", "HIT") in again.headers


def test_a_stream_that_failed_or_was_cut_is_not_cached(gw):
    gw.ai.fail_mid_stream = True
    _, body = streamed(gw, cacheTtl=60)
    assert b'"error"' in body
    gw.ai.fail_mid_stream = False
    assert streamed(gw, cacheTtl=60)[0].cache_status == "MISS" and gw.ai.calls == 2

    async def cut():  # the client reads one event and leaves
        through = await gw.run(call("b", {"prompt": "hi", "stream": True}), opts(cacheTtl=60))
        stream = through.answer.stream
        await anext(stream)
        await stream.aclose()

    run(cut())
    assert streamed(gw, "b", cacheTtl=60)[0].cache_status == "MISS" and gw.ai.calls == 4


def test_an_error_is_never_cached(gw):
    gw.ai.fail = [3040]
    with pytest.raises(AIError, match="^3040"):
        run(gw.run(call(), opts(cacheTtl=60)))
    assert run(gw.run(call(), opts(cacheTtl=60))).cache_status == "MISS" and gw.ai.calls == 2


def test_accounts_never_share_an_entry_under_the_same_gateway_id(gw):
    run(gw.run(call("a"), opts(cacheTtl=60)))
    theirs = run(gw.run(call("b"), opts(cacheTtl=60)))
    assert theirs.cache_status == "MISS" and gw.ai.calls == 2
    assert run(gw.run(call("b"), opts(cacheTtl=60, cacheKey="shared"))).cache_status == "MISS"
    assert run(gw.run(call("a"), opts(cacheTtl=60, cacheKey="shared"))).cache_status == "MISS"
    _, body = streamed(gw, "a", cacheTtl=60)
    assert streamed(gw, "b", cacheTtl=60)[0].cache_status == "MISS"


def test_a_configured_gateway_caches_by_default(tmp_path):
    from runtime.ai.gateway import GatewayOptions, GatewaySettings

    gw = make_gateways(tmp_path, settings={"shop": GatewaySettings(cache_ttl=30)})
    try:
        shop = {"id": "shop"}
        run(gw.run(call(), GatewayOptions.parse(shop)))
        assert run(gw.run(call(), GatewayOptions.parse(shop))).cache_status == "HIT" and gw.ai.calls == 1
        gw.clock.now += 31
        assert run(gw.run(call(), GatewayOptions.parse(shop))).cache_status == "MISS"
        # its default is the call's to override: cacheTtl 0 is not cached
        off = GatewayOptions.parse({**shop, "cacheTtl": 0})
        assert run(gw.run(call(), off)).cache_status is None
    finally:
        close_gateways(gw)


def test_the_store_is_bounded_per_entry_per_account_and_per_gateway(tmp_path, monkeypatch):
    monkeypatch.setattr(gateway_store, "ACCOUNT_CACHE_BYTES", 3000)
    monkeypatch.setattr(gateway_store, "ACCOUNT_LOG_ROWS", 5)
    monkeypatch.setattr(gateway_store, "LOG_ROWS", 3)
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
    for i in range(5):  # one gateway keeps its newest LOG_ROWS
        store.log("b", "one", {"id": f"b{i}"})
    assert [r["id"] for r in store.logs("b", "one")] == ["b4", "b3", "b2"]
    assert not store.cache("a", "g", "big", "json", b"z" * (gateway_store.CACHE_ENTRY_BYTES + 1), 60)
    store.close()


def test_a_stream_larger_than_an_entry_is_answered_but_not_cached(gw, monkeypatch):
    from runtime.ai import gateway

    monkeypatch.setattr(gateway, "CACHE_ENTRY_BYTES", 40)
    _, body = streamed(gw, cacheTtl=60)
    assert len(body) > 40 and body.endswith(b"[DONE]\n\n")
    assert streamed(gw, cacheTtl=60)[0].cache_status == "MISS" and gw.ai.calls == 2
