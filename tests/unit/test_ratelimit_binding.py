"""The Rate Limiting binding's store: fixed windows per (account, namespace, key), counters that
survive a reopen, bounded keys, and the config's checks."""

from __future__ import annotations

import msgspec
import pytest

from runtime.bindings import BindingStores, kinds, ratelimit
from runtime.bindings.common import BindingError
from runtime.bindings.ratelimit import RateLimitStore
from runtime.control.config import parse_config
from runtime.control.config_schema import ConfigError

TABLE = '[[ratelimits]]\nname = "{name}"\nnamespace_id = "1001"\nsimple = {simple}\n'
MINIMAL = 'name = "w"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n'


class Clock:
    def __init__(self, now: float = 1_000_020.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def limit(store, key="k", account="a", ident="1001/2/60"):
    return store.call(account, ident, "limit", [{"key": key}], {})["success"]


def test_a_key_gets_its_limit_per_window_and_the_next_window_starts_fresh(tmp_path):
    clock = Clock()
    store = RateLimitStore(tmp_path / "rl.sqlite", clock)
    assert [limit(store) for _ in range(4)] == [True, True, False, False]
    assert limit(store, key="other") is True  # keys count alone
    assert limit(store, account="b") is True  # so do accounts, with the same namespace id
    assert limit(store, ident="1002/2/60") is True  # and namespaces
    clock.now += 60
    assert [limit(store) for _ in range(3)] == [True, True, False]
    store.close()
    reopened = RateLimitStore(tmp_path / "rl.sqlite", clock)  # a restart: the count holds
    assert limit(reopened) is False
    reopened.close()


def test_hostile_calls_get_clear_errors_and_keys_are_bounded(tmp_path, monkeypatch):
    store_path = tmp_path / "rl.sqlite"
    store = RateLimitStore(store_path, Clock())
    for args, kwargs, words in [
        ([], {}, "must be a string"),
        ([{"key": 7}], {}, "must be a string"),
        ([{"key": "k" * 1025}], {}, "1024"),
        ([{"key": "k", "limit": 10**9}], {}, "unknown option"),  # the script cannot lift its limit
        (["k"], {}, "one options dict"),
    ]:
        with pytest.raises(BindingError, match=words):
            store.call("a", "1001/2/60", "limit", args, kwargs)
    with pytest.raises(BindingError, match="only limit"):
        store.call("a", "1001/2/60", "reset", [], {})
    monkeypatch.setattr(ratelimit, "MAX_KEYS", 3)
    for i in range(3):
        assert limit(store, key=f"k{i}") is True
    with pytest.raises(BindingError, match="3 keys at once"):
        limit(store, key="k3")
    assert limit(store, key="k0") is True  # a key it holds still counts
    assert limit(store, account="b", key="k3") is True  # another account is not affected
    store.clock.now += 70  # every window ended: the next sweep frees the account's keys
    assert limit(store, key="k3") is True
    store.close()
    reopened = RateLimitStore(store_path, store.clock)  # a restart counts what the file holds
    for i in range(4, 6):
        assert limit(reopened, key=f"k{i}") is True
    with pytest.raises(BindingError, match="3 keys at once"):
        limit(reopened, key="k6")
    reopened.close()


def test_the_config_reads_wranglers_ratelimits_and_refuses_bad_policies():
    config = parse_config(
        MINIMAL
        + '[[ratelimits]]\nname = "LIMITER"\nnamespace_id = "1001"\nsimple = { limit = 100, period = 60 }\n'
    )
    refs = kinds.binding_refs(config.bindings)
    assert refs["LIMITER"].kind == "ratelimit" and refs["LIMITER"].id == "1001/100/60"
    for simple, words in [
        ("{ limit = 100, period = 30 }", "10 or 60"),
        ("{ limit = 0, period = 10 }", "between 1"),
    ]:
        with pytest.raises(ConfigError, match=words):
            parse_config(MINIMAL + TABLE.format(name="L", simple=simple))
    with pytest.raises(ConfigError, match="ratelimits.0.name"):  # wrangler's key for the env name
        parse_config(
            MINIMAL + 'vars = { L = "x" }\n' + TABLE.format(name="L", simple="{ limit = 1, period = 10 }")
        )


def test_the_store_opens_through_the_binding_stores(tmp_path):
    import asyncio

    stores = BindingStores(tmp_path)
    try:
        ref = kinds.binding_refs(
            {
                "ratelimits": [
                    msgspec.convert(
                        {"name": "L", "namespace_id": "9", "simple": {"limit": 1, "period": 10}},
                        ratelimit.RateLimitConfig,
                    )
                ]
            }
        )["L"]
        first = asyncio.run(stores.call("acct", ref, "limit", [{"key": "x"}], {}))
        second = asyncio.run(stores.call("acct", ref, "limit", [{"key": "x"}], {}))
    finally:
        stores.close()
    assert (first, second) == ({"success": True}, {"success": False})
